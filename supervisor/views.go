package supervisor

// Read-only observability views (§3.7, §10.3): snapshot, daemon, topology
// and layerstack. None of them appends to a store, samples on demand or
// keeps history in memory; every walk of the file system or of /proc is
// bounded.

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
	"github.com/ephemeral-ai-lab/sandbox/layers"
)

const (
	// clockTicks is USER_HZ, the unit of /proc/<pid>/stat times. It is 100 on
	// every architecture Linux supports for user space (sysconf needs cgo).
	clockTicks = 100
	// topologyMaxRows bounds the process rows of one topology answer.
	topologyMaxRows = 512
	// topologyMaxWarnings bounds topology.warnings.
	topologyMaxWarnings = 16
	// nodeErrorMax bounds the error string of an unavailable snapshot node.
	nodeErrorMax = 4 << 10

	wsOwnerPrefix = "workspace-session:"
	whPrefixName  = ".wh."
	opaqueName    = ".wh..wh..opq"
)

// ---------------------------------------------------------------- /proc

// procStat is what the views read of one process.
type procStat struct {
	pid, ppid      int
	name, state    string
	utime, stime   uint64 // clock ticks
	startTicks     uint64 // since boot
	threads        int
	vmRSS, vmSize  int64 // bytes
	vmHWM, rssAnon int64
	nsPid          int // the PID in its innermost namespace (0 when unknown)
}

func (p procStat) cpuTimeUs() uint64 { return (p.utime + p.stime) * (1_000_000 / clockTicks) }

var procStates = map[byte]string{
	'R': "running", 'S': "sleeping", 'D': "disk_sleep", 'Z': "zombie", 'T': "stopped",
	't': "tracing_stop", 'X': "dead", 'x': "dead", 'K': "wakekill", 'W': "waking", 'P': "parked", 'I': "idle",
}

// readProc reads /proc/<pid>/stat and /proc/<pid>/status (never cmdline or
// environ). dir is "/proc/<pid>" or "/proc/self".
func readProc(dir string) (procStat, error) {
	var p procStat
	buf, err := readSmall(filepath.Join(dir, "stat"), 4096)
	if err != nil {
		return p, err
	}
	if err := parseStat(buf, &p); err != nil {
		return p, fmt.Errorf("%s/stat: %w", dir, err)
	}
	buf, err = readSmall(filepath.Join(dir, "status"), 16384)
	if err != nil {
		return p, err
	}
	parseStatus(buf, &p)
	return p, nil
}

// readSmall reads at most max bytes of a small (proc) file.
func readSmall(name string, max int) ([]byte, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	buf := make([]byte, max)
	n, err := io.ReadFull(f, buf)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		return nil, err
	}
	return buf[:n], nil
}

// parseStat parses /proc/<pid>/stat: "pid (comm) state ppid …"; comm may
// contain spaces and parentheses, so it ends at the last ')'.
func parseStat(b []byte, p *procStat) error {
	s := string(b)
	open, closing := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || closing < open {
		return errors.New("malformed")
	}
	pid, err := strconv.Atoi(strings.TrimSpace(s[:open]))
	if err != nil {
		return errors.New("malformed pid")
	}
	p.pid, p.name = pid, s[open+1:closing]
	f := strings.Fields(s[closing+1:])
	// f[0] is field 3 (state); field n is f[n-3].
	if len(f) < 20 {
		return errors.New("short")
	}
	if len(f[0]) > 0 {
		if st, ok := procStates[f[0][0]]; ok {
			p.state = st
		} else {
			p.state = f[0]
		}
	}
	p.ppid, _ = strconv.Atoi(f[1])
	p.utime, _ = strconv.ParseUint(f[14-3], 10, 64)
	p.stime, _ = strconv.ParseUint(f[15-3], 10, 64)
	p.threads, _ = strconv.Atoi(f[20-3])
	p.startTicks, _ = strconv.ParseUint(f[22-3], 10, 64)
	return nil
}

func parseStatus(b []byte, p *procStat) {
	kb := func(v string) int64 {
		n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		return n * 1024
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		switch k {
		case "VmRSS":
			p.vmRSS = kb(v)
		case "VmSize":
			p.vmSize = kb(v)
		case "VmHWM":
			p.vmHWM = kb(v)
		case "RssAnon":
			p.rssAnon = kb(v)
		case "Threads":
			p.threads, _ = strconv.Atoi(strings.TrimSpace(v))
		case "NSpid":
			if f := strings.Fields(v); len(f) > 0 {
				p.nsPid, _ = strconv.Atoi(f[len(f)-1])
			}
		}
	}
}

