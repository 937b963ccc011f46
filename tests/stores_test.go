package tests

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestEventStoreHoldsCapsUnder10000Requests drives 10,000 traced requests
// through a supervisor whose event store is capped at 1 MiB: both segments
// stay within half the cap, the oldest traces rotate out, the newest stay
// queryable and nothing is counted as dropped.
func TestEventStoreHoldsCapsUnder10000Requests(t *testing.T) {
	e := newEnv(t)
	e.startWithConfig("observability:\n  max_disk_bytes: 1048576\n  resource_stats:\n    enabled: false\n")
	id := e.createSandbox(e.project(map[string]string{"a.txt": "a\n"}))
	dir := filepath.Join(e.data(), "sandboxes", id, "observability")
	const n = 10000
	half := int64(1048576 / 2)
	request := func(i int) error {
		line := fmt.Sprintf(`{"op":"list_commands","scope":{"kind":"sandbox","sandbox_id":%q},"request_id":"req-cap-%05d","args":{}}`+"\n", id, i)
		c, err := net.Dial("unix", e.socket())
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(60 * time.Second))
		if _, err := c.Write([]byte(line)); err != nil {
			return err
		}
		resp, err := bufio.NewReader(c).ReadString('\n')
		if err != nil || !strings.HasPrefix(resp, `{"commands"`) {
			return fmt.Errorf("request %d: %q %v", i, resp, err)
		}
		return nil
	}
	checkSizes := func(done int) error {
		var sizes [2]int64
		for j, name := range []string{"observability.ndjson", "observability.ndjson.1"} {
			if fi, err := os.Stat(filepath.Join(dir, name)); err == nil {
				sizes[j] = fi.Size()
			}
		}
		if sizes[0] > half || sizes[1] > half {
			return fmt.Errorf("after about %d requests: segments %v exceed %d each", done, sizes, half)
		}
		return nil
	}
	// Four clients at once (the store serializes appends), then the last
	// request alone so it is the newest trace.
	const workers = 4
	errs := make(chan error, workers)
	for w := range workers {
		go func() {
			for i := w; i < n-1; i += workers {
				if err := request(i); err != nil {
					errs <- err
					return
				}
				if w == 0 && i%1000 == 0 {
					if err := checkSizes(i); err != nil {
						errs <- err
						return
					}
				}
			}
			errs <- nil
		}()
	}
	for range workers {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if err := request(n - 1); err != nil {
		t.Fatal(err)
	}
	if err := checkSizes(n); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "observability.ndjson.1")); err != nil {
		t.Fatalf("no rotation after %d requests: %v", n, err)
	}
	if tr := e.obsOK("trace", id, nil); tr["trace"] != fmt.Sprintf("req-cap-%05d", n-1) {
		t.Fatalf("last trace: %v", tr["trace"])
	}
	if m := e.obs("trace", id, map[string]any{"trace_id": "req-cap-00000"}); errKind(m) != "not_found" {
		t.Fatalf("the oldest trace was not rotated out: %v", m)
	}
	if tr := e.obsOK("trace", id, map[string]any{"trace_id": fmt.Sprintf("req-cap-%05d", n-2)}); len(objs(tr["spans"])) != 1 {
		t.Fatalf("a recent trace: %v", tr)
	}
	es := e.obsOK("health", "", nil)["event_store"].(map[string]any)
	if es["dropped_storage"] != float64(0) || es["dropped_oversized"] != float64(0) || es["truncated_records"] != float64(0) {
		t.Fatalf("event_store counters: %v", es)
	}
}
