package views

import (
	"os"
	"testing"
)

func TestViewTopologyScan(t *testing.T) {
	// This process as a "holder": every process of ours sharing its PID and
	// mount namespaces is a member, bounded at 512 rows.
	self := Session{ID: "ws-self", HolderPid: os.Getpid()}
	none := Session{ID: "ws-none"}
	topo := BuildTopology("/proc", []Session{self, none})
	if topo["available"] != true || topo["source"] != "proc_namespaces" || topo["schema_version"] != 2 {
		t.Fatalf("topology header: %v", topo)
	}
	wss := topo["workspaces"].([]*TopoWorkspace)
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