// nsID identifies a namespace: device and inode of /proc/<pid>/ns/<kind>.
type nsID struct {
	Device uint64 `json:"device"`
	Inode  uint64 `json:"inode"`
}

func statNS(pidDir, kind string) (nsID, error) {
	var st unix.Stat_t
	if err := unix.Stat(pidDir+"/ns/"+kind, &st); err != nil {
		return nsID{}, err
	}
	return nsID{Device: st.Dev, Inode: st.Ino}, nil
}

// cgroupLines returns the lines of /proc/<pid>/cgroup.
func cgroupLines(pidDir string) []string {
	out := []string{}
	b, err := readSmall(pidDir+"/cgroup", 8192)
	if err != nil {
		return out
	}
	for l := range strings.SplitSeq(strings.TrimSpace(string(b)), "\n") {
		if l != "" {
			out = append(out, l)
		}
	}
	return out
}

// ------------------------------------------------------------- registry

// sandboxesSorted returns the registered sandboxes ordered by ID.
func (s *Supervisor) sandboxesSorted() []*sandbox {
	s.mu.Lock()
	all := make([]*sandbox, 0, s.sandboxes.Len())
	for _, sb := range s.sandboxes.All() {
		all = append(all, sb)
	}
	s.mu.Unlock()
	sort.Slice(all, func(i, j int) bool { return all[i].Rec.ID < all[j].Rec.ID })
	return all
}

// sessionsSorted returns the sandbox's live sessions ordered by ID.
func sessionsSorted(sb *sandbox) []*session {
	sb.Mu.Lock()
	all := make([]*session, 0, len(sb.Work.sessions))
	for _, ss := range sb.Work.sessions {
		all = append(all, ss)
	}
	sb.Mu.Unlock()
	sort.Slice(all, func(i, j int) bool { return all[i].rec.WorkspaceSessionID < all[j].rec.WorkspaceSessionID })
	return all
}

// holderPid is the session's live holder PID, 0 without a holder.
func (ss *session) holderPid() int {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.holder == nil {
		return 0
	}
	return ss.holder.Pid()
}

func (ss *session) record() sessionRecord {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.rec
}

// --------------------------------------------------------------- daemon

func (s *Supervisor) daemon(c *call) (any, error) {
	scope := "supervisor"
	sbs := s.sandboxesSorted()
	if c.sb != nil {
		scope, sbs = "sandbox", []*sandbox{c.sb}
	}
	d := map[string]any{"available": true, "error": nil, "sampled_at_unix_ms": time.Now().UnixMilli()}
	p, err := readProc("/proc/self")
	if err != nil {
		d["available"], d["error"] = false, boundedError(err.Error())
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	var uptime any = time.Since(s.started).Seconds()
	if up, ok := processUptime(p.startTicks); err == nil && ok {
		uptime = up
	}
	d["pid"] = os.Getpid()
	d["name"] = p.name
	d["state"] = p.state
	d["uptime_s"] = uptime
	d["resident_bytes"] = p.vmRSS
	d["virtual_bytes"] = p.vmSize
	d["peak_resident_bytes"] = p.vmHWM
	d["anonymous_bytes"] = p.rssAnon
	d["cpu_time_us"] = p.cpuTimeUs()
	d["thread_count"] = p.threads
	d["goroutines"] = runtime.NumGoroutine()
	d["file_descriptor_count"] = countFDs()
	d["go_heap_alloc_bytes"] = ms.HeapAlloc
	d["go_heap_sys_bytes"] = ms.HeapSys
	d["gc_cycles"] = ms.NumGC
	d["runtime_usage"] = map[string]any{
		"active_requests":  s.active.Load(),
		"active_commands":  s.runningCommands(),
		"live_sessions":    s.sessionCount(),
		"admission_in_use": len(s.conns), // connection slots of max_concurrent_connections in use
	}
	holders := []map[string]any{}
	for _, sb := range sbs {
		for _, ss := range sessionsSorted(sb) {
			pid := ss.holderPid()
			if pid <= 0 {
				continue
			}
			h := map[string]any{"sandbox_id": sb.Rec.ID, "workspace_session_id": ss.id(), "pid": pid,
				"state": "unavailable", "resident_bytes": nil, "cpu_time_us": nil}
			if hp, err := readProc("/proc/" + strconv.Itoa(pid)); err == nil {
				h["state"], h["resident_bytes"], h["cpu_time_us"] = hp.state, hp.vmRSS, hp.cpuTimeUs()
			}
			holders = append(holders, h)
		}
	}
	d["holders"] = holders
	return map[string]any{"view": "daemon", "scope": scope, "daemon": d}, nil
}

// processUptime converts a start time in ticks since boot to seconds of age.
func processUptime(startTicks uint64) (float64, bool) {
	b, err := readSmall("/proc/uptime", 128)
	if err != nil {
		return 0, false
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0, false
	}
	boot, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return 0, false
	}
	return max(0, boot-float64(startTicks)/clockTicks), true
}

