package supervisor

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ephemeral-ai-lab/sandbox/layers"
)

func TestViewLeaseIndex(t *testing.T) {
	order := []string{"L000003-cccccccc", "L000002-bbbbbbbb", "B000001-base"}
	leases := []leaseView{
		{Owner: "workspace-session:ws-a", Layers: []string{"L000003-cccccccc", "L000002-bbbbbbbb", "B000001-base"}},
		{Owner: "workspace-session:ws-b", Layers: []string{"L000002-bbbbbbbb", "B000001-base"}},
		{Owner: "export", Layers: []string{"L000003-cccccccc", "L000002-bbbbbbbb", "B000001-base"}},
		{Owner: "workspace-session:ws-d", Layers: []string{"B000001-base"}},
		{Owner: "workspace-session:ws-c", Layers: []string{"B000001-base"}},
		{Owner: "workspace-session:ws-empty", Layers: nil},
	}
	leased, booked := leaseIndex(order, leases)
	wantLeased := map[string][]string{
		"L000003-cccccccc": {"ws-a"}, // the export lease is not a workspace
		"L000002-bbbbbbbb": {"ws-b"},
		"B000001-base":     {"ws-c", "ws-d"},
	}
	if !reflect.DeepEqual(leased, wantLeased) {
		t.Errorf("leased_by_workspaces = %v, want %v", leased, wantLeased)
	}
	wantBooked := map[string][]string{
		"L000002-bbbbbbbb": {"L000003-cccccccc"},                     // deduplicated over ws-a and export
		"B000001-base":     {"L000003-cccccccc", "L000002-bbbbbbbb"}, // newest first
	}
	if !reflect.DeepEqual(booked, wantBooked) {
		t.Errorf("booked_by = %v, want %v", booked, wantBooked)
	}

	// After a squash the head no longer holds the leased L layers; they rank
	// after the head (the order summarizeStack builds) and still book the base.
	order = []string{"S000004-dddddddd", "B000001-base", "L000003-cccccccc", "L000002-bbbbbbbb"}
	leases = []leaseView{
		{Owner: "workspace-session:ws-a", Layers: []string{"L000003-cccccccc", "L000002-bbbbbbbb", "B000001-base"}},
		{Owner: "workspace-session:ws-new", Layers: []string{"S000004-dddddddd", "B000001-base"}},
	}
	leased, booked = leaseIndex(order, leases)
	if got := booked["B000001-base"]; !reflect.DeepEqual(got, []string{"S000004-dddddddd", "L000003-cccccccc"}) {
		t.Errorf("booked_by of the base after squash = %v", got)
	}
	if got := booked["L000002-bbbbbbbb"]; !reflect.DeepEqual(got, []string{"L000003-cccccccc"}) {
		t.Errorf("booked_by of a retained layer = %v", got)
	}
	if len(booked["S000004-dddddddd"]) != 0 || !reflect.DeepEqual(leased["S000004-dddddddd"], []string{"ws-new"}) {
		t.Errorf("squashed head layer: leased %v booked %v", leased["S000004-dddddddd"], booked["S000004-dddddddd"])
	}
}

