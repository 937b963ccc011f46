package views

import (
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"

	"github.com/ephemeral-ai-lab/sandbox/supervisor/obs"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/resources"
)

const (
	// topologyMaxRows bounds the process rows of one topology answer.
	topologyMaxRows = 512
	// topologyMaxWarnings bounds topology.warnings.
	topologyMaxWarnings = 16
)

// TopoProcess is one process row of a topology workspace.
type TopoProcess struct {
	Pid        int      `json:"pid"`
	NsPid      *int     `json:"namespace_pid"`
	ParentPid  int      `json:"parent_pid"`
	Name       string   `json:"name"`
	State      string   `json:"state"`
	Kind       string   `json:"kind"`
	Cgroups    []string `json:"cgroup_memberships"`
	Resident   *int64   `json:"resident_memory_bytes,omitempty"`
	CPUTimeUs  *uint64  `json:"cpu_time_us,omitempty"`
	StartTicks *uint64  `json:"start_time_ticks,omitempty"`
}

// TopoWorkspace is one session of the topology view and its processes.
type TopoWorkspace struct {
	WorkspaceID string          `json:"workspace_id"`
	State       string          `json:"state"`
	HolderPid   *int            `json:"holder_pid"`
	PidNS       *resources.NSID `json:"pid_namespace"`
	MountNS     *resources.NSID `json:"mount_namespace"`
	Processes   []TopoProcess   `json:"processes"`
	errs        int
}

// Topology is the topology view of one sandbox's sessions.
func Topology(procRoot string, sessions []Session) map[string]any {
	return map[string]any{"view": "topology", "scope": "sandbox", "topology": BuildTopology(procRoot, sessions)}
}

// BuildTopology does one scan of procRoot and groups the processes that
// share a holder's PID and mount namespaces under that holder's session.
func BuildTopology(procRoot string, sessions []Session) map[string]any {
	warnings := []string{}
	warn := func(format string, a ...any) {
		if len(warnings) < topologyMaxWarnings {
			warnings = append(warnings, fmt.Sprintf(format, a...))
		}
	}
	type nsKey struct{ pid, mnt resources.NSID }
	wss := make([]*TopoWorkspace, 0, len(sessions))
	byNS := map[nsKey]*TopoWorkspace{}
	pidNS := map[resources.NSID]bool{}
	for _, ss := range sessions {
		w := &TopoWorkspace{WorkspaceID: ss.ID, Processes: []TopoProcess{}}
		wss = append(wss, w)
		pid := ss.HolderPid
		if pid <= 0 {
			w.errs++
			warn("workspace %s has no live holder", w.WorkspaceID)
			continue
		}
		w.HolderPid = &pid
		dir := procRoot + "/" + strconv.Itoa(pid)
		pn, err1 := resources.StatNS(dir, "pid")
		mn, err2 := resources.StatNS(dir, "mnt")
		if err := errors.Join(err1, err2); err != nil {
			w.errs++
			warn("workspace %s: holder %d namespaces unreadable: %v", w.WorkspaceID, pid, err)
			continue
		}
		w.PidNS, w.MountNS = &pn, &mn
		byNS[nsKey{pn, mn}] = w
		pidNS[pn] = true
	}
	out := map[string]any{"schema_version": 2, "available": true, "source": "proc_namespaces", "error": nil,
		"truncated": false, "warnings": warnings}
	rows, truncated := 0, false
	if len(byNS) > 0 {
		d, err := os.Open(procRoot)
		if err != nil {
			out["available"], out["error"] = false, obs.BoundedError(err.Error())
		} else {
		scan:
			for {
				names, rerr := d.Readdirnames(512)
				for _, name := range names {
					pid, err := strconv.Atoi(name)
					if err != nil || pid <= 0 {
						continue
					}
					dir := procRoot + "/" + name
					pn, err := resources.StatNS(dir, "pid")
					if err != nil || !pidNS[pn] {
						continue // gone, another user's, or not a session's
					}
					mn, err := resources.StatNS(dir, "mnt")
					if err != nil {
						continue
					}
					w := byNS[nsKey{pn, mn}]
					if w == nil {
						continue
					}
					if rows == topologyMaxRows {
						truncated = true
						break scan
					}
					p, err := resources.ReadProc(dir)
					if err != nil {
						continue // exited meanwhile
					}
					row := TopoProcess{Pid: pid, ParentPid: p.PPid, Name: p.Name, State: p.State, Kind: "process",
						Cgroups: resources.CgroupLines(dir)}
					if p.NSPid > 0 {
						row.NsPid = &p.NSPid
					}
					if w.HolderPid != nil && *w.HolderPid == pid {
						row.Kind = "namespace_init"
					}
					rss, cpu, st := p.VMRSS, p.CPUTimeUs(), p.StartTicks
					row.Resident, row.CPUTimeUs, row.StartTicks = &rss, &cpu, &st
					w.Processes = append(w.Processes, row)
					rows++
				}
				if rerr != nil {
					break
				}
			}
			d.Close()
		}
	}
	if truncated {
		warn("process rows truncated at %d", topologyMaxRows)
		out["truncated"] = true
	}
	for _, w := range wss {
		sort.Slice(w.Processes, func(i, j int) bool { return w.Processes[i].Pid < w.Processes[j].Pid })
		switch {
		case w.errs > 0 || (truncated && len(w.Processes) == 0 && w.HolderPid != nil):
			w.State = "partial"
		case len(w.Processes) > 1:
			w.State = "active"
		case len(w.Processes) == 1:
			w.State = "idle"
		default:
			w.State = "partial" // the holder was not seen in the scan
		}
	}
	sort.Slice(wss, func(i, j int) bool { return wss[i].WorkspaceID < wss[j].WorkspaceID })
	out["warnings"] = warnings
	out["workspaces"] = wss
	return out
}