// countFDs counts the supervisor's open descriptors (minus the one used to list them).
func countFDs() int {
	f, err := os.Open("/proc/self/fd")
	if err != nil {
		return -1
	}
	defer f.Close()
	n := 0
	for {
		names, err := f.Readdirnames(256)
		n += len(names)
		if err != nil {
			break
		}
	}
	return max(0, n-1)
}

// ------------------------------------------------------------- topology

type topoProcess struct {
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

type topoWorkspace struct {
	WorkspaceID string        `json:"workspace_id"`
	State       string        `json:"state"`
	HolderPid   *int          `json:"holder_pid"`
	PidNS       *nsID         `json:"pid_namespace"`
	MountNS     *nsID         `json:"mount_namespace"`
	Processes   []topoProcess `json:"processes"`
	errs        int
}

func (s *Supervisor) topology(c *call) (any, error) {
	return map[string]any{"view": "topology", "scope": "sandbox", "topology": buildTopology("/proc", sessionsSorted(c.sb))}, nil
}

// buildTopology does one scan of procRoot and groups the processes that
// share a holder's PID and mount namespaces under that holder's session.
func buildTopology(procRoot string, sessions []*session) map[string]any {
	warnings := []string{}
	warn := func(format string, a ...any) {
		if len(warnings) < topologyMaxWarnings {
			warnings = append(warnings, fmt.Sprintf(format, a...))
		}
	}
	type nsKey struct{ pid, mnt nsID }
	wss := make([]*topoWorkspace, 0, len(sessions))
	byNS := map[nsKey]*topoWorkspace{}
	pidNS := map[nsID]bool{}
	for _, ss := range sessions {
		w := &topoWorkspace{WorkspaceID: ss.id(), Processes: []topoProcess{}}
		wss = append(wss, w)
		pid := ss.holderPid()
		if pid <= 0 {
			w.errs++
			warn("workspace %s has no live holder", w.WorkspaceID)
			continue
		}
		w.HolderPid = &pid
		dir := procRoot + "/" + strconv.Itoa(pid)
		pn, err1 := statNS(dir, "pid")
		mn, err2 := statNS(dir, "mnt")
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
			out["available"], out["error"] = false, boundedError(err.Error())
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
					pn, err := statNS(dir, "pid")
					if err != nil || !pidNS[pn] {
						continue // gone, another user's, or not a session's
					}
					mn, err := statNS(dir, "mnt")
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
					p, err := readProc(dir)
					if err != nil {
						continue // exited meanwhile
					}
					row := topoProcess{Pid: pid, ParentPid: p.ppid, Name: p.name, State: p.state, Kind: "process",
						Cgroups: cgroupLines(dir)}
					if p.nsPid > 0 {
						row.NsPid = &p.nsPid
					}
					if w.HolderPid != nil && *w.HolderPid == pid {
						row.Kind = "namespace_init"
					}
					rss, cpu, st := p.vmRSS, p.cpuTimeUs(), p.startTicks
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

// ------------------------------------------------------------ file walks

// walkStats is the result of a bounded size walk.
type walkStats struct {
	Logical   int64 // sizes of regular files
	Allocated int64 // st_blocks*512 of every node
	Nodes     int
	Truncated bool // the node or depth bound cut the walk: sizes are lower bounds
}

// boundedWalk sums a tree visiting at most maxNodes nodes and descending at
// most maxDepth directory levels below root. It never follows symlinks: the
// tree may be a session's upper dir, so directories are opened beneath a
// layers.Root.
func boundedWalk(root string, maxNodes, maxDepth int) (walkStats, error) {
	var w walkStats
	var st unix.Stat_t
	if err := unix.Lstat(root, &st); err != nil {
		return w, &fs.PathError{Op: "lstat", Path: root, Err: err}
	}
	w.Allocated += st.Blocks * 512
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		if st.Mode&unix.S_IFMT == unix.S_IFREG {
			w.Logical += st.Size
		}
		return w, nil
	}
	r, err := layers.OpenRoot(root)
	if err != nil {
		w.Truncated = true
		return w, nil
	}
	defer r.Close()
	type item struct {
		rel   string
		depth int
	}
	stack := []item{{"", 0}}
	for len(stack) > 0 {
		it := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		d, err := r.OpenDir(it.rel)
		if err != nil {
			w.Truncated = true // unreadable directory: its content is not counted
			continue
		}
		names, err := d.Names()
		if err != nil {
			w.Truncated = true
		}
		for _, name := range names {
			if w.Nodes >= maxNodes {
				w.Truncated = true
				d.Close()
				return w, nil
			}
			w.Nodes++
			fi, err := d.Lstat(name)
			if err != nil {
				continue
			}
			st, ok := fi.Sys().(*unix.Stat_t)
			if !ok {
				continue
			}
			w.Allocated += st.Blocks * 512
			switch st.Mode & unix.S_IFMT {
			case unix.S_IFREG:
				w.Logical += st.Size
			case unix.S_IFDIR:
				if it.depth+1 >= maxDepth {
					w.Truncated = true
				} else {
					stack = append(stack, item{path.Join(it.rel, name), it.depth + 1})
				}
			}
		}
		d.Close()
	}
	return w, nil
}

// layerEntry is one change recorded in a layer directory.
type layerEntry struct {
	Path string `json:"path"`
	Kind string `json:"kind"`
}

// layerEntries lists the changes of one layer directory (kinds of §8.3),
// at most limit of them, sorted by path. Whiteouts in either encoding are
// "delete", OCI .wh.<name> names too; opaque directories are "opaque_dir".
func layerEntries(root string, limit, maxDepth int) (entries []layerEntry, truncated bool, err error) {
	entries = []layerEntry{}
	type item struct {
		path, rel string
		depth     int
	}
	stack := []item{{root, "", 0}}
	var st unix.Stat_t
	for len(stack) > 0 && !truncated {
		it := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		d, oerr := os.Open(it.path)
		if oerr != nil {
			if it.rel == "" {
				return nil, false, oerr
			}
			truncated = true
			continue
		}
		names, rerr := d.Readdirnames(-1)
		d.Close()
		if rerr != nil {
			truncated = true
		}
		sort.Strings(names)
		// Push subdirectories in reverse so they pop in name order.
		var subdirs []item
		for _, name := range names {
			rel := path.Join(it.rel, name)
			p := it.path + "/" + name
			if name == opaqueName {
				continue // the directory itself is reported as opaque_dir
			}
			if strings.HasPrefix(name, whPrefixName) {
				entries = append(entries, layerEntry{path.Join(it.rel, name[len(whPrefixName):]), "delete"})
			} else if unix.Lstat(p, &st) == nil {
				switch st.Mode & unix.S_IFMT {
				case unix.S_IFCHR:
					if st.Rdev == 0 {
						entries = append(entries, layerEntry{rel, "delete"})
					}
				case unix.S_IFREG:
					if st.Size == 0 && (hasXattr(p, "user.overlay.whiteout") || hasXattr(p, "trusted.overlay.whiteout")) {
						entries = append(entries, layerEntry{rel, "delete"})
					} else {
						entries = append(entries, layerEntry{rel, "write"})
					}
				case unix.S_IFLNK:
					entries = append(entries, layerEntry{rel, "symlink"})
				case unix.S_IFDIR:
					kind := "directory"
					if opaqueDir(p) {
						kind = "opaque_dir"
					}
					entries = append(entries, layerEntry{rel, kind})
					if it.depth+1 >= maxDepth {
						truncated = true
					} else {
						subdirs = append(subdirs, item{p, rel, it.depth + 1})
					}
				}
			}
			if len(entries) > limit {
				truncated = true
				break
			}
		}
		for i := len(subdirs) - 1; i >= 0; i-- {
			stack = append(stack, subdirs[i])
		}
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].Path < entries[j].Path })
	if len(entries) > limit {
		entries, truncated = entries[:limit], true
	}
	return entries, truncated, nil
}

