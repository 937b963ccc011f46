package tests

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
	for i := range n {
		line := fmt.Sprintf(`{"op":"list_commands","scope":{"kind":"sandbox","sandbox_id":%q},"request_id":"req-cap-%05d","args":{}}`+"\n", id, i)
		resp := e.raw([]byte(line))
		if len(resp) != 1 || !strings.HasPrefix(resp[0], `{"commands"`) && strings.Contains(resp[0], `"error"`) {
			t.Fatalf("request %d: %q", i, resp)
		}
		if i%1000 == 999 {
			var sizes [2]int64
			for j, name := range []string{"observability.ndjson", "observability.ndjson.1"} {
				if fi, err := os.Stat(filepath.Join(dir, name)); err == nil {
					sizes[j] = fi.Size()
				}
			}
			if sizes[0] > half || sizes[1] > half {
				t.Fatalf("after %d requests: segments %v exceed %d each", i+1, sizes, half)
			}
		}
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