func writeTree(t *testing.T, root string, files map[string]string) {
	t.Helper()
	for p, c := range files {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestViewBoundedWalk(t *testing.T) {
	root := t.TempDir()
	files := map[string]string{}
	for i := range 10 {
		files[fmt.Sprintf("d/f%02d", i)] = strings.Repeat("x", 100)
	}
	writeTree(t, root, files)
	w, err := boundedWalk(root, 1024, 64)
	if err != nil || w.Logical != 1000 || w.Truncated || w.Nodes != 11 || w.Allocated <= 0 {
		t.Fatalf("full walk: %+v %v", w, err)
	}
	w, _ = boundedWalk(root, 5, 64)
	if !w.Truncated || w.Nodes != 5 || w.Logical >= 1000 {
		t.Fatalf("node bound: %+v", w)
	}
	deep := t.TempDir()
	writeTree(t, deep, map[string]string{"a/b/c/d/e/f.txt": "12345", "top.txt": "abc"})
	w, _ = boundedWalk(deep, 1024, 2)
	if !w.Truncated || w.Logical != 3 {
		t.Fatalf("depth bound: %+v", w)
	}
	w, _ = boundedWalk(deep, 1024, 64)
	if w.Truncated || w.Logical != 8 {
		t.Fatalf("deep full walk: %+v", w)
	}
	if _, err := boundedWalk(filepath.Join(deep, "missing"), 10, 10); err == nil {
		t.Fatal("missing root: no error")
	}
}

func TestViewLayerEntries(t *testing.T) {
	root := t.TempDir()
	writeTree(t, root, map[string]string{"src/a.go": "package a\n", "opq/keep.txt": "k", "z.txt": "z"})
	if err := os.Symlink("src/a.go", filepath.Join(root, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "src", ".wh.old.go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "opq", ".wh..wh..opq"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	want := []layerEntry{{"link", "symlink"}, {"opq", "opaque_dir"}, {"opq/keep.txt", "write"},
		{"src", "directory"}, {"src/a.go", "write"}, {"src/old.go", "delete"}, {"z.txt", "write"}}
	// A character device 0:0 is the kernel's whiteout; unprivileged mknod needs Linux ≥ 5.8.
	if unix.Mknod(filepath.Join(root, "gone"), unix.S_IFCHR|0o600, 0) == nil {
		want = append([]layerEntry{{"gone", "delete"}}, want...)
	}
	got, truncated, err := layerEntries(root, 100, 64)
	if err != nil || truncated || !reflect.DeepEqual(got, want) {
		t.Fatalf("entries = %v truncated=%v err=%v\nwant %v", got, truncated, err, want)
	}
	got, truncated, _ = layerEntries(root, 3, 64)
	if !truncated || len(got) != 3 {
		t.Fatalf("limit 3: %v truncated=%v", got, truncated)
	}
	if _, _, err := layerEntries(filepath.Join(root, "missing"), 10, 10); err == nil {
		t.Fatal("missing layer: no error")
	}
}

func TestViewSummarizeStack(t *testing.T) {
	ws := t.TempDir()
	writeTree(t, ws, map[string]string{"a.txt": "hello\n", "b/c.txt": "world\n"})
	st, _, err := layers.Create(context.Background(), filepath.Join(t.TempDir(), "layerstack"), ws, layers.SnapshotOptions{})
	if err != nil {
		t.Fatal(err)
	}
	a, _ := st.Acquire("workspace-session:ws-a")
	b, _ := st.Acquire("workspace-session:ws-b")
	defer a.Release()
	defer b.Release()
	sum, err := summarizeStack(st, 1024, 64)
	if err != nil {
		t.Fatal(err)
	}
	if len(sum.Layers) != 1 || sum.Layers[0].LayerID != layers.BaseLayerID || sum.Layers[0].Bytes != 12 || sum.Layers[0].Estimated {
		t.Fatalf("layers: %+v", sum.Layers)
	}
	if !reflect.DeepEqual(sum.Layers[0].LeasedBy, []string{"ws-a", "ws-b"}) || len(sum.Layers[0].BookedBy) != 0 {
		t.Fatalf("lease columns: %+v", sum.Layers[0])
	}
	if len(sum.Leases) != 2 || sum.TotalBytes != 12 || sum.StorageLogical < 12 || sum.StagingEntries != 0 {
		t.Fatalf("summary: %+v", sum)
	}
	sum, _ = summarizeStack(st, 1, 64)
	if !sum.Estimated || !sum.Layers[0].Estimated {
		t.Fatalf("a walk cut by the node bound is not marked estimated: %+v", sum.Layers[0])
	}
}

func TestViewParseStat(t *testing.T) {
	var p procStat
	line := "4242 (a (b) c) S 7 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 3 0 123456 1000 200 18446744073709551615\n"
	if err := parseStat([]byte(line), &p); err != nil {
		t.Fatal(err)
	}
	if p.pid != 4242 || p.name != "a (b) c" || p.state != "sleeping" || p.ppid != 7 || p.utime != 250 || p.stime != 50 ||
		p.startTicks != 123456 || p.cpuTimeUs() != 3_000_000 {
		t.Fatalf("parsed %+v", p)
	}
	parseStatus([]byte("Name:\tx\nVmRSS:\t  2048 kB\nThreads:\t5\nNSpid:\t4242\t17\n"), &p)
	if p.vmRSS != 2<<20 || p.threads != 5 || p.nsPid != 17 {
		t.Fatalf("status %+v", p)
	}
	if err := parseStat([]byte("garbage"), &p); err == nil {
		t.Fatal("garbage parsed")
	}
}

// fakeHolder is a holder whose PID is given; only Pid is used by the views.
type fakeHolder struct {
	holder
	pid int
}

func (f fakeHolder) Pid() int { return f.pid }

func TestViewTopologyScan(t *testing.T) {
	// This process as a "holder": every process of ours sharing its PID and
	// mount namespaces is a member, bounded at 512 rows.
	self := &session{rec: sessionRecord{WorkspaceSessionID: "ws-self"}, holder: fakeHolder{pid: os.Getpid()}}
	none := &session{rec: sessionRecord{WorkspaceSessionID: "ws-none"}}
	topo := buildTopology("/proc", []*session{self, none})
	if topo["available"] != true || topo["source"] != "proc_namespaces" || topo["schema_version"] != 2 {
		t.Fatalf("topology header: %v", topo)
	}
	wss := topo["workspaces"].([]*topoWorkspace)
	if len(wss) != 2 || wss[0].WorkspaceID != "ws-none" || wss[1].WorkspaceID != "ws-self" {
		t.Fatalf("workspaces not sorted: %v", wss)
	}
	if wss[0].State != "partial" || len(wss[0].Processes) != 0 {
		t.Fatalf("holderless workspace: %+v", wss[0])
	}
	w := wss[1]
	if len(w.Processes) == 0 || len(w.Processes) > topologyMaxRows {
		t.Fatalf("rows: %d", len(w.Processes))
	}
	found := false
	for i, p := range w.Processes {
		if i > 0 && w.Processes[i-1].Pid >= p.Pid {
			t.Fatalf("rows not sorted by pid")
		}
		if p.Pid == os.Getpid() {
			found = true
			if p.Kind != "namespace_init" || p.Resident == nil || *p.Resident <= 0 || p.StartTicks == nil || p.NsPid == nil {
				t.Fatalf("holder row: %+v", p)
			}
		} else if p.Kind != "process" {
			t.Fatalf("member row: %+v", p)
		}
	}
	if !found {
		t.Fatal("the holder itself is not listed")
	}
	if len(topo["warnings"].([]string)) > topologyMaxWarnings {
		t.Fatal("too many warnings")
	}
}

func TestViewBoundedError(t *testing.T) {
	long := strings.Repeat("é", 5000)
	got := boundedError(long)
	if len(got) > nodeErrorMax || !strings.HasPrefix(long, got) || !strings.HasSuffix(got, "é") {
		t.Fatalf("bounded error: %d bytes", len(got))
	}
}