func hasXattr(p, name string) bool {
	_, err := unix.Lgetxattr(p, name, nil)
	return err == nil || errors.Is(err, unix.ERANGE)
}

func opaqueDir(p string) bool {
	for _, name := range []string{"user.overlay.opaque", "trusted.overlay.opaque"} {
		var b [4]byte
		if n, err := unix.Lgetxattr(p, name, b[:]); err == nil && string(b[:n]) == "y" {
			return true
		}
	}
	var st unix.Stat_t
	return unix.Lstat(p+"/"+opaqueName, &st) == nil
}

// ------------------------------------------------------------ layerstack

// leaseView is what the layerstack computations need of one lease.
type leaseView struct {
	Owner  string
	Layers []string // newest first
}

// leaseIndex computes §8.5's per-layer lease columns: leasedBy[layer] are
// the workspace sessions whose lease's newest layer is layer; bookedBy[layer]
// are the newest layers of the leases that contain layer below their
// newest one (the leased layers above it that pin it). order ranks layer
// IDs newest first; booked_by lists follow it.
func leaseIndex(order []string, leases []leaseView) (leasedBy, bookedBy map[string][]string) {
	leasedBy, bookedBy = map[string][]string{}, map[string][]string{}
	rank := map[string]int{}
	for i, id := range order {
		rank[id] = i
	}
	seen := map[[2]string]bool{}
	for _, l := range leases {
		if len(l.Layers) == 0 {
			continue
		}
		tip := l.Layers[0]
		if ws, ok := strings.CutPrefix(l.Owner, wsOwnerPrefix); ok {
			leasedBy[tip] = append(leasedBy[tip], ws)
		}
		for _, below := range l.Layers[1:] {
			if below == tip || seen[[2]string{below, tip}] {
				continue
			}
			seen[[2]string{below, tip}] = true
			bookedBy[below] = append(bookedBy[below], tip)
		}
	}
	for _, ids := range leasedBy {
		sort.Strings(ids)
	}
	for _, ids := range bookedBy {
		sort.Slice(ids, func(i, j int) bool {
			ri, iok := rank[ids[i]]
			rj, jok := rank[ids[j]]
			switch {
			case iok && jok:
				return ri < rj
			case iok != jok:
				return iok
			}
			return ids[i] > ids[j]
		})
	}
	return leasedBy, bookedBy
}

func leaseViews(st *layers.Stack) []leaseView {
	ls := st.Leases()
	out := make([]leaseView, 0, len(ls))
	for _, l := range ls {
		out = append(out, leaseView{Owner: l.Owner(), Layers: l.Manifest().LayerIDs()})
	}
	return out
}

type layerRow struct {
	LayerID        string   `json:"layer_id"`
	Bytes          int64    `json:"bytes"`
	AllocatedBytes int64    `json:"allocated_bytes"`
	LeasedBy       []string `json:"leased_by_workspaces"`
	BookedBy       []string `json:"booked_by"`
	// Estimated: a bound of the size walk was hit, so the sizes are lower
	// bounds (bytes is exact when it comes from the .bytes sidecar).
	Estimated bool   `json:"estimated"`
	Source    string `json:"bytes_source"` // "sidecar" or "walk"
}

// stackSummary is the default layerstack view and snapshot's stack block.
type stackSummary struct {
	Manifest         layers.Manifest
	Leases           []leaseView
	Layers           []layerRow // head, newest first
	Retained         []layerRow // on disk and leased, not in head
	TotalBytes       int64
	TotalAllocated   int64
	StorageLogical   int64
	StorageAllocated int64
	StagingEntries   int
	Estimated        bool
}

func (s *Supervisor) walkBounds() (nodes, depth int) {
	nodes, depth = s.cfg.Observability.Sampling.MaxWalkNodes, s.cfg.Observability.Sampling.MaxWalkDepth
	if nodes < 1 {
		nodes = 1024
	}
	if depth < 1 {
		depth = 64
	}
	return nodes, depth
}

// summarizeStack sizes every layer with a bounded walk (at most maxNodes
// nodes per layer) and attaches the lease columns.
func summarizeStack(st *layers.Stack, maxNodes, maxDepth int) (stackSummary, error) {
	var sum stackSummary
	m, err := st.Head()
	if err != nil {
		return sum, err
	}
	sum.Manifest = m
	sum.Leases = leaseViews(st)
	order := m.LayerIDs()
	inOrder := map[string]bool{}
	for _, id := range order {
		inOrder[id] = true
	}
	for _, l := range sum.Leases {
		for _, id := range l.Layers {
			if !inOrder[id] {
				inOrder[id] = true
				order = append(order, id)
			}
		}
	}
	leasedBy, bookedBy := leaseIndex(order, sum.Leases)
	sized := map[string]bool{}
	row := func(id string) layerRow {
		r := layerRow{LayerID: id, LeasedBy: nonNil(leasedBy[id]), BookedBy: nonNil(bookedBy[id]), Source: "walk"}
		w, err := boundedWalk(filepath.Join(st.Dir(), "layers", id), maxNodes, maxDepth)
		sized[id] = true
		r.Bytes, r.AllocatedBytes, r.Estimated = w.Logical, w.Allocated, w.Truncated || err != nil
		if n, err := st.StoredBytes(id); err == nil {
			r.Bytes, r.Source = n, "sidecar"
		}
		sum.StorageLogical += r.Bytes
		sum.StorageAllocated += r.AllocatedBytes
		sum.Estimated = sum.Estimated || r.Estimated
		return r
	}
	sum.Layers = make([]layerRow, 0, len(m.Layers))
	for _, l := range m.Layers {
		r := row(l.LayerID)
		sum.TotalBytes += r.Bytes
		sum.TotalAllocated += r.AllocatedBytes
		sum.Layers = append(sum.Layers, r)
	}
	for _, id := range order[len(m.Layers):] {
		sum.Retained = append(sum.Retained, row(id))
	}
	// Layer directories held by nothing (garbage the next sweep removes) and
	// staging entries count toward storage too.
	if names, err := readNames(filepath.Join(st.Dir(), "layers"), 4096); err == nil {
		for _, id := range names {
			if sized[id] {
				continue
			}
			w, err := boundedWalk(filepath.Join(st.Dir(), "layers", id), maxNodes, maxDepth)
			sum.StorageLogical += w.Logical
			sum.StorageAllocated += w.Allocated
			sum.Estimated = sum.Estimated || w.Truncated || err != nil
		}
	}
	if names, err := readNames(filepath.Join(st.Dir(), "staging"), 4096); err == nil {
		sum.StagingEntries = len(names)
		for _, n := range names {
			w, err := boundedWalk(filepath.Join(st.Dir(), "staging", n), maxNodes, maxDepth)
			sum.StorageLogical += w.Logical
			sum.StorageAllocated += w.Allocated
			sum.Estimated = sum.Estimated || w.Truncated || err != nil
		}
	}
	return sum, nil
}

// readNames lists at most max names of a directory.
func readNames(dir string, max int) ([]string, error) {
	d, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	names, err := d.Readdirnames(max)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	sort.Strings(names)
	return names, nil
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func (s *Supervisor) layerstack(c *call) (any, error) {
	sb := c.sb
	if c.args.Has("workspace_id") && c.args.Has("layer_id") {
		return nil, catalog.Errorf(catalog.InvalidRequest, "workspace_id and layer_id are mutually exclusive")
	}
	var window int64 = -1
	if c.args.Has("window_ms") {
		w, err := s.windowMs(c)
		if err != nil {
			return nil, err
		}
		window = w
	}
	limit := uint64(s.cfg.Observability.Views.LayerDeltaDefaultLimit)
	if v, explicit := c.req.Args["limit"]; explicit && v != nil {
		limit = c.args.Uint("limit")
		if maxL := uint64(s.cfg.Observability.Views.LayerDeltaMaxLimit); limit > maxL {
			return nil, catalog.RangeError("limit", 1, maxL)
		}
	}
	if sb.Stack == nil {
		return nil, catalog.Errorf(catalog.OperationFailed, "sandbox %s has no layer stack", sb.Rec.ID).With("sandbox_id", sb.Rec.ID)
	}
	nodes, depth := s.walkBounds()
	switch {
	case c.args.Has("layer_id"):
		return s.layerstackLayer(sb, c.args.String("layer_id"), int(limit), depth)
	case c.args.Has("workspace_id"):
		return s.layerstackWorkspace(sb, c.args.String("workspace_id"), nodes, depth)
	}
	sum, err := summarizeStack(sb.Stack, nodes, depth)
	if err != nil {
		return nil, err
	}
	out := map[string]any{
		"view": "layerstack", "manifest_version": sum.Manifest.Version, "root_hash": sum.Manifest.RootHash(),
		"active_lease_count": len(sum.Leases), "total_bytes": sum.TotalBytes, "total_allocated_bytes": sum.TotalAllocated,
		"storage_logical_bytes": sum.StorageLogical, "storage_allocated_bytes": sum.StorageAllocated,
		"staging_entry_count": sum.StagingEntries, "layers": sum.Layers, "estimated": sum.Estimated,
	}
	if len(sum.Retained) > 0 {
		out["retained_layers"] = sum.Retained
	}
	if window >= 0 {
		trend, err := s.stackTrend(sb, window)
		if err != nil {
			return nil, err
		}
		out["trend"] = trend
	}
	return out, nil
}

func (s *Supervisor) layerstackLayer(sb *sandbox, id string, limit, depth int) (any, error) {
	notFound := catalog.Errorf(catalog.NotFound, "layer not found: %s", id).With("layer_id", id)
	if id == "." || id == ".." || strings.ContainsAny(id, "/") {
		return nil, notFound
	}
	dir := filepath.Join(sb.Stack.Dir(), "layers", id)
	if fi, err := os.Lstat(dir); err != nil || !fi.IsDir() {
		return nil, notFound
	}
	entries, truncated, err := layerEntries(dir, limit, depth)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, notFound // collected meanwhile
		}
		return nil, err
	}
	return map[string]any{"view": "layerstack", "layer_id": id, "entries": entries, "truncated": truncated}, nil
}

func (s *Supervisor) layerstackWorkspace(sb *sandbox, id string, nodes, depth int) (any, error) {
	ss, e := lookupSession(sb, id)
	if e != nil {
		return nil, e
	}
	rec := ss.record()
	users := map[string][]string{} // layer → workspace sessions leasing it
	for _, l := range leaseViews(sb.Stack) {
		ws, ok := strings.CutPrefix(l.Owner, wsOwnerPrefix)
		if !ok || ws == id {
			continue
		}
		for _, lid := range l.Layers {
			users[lid] = append(users[lid], ws)
		}
	}
	mounts := make([]map[string]any, 0, len(rec.Lease.Layers))
	for _, l := range rec.Lease.Layers {
		shared := nonNil(users[l.LayerID])
		sort.Strings(shared)
		mounts = append(mounts, map[string]any{"layer_id": l.LayerID, "shared_with": shared})
	}
	w, err := boundedWalk(ss.upper(), nodes, depth)
	return map[string]any{"view": "layerstack", "workspace": id, "mounts": mounts, "upper_bytes": w.Logical,
		"estimated": w.Truncated || err != nil}, nil
}

// ------------------------------------------------------------- snapshot

func (s *Supervisor) snapshot(c *call) (any, error) {
	if c.sb != nil {
		return s.snapshotNode(c.sb), nil
	}
	nodes := []map[string]any{}
	for _, sb := range s.sandboxesSorted() {
		nodes = append(nodes, s.safeSnapshotNode(sb))
	}
	return map[string]any{"sandboxes": nodes}, nil
}

// safeSnapshotNode builds one node; a failure yields an unavailable node.
func (s *Supervisor) safeSnapshotNode(sb *sandbox) (node map[string]any) {
	defer func() {
		if r := recover(); r != nil {
			sb.Mu.Lock()
			id, state := sb.Rec.ID, sb.Rec.State
			sb.Mu.Unlock()
			msg := boundedError(fmt.Sprintf("building the snapshot failed: %v", r))
			node = map[string]any{"sandbox_id": id, "lifecycle_state": state, "availability": "unavailable",
				"sampled_at_unix_ms": time.Now().UnixMilli(), "errors": []string{msg}, "error": msg}
		}
	}()
	return s.snapshotNode(sb)
}

// boundedError cuts an error string to 4 KiB on a UTF-8 boundary.
func boundedError(msg string) string {
	if len(msg) <= nodeErrorMax {
		return msg
	}
	cut := nodeErrorMax
	for cut > 0 && (msg[cut]&0xC0) == 0x80 {
		cut--
	}
	return msg[:cut]
}

func (s *Supervisor) snapshotNode(sb *sandbox) map[string]any {
	sb.Mu.Lock()
	rec := sb.Rec
	sb.Mu.Unlock()
	errs := []string{}
	availability := "available"
	sbRes, wsRes, rerr := s.snapshotResources(sb)
	switch {
	case rerr != nil:
		availability, errs = "partial", append(errs, boundedError(rerr.Error()))
		sbRes = map[string]any{"latest": nil, "history": []any{}}
	case sbRes["latest"] == nil:
		// No samples: the sandbox has no live session, or none was taken yet.
		availability, errs = "partial", append(errs, s.noSamples("sandbox", snapshotWindowMs))
	}
	node := map[string]any{
		"sandbox_id": rec.ID, "lifecycle_state": rec.State, "sampled_at_unix_ms": time.Now().UnixMilli(),
		"daemon": map[string]any{"daemon_pid": os.Getpid(), "runtime_dir": sb.Dir,
			"event_store": s.obsStats(sb)}, // the sandbox event store's SinkStats
		"resources": sbRes,
	}
	if rec.State == stateFailed && rec.Error != "" {
		errs = append(errs, boundedError("sandbox failed: "+rec.Error))
	}
	// Running commands by session.
	sb.Mu.Lock()
	cmds := make([]*command, 0, len(sb.Work.commands))
	for _, cmd := range sb.Work.commands {
		cmds = append(cmds, cmd)
	}
	sb.Mu.Unlock()
	running := map[string][]map[string]any{}
	for _, cmd := range cmds {
		cmd.mu.Lock()
		cr := cmd.rec
		cmd.mu.Unlock()
		if cr.Status != cmdRunning {
			continue // the status read_command_lines reports
		}
		running[cr.WorkspaceSessionID] = append(running[cr.WorkspaceSessionID], map[string]any{
			"namespace_execution_id": cr.CommandSessionID, "operation": "exec_command",
			"lifecycle_state": "running", "command": cr.Cmd})
	}
	workspaces := []map[string]any{}
	for _, ss := range sessionsSorted(sb) {
		r := ss.record()
		pid := ss.holderPid()
		var holder any
		fds := 0
		if pid > 0 {
			holder = pid
			fds = 1 // the control channel
		}
		execs := running[r.WorkspaceSessionID]
		if execs == nil {
			execs = []map[string]any{}
		}
		sort.Slice(execs, func(i, j int) bool {
			return execs[i]["namespace_execution_id"].(string) < execs[j]["namespace_execution_id"].(string)
		})
		fds += len(execs) // one PTY master per running command
		res := wsRes[r.WorkspaceSessionID]
		if res == nil {
			res = map[string]any{"latest": nil, "history": []any{}}
		}
		workspaces = append(workspaces, map[string]any{
			"workspace_id": r.WorkspaceSessionID, "agent": r.Agent, "lifecycle_state": "active",
			"finalization_state": r.State, "network_profile": r.NetworkProfile, "finalize_policy": r.FinalizePolicy,
			"overlay_driver": r.OverlayDriver, "holder_pid": holder,
			"layers":                      map[string]any{"base_root_hash": layers.ManifestRootHash(r.Lease.Layers), "layer_count": len(r.Lease.Layers)},
			"namespace_fd_count":          fds,
			"resources":                   res,
			"active_namespace_executions": execs,
		})
	}
	node["workspaces"] = workspaces
	if sb.Stack == nil {
		errs = append(errs, "no layer stack")
		node["stack"] = nil
	} else {
		nodes, depth := s.walkBounds()
		sum, err := summarizeStack(sb.Stack, nodes, depth)
		if err != nil {
			errs = append(errs, boundedError("layer stack: "+err.Error()))
			node["stack"] = nil
		} else {
			node["stack"] = map[string]any{"layer_count": len(sum.Layers), "layers_bytes": sum.TotalBytes,
				"layers_allocated_bytes": sum.TotalAllocated, "storage_allocated_bytes": sum.StorageAllocated,
				"staging_entry_count": sum.StagingEntries, "active_leases": len(sum.Leases), "estimated": sum.Estimated}
		}
	}
	if rec.State == stateFailed || node["stack"] == nil {
		availability = "unavailable"
	}
	node["availability"] = availability
	node["errors"] = errs
	return node
}
