package resources

// The resource sampler and the resources/cgroup views (§10.2, §10.3).
//
// Every observability.resource_stats.sample_interval_ms the sampler appends,
// for each sandbox with at least one live session, one "sandbox" sample,
// one sample per session and, every 10th interval, one "stack" sample to
// the sandbox's resources.ndjson (strict appends: a sample that does not
// fit is dropped). A session's metrics come from its cgroup when the
// supervisor's cgroup is delegated, otherwise from one /proc scan summing
// the holder and every process in the holder's PID and mount namespaces —
// the FUSE overlay is served by the holder, so its work is charged to the
// session it serves. The sandbox sample is its cgroup, or the sum of its
// sessions. Queries read the store only: no samples means availability
// "partial" with an error, never a sample taken on demand. Deltas are
// computed at read time from consecutive samples; counters that went down
// (a process exited, with /proc) give a delta of 0.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/ephemeral-ai-lab/sandbox/supervisor/obs"
)

const (
	// MaxLine is the longest line a store holds (observability.max_line_bytes' maximum).
	MaxLine      = 16384
	ScopeSandbox = "sandbox"
	ScopeStack   = "stack"
	// stackEvery is how many intervals lie between two stack samples.
	stackEvery = 10
	// snapshotHistory bounds resources.history of a snapshot.
	snapshotHistory = 30
	// SnapshotWindowMs is the window snapshot's resources come from.
	SnapshotWindowMs = 60000
)

// counterKeys are the monotonic metrics (§10.2 _counters).
var counterKeys = []string{"cpu_usec", "io_rbytes", "io_wbytes"}

// Metrics are the metrics of one sandbox or session sample.
type Metrics struct {
	MetricsSource   string  `json:"metrics_source"`
	CgroupPath      *string `json:"cgroup_path,omitempty"`
	CgroupAvailable bool    `json:"cgroup_available"`
	CgroupError     string  `json:"cgroup_error,omitempty"`
	CPUUsec         uint64  `json:"cpu_usec"`
	MemCur          int64   `json:"mem_cur"`
	MemMax          *int64  `json:"mem_max,omitempty"`
	MemMaxUnlimited bool    `json:"mem_max_unlimited,omitempty"`
	IORBytes        uint64  `json:"io_rbytes"`
	IOWBytes        uint64  `json:"io_wbytes"`
	PidsCur         int     `json:"pids_cur"`
}

func (m *Metrics) add(o Metrics) {
	m.CPUUsec += o.CPUUsec
	m.MemCur += o.MemCur
	m.IORBytes += o.IORBytes
	m.IOWBytes += o.IOWBytes
	m.PidsCur += o.PidsCur
}

// sampleRecord is one line of resources.ndjson; metrics are inline.
type sampleRecord struct {
	Kind  string `json:"kind"`
	TS    int64  `json:"ts"`
	Scope string `json:"scope"`
	*Metrics
	*StackMetrics
	Counters []string `json:"_counters"`
}

// StackMetrics are the metrics of a stack sample.
type StackMetrics struct {
	LayerCount            int   `json:"layer_count"`
	LayersBytes           int64 `json:"layers_bytes"`
	LayersAllocatedBytes  int64 `json:"layers_allocated_bytes"`
	StorageAllocatedBytes int64 `json:"storage_allocated_bytes"`
	StagingEntryCount     int   `json:"staging_entry_count"`
	ActiveLeases          int   `json:"active_leases"`
}

// Run calls sample every interval until ctx ends; withStack is true every
// stackEvery-th time.
func Run(ctx context.Context, interval time.Duration, sample func(withStack bool)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for tick := uint64(1); ; tick++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		sample(tick%stackEvery == 0)
	}
}

// Session is one live workspace session the sampler measures.
type Session struct {
	ID  string
	Pid int // holder, 0 without one
	m   Metrics
}

// Group is one sandbox with live sessions: where its samples go and, for
// a stack sample, how to measure its layer stack (nil: no stack).
type Group struct {
	ID       string
	Store    *obs.Store
	Sessions []*Session
	Stack    func() (*StackMetrics, error)
}

// Sample writes one round of samples of groups: every session's metrics
// (MeasureSessions), the sandbox's (its cgroup, else their sum) and, when
// a group has Stack, its stack sample.
func Sample(cg *Cgroups, procRoot string, groups []Group) {
	if len(groups) == 0 {
		return
	}
	var all []*Session
	for _, g := range groups {
		all = append(all, g.Sessions...)
	}
	MeasureSessions(cg, procRoot, all)
	ts := time.Now().UnixMilli()
	for _, g := range groups {
		st := g.Store
		total := Metrics{MetricsSource: "proc", CgroupError: cg.ReasonOr("")}
		if dir := cg.SandboxPath(g.ID); dir != "" {
			if m, err := ReadCgroupMetrics(dir); err == nil {
				total = m
			} else {
				total.CgroupError = "read " + dir + ": " + err.Error()
			}
		}
		if total.MetricsSource == "proc" {
			total.MemMaxUnlimited = true
			for _, ls := range g.Sessions {
				total.add(ls.m)
			}
		}
		AppendSample(st, ts, ScopeSandbox, &total, nil)
		for _, ls := range g.Sessions {
			AppendSample(st, ts, ls.ID, &ls.m, nil)
		}
		if g.Stack != nil {
			if sm, err := g.Stack(); err == nil {
				AppendSample(st, ts, ScopeStack, nil, sm)
			}
		}
	}
}

func AppendSample(st *obs.Store, ts int64, scope string, m *Metrics, sm *StackMetrics) {
	rec := sampleRecord{Kind: "sample", TS: ts, Scope: scope, Metrics: m, StackMetrics: sm, Counters: []string{}}
	if m != nil {
		rec.Counters = counterKeys
	}
	st.AppendRecord(&rec, nil) // strict: never truncated
}

// reasonOr is the reason delegation is not used, or def.
func (cg *Cgroups) ReasonOr(def string) string {
	if cg == nil {
		return "cgroups were not probed"
	}
	if cg.Reason == "" {
		return def
	}
	return cg.Reason
}

// MeasureSessions fills every session's metrics: from its cgroup when it
// has one, else from one scan of procRoot.
func MeasureSessions(cg *Cgroups, procRoot string, sess []*Session) {
	type nsKey struct{ pid, mnt NSID }
	byNS := map[nsKey]*Session{}
	pidNS := map[NSID]bool{}
	for _, ls := range sess {
		ls.m = Metrics{MetricsSource: "proc", CgroupError: cg.ReasonOr(""), MemMaxUnlimited: true}
		if dir := cg.SessionPath(ls.ID); dir != "" {
			m, err := ReadCgroupMetrics(dir)
			if err == nil {
				ls.m = m
				continue
			}
			ls.m.CgroupError = "read " + dir + ": " + err.Error()
		}
		if ls.Pid <= 0 {
			continue
		}
		dir := procRoot + "/" + strconv.Itoa(ls.Pid)
		pn, err1 := StatNS(dir, "pid")
		mn, err2 := StatNS(dir, "mnt")
		if err1 != nil || err2 != nil {
			continue // the holder is gone: nothing to charge
		}
		byNS[nsKey{pn, mn}] = ls
		pidNS[pn] = true
	}
	if len(byNS) == 0 {
		return
	}
	d, err := os.Open(procRoot)
	if err != nil {
		return
	}
	defer d.Close()
	for {
		names, rerr := d.Readdirnames(512)
		for _, name := range names {
			if name == "" || name[0] < '1' || name[0] > '9' {
				continue
			}
			dir := procRoot + "/" + name
			pn, err := StatNS(dir, "pid")
			if err != nil || !pidNS[pn] {
				continue
			}
			mn, err := StatNS(dir, "mnt")
			if err != nil {
				continue
			}
			ls := byNS[nsKey{pn, mn}]
			if ls == nil {
				continue
			}
			p, err := ReadProc(dir)
			if err != nil {
				continue // exited meanwhile
			}
			ls.m.CPUUsec += p.CPUTimeUs()
			ls.m.MemCur += p.VMRSS
			ls.m.PidsCur++
			r, w := ReadProcIO(dir)
			ls.m.IORBytes += r
			ls.m.IOWBytes += w
		}
		if rerr != nil {
			return
		}
	}
}

// ReadProcIO reads read_bytes and write_bytes of /proc/<pid>/io (0 when
// unreadable).
func ReadProcIO(dir string) (r, w uint64) {
	b, err := ReadSmall(dir+"/io", 1024)
	if err != nil {
		return 0, 0
	}
	for l := range strings.SplitSeq(string(b), "\n") {
		k, v, ok := strings.Cut(l, ":")
		if !ok {
			continue
		}
		n, _ := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
		switch k {
		case "read_bytes":
			r = n
		case "write_bytes":
			w = n
		}
	}
	return r, w
}

// ---- queries ----

// Point is one entry of a resources series.
type Point struct {
	TS            int64            `json:"ts"`
	SampleDeltaMs *int64           `json:"sample_delta_ms"`
	Metrics       map[string]any   `json:"metrics"`
	Deltas        map[string]int64 `json:"deltas"`
}

// Window keeps the newest samples of one scope within a count and a
// byte budget, plus the sample just before the oldest kept (the base of
// the first delta).
type Window struct {
	max, maxBytes, bytes int
	lines                [][]byte
	before               []byte // the sample preceding lines[0]
}

func (w *Window) add(line []byte) {
	if len(line)+1 > w.maxBytes {
		return
	}
	w.lines = append(w.lines, append([]byte(nil), line...))
	w.bytes += len(line) + 1
	for len(w.lines) > w.max || w.bytes > w.maxBytes {
		w.before = w.lines[0]
		w.bytes -= len(w.lines[0]) + 1
		w.lines = w.lines[1:]
	}
}

// pointOverhead is what a series point adds to its sample's bytes (the
// deltas and the wrapping keys).
const pointOverhead = 160

// SeriesBudget is the sample bytes a series of at most n points may keep so
// that the response stays within obs.MaxBytes, with share of the whole
// budget (1 for a response that is only the series).
func SeriesBudget(n int, share float64) int {
	return int(float64(obs.MaxBytes-obs.EnvelopeSlack)*share) - pointOverhead*n
}

// ReadScopes scans a resource store once and returns, for every scope
// keep accepts, the newest samples at or after since (at most max each,
// within maxBytes of sample text each). A nil store has no samples.
func ReadScopes(ctx context.Context, st *obs.Store, since int64, max, maxBytes int, keep func(scope string) bool) (map[string]*Window, error) {
	out := map[string]*Window{}
	snap, err := st.Open()
	if err != nil {
		return nil, fmt.Errorf("read resource store: %w", err)
	}
	defer snap.Close()
	var last = map[string][]byte{} // the newest sample before since, per scope
	err = snap.Scan(ctx, func(line []byte) {
		h, ok := sampleHead(line)
		if !ok || !keep(h.Scope) {
			return
		}
		if h.TS < since {
			last[h.Scope] = append(last[h.Scope][:0], line...)
			return
		}
		w := out[h.Scope]
		if w == nil {
			w = &Window{max: max, maxBytes: maxBytes}
			if b := last[h.Scope]; b != nil {
				w.before = append([]byte(nil), b...)
			}
			out[h.Scope] = w
		}
		w.add(line)
	})
	if err != nil {
		return nil, fmt.Errorf("read resource store: %w", err)
	}
	return out, nil
}

// sampleHeader is what the queries filter samples on.
type sampleHeader struct {
	Kind  string `json:"kind"`
	TS    int64  `json:"ts"`
	Scope string `json:"scope"`
}

// samplePrefix starts every sample line AppendSample writes (field order
// of sampleRecord).
var samplePrefix = []byte(`{"kind":"sample","ts":`)

// sampleHead reads a sample line's kind, ts and scope: directly from the
// fixed prefix the sampler writes (a query scans up to the whole store, so
// this is the hot path), else by decoding the line.
func sampleHead(line []byte) (sampleHeader, bool) {
	if rest, ok := bytes.CutPrefix(line, samplePrefix); ok {
		i := 0
		for i < len(rest) && rest[i] >= '0' && rest[i] <= '9' {
			i++
		}
		ts, err := strconv.ParseInt(string(rest[:i]), 10, 64)
		if after, ok := bytes.CutPrefix(rest[i:], []byte(`,"scope":"`)); ok && err == nil {
			if j := bytes.IndexByte(after, '"'); j >= 0 && bytes.IndexByte(after[:j], '\\') < 0 {
				return sampleHeader{Kind: "sample", TS: ts, Scope: string(after[:j])}, true
			}
		}
	}
	var h sampleHeader
	if json.Unmarshal(line, &h) != nil || h.Kind != "sample" {
		return h, false
	}
	return h, true
}

// series turns a window into points with per-counter deltas (clamped at 0).
func (w *Window) Series() []Point {
	out := []Point{}
	if w == nil {
		return out
	}
	var prev map[string]any
	var prevTS int64
	if w.before != nil {
		prev, prevTS = DecodeSample(w.before)
	}
	for _, line := range w.lines {
		m, ts := DecodeSample(line)
		p := Point{TS: ts, Metrics: m, Deltas: map[string]int64{}}
		if prev != nil {
			d := ts - prevTS
			p.SampleDeltaMs = &d
			for _, k := range counterKeys {
				a, okA := prev[k].(json.Number)
				b, okB := m[k].(json.Number)
				if !okA || !okB {
					continue
				}
				x, _ := a.Int64()
				y, _ := b.Int64()
				p.Deltas[k] = max(0, y-x)
			}
		}
		prev, prevTS = m, ts
		out = append(out, p)
	}
	return out
}

// DecodeSample returns a sample's metrics (without kind, ts, scope and
// _counters) and its time.
func DecodeSample(line []byte) (map[string]any, int64) {
	var m map[string]any
	d := json.NewDecoder(strings.NewReader(string(line)))
	d.UseNumber()
	if d.Decode(&m) != nil {
		return map[string]any{}, 0
	}
	var ts int64
	if n, ok := m["ts"].(json.Number); ok {
		ts, _ = n.Int64()
	}
	for _, k := range []string{"kind", "ts", "scope", "_counters"} {
		delete(m, k)
	}
	return m, ts
}

// View answers the resource queries (§10.3) from the stores of a
// registry; it reads samples only, never takes one.
type View struct {
	Reg              *obs.Registry
	SampleIntervalMs int
}

// NoSamples is the error of a view without samples in its window.
func (v View) NoSamples(what string, windowMs int64) string {
	switch {
	case !v.Reg.Enabled():
		return "observability is disabled (observability.enabled: false)"
	case !v.Reg.ResourcesEnabled():
		return "resource sampling is disabled (observability.resource_stats.enabled: false)"
	}
	return fmt.Sprintf("no %s resource samples in the last %d ms: samples are taken every %d ms while the sandbox has a live session, never on demand",
		what, windowMs, v.SampleIntervalMs)
}

// Series is one scope's series of sc's samples at or after since: at most
// n points within share of a response.
func (v View) Series(ctx context.Context, sc obs.Scope, scope string, since int64, n int, share float64) ([]Point, error) {
	ws, err := ReadScopes(ctx, v.Reg.Resources(sc), since, n, SeriesBudget(n, share), func(s string) bool { return s == scope })
	if err != nil {
		return nil, err
	}
	return ws[scope].Series(), nil
}

// Current is the metrics of sc's newest sandbox sample at or after since,
// nil when there is none.
func (v View) Current(ctx context.Context, sc obs.Scope, since int64) (map[string]any, error) {
	ws, err := ReadScopes(ctx, v.Reg.Resources(sc), since, 1, MaxLine, func(s string) bool { return s == ScopeSandbox })
	if err != nil {
		return nil, err
	}
	if w := ws[ScopeSandbox]; w != nil && len(w.lines) > 0 {
		m, _ := DecodeSample(w.lines[0])
		return m, nil
	}
	return nil, nil
}

// Snapshot is snapshot's resources blocks: {latest, history} for the
// sandbox and each of its sessions (sessions is how many it has), from the
// samples of the last minute.
func (v View) Snapshot(ctx context.Context, sc obs.Scope, sessions int) (sandboxRes map[string]any, bySession map[string]map[string]any, err error) {
	// The history of every scope shares about half of the response (the
	// rest is the sandbox's other blocks): 30 points each, fewer when a
	// sandbox has many sessions.
	scopes := sessions + 1
	per := max(1, min(snapshotHistory, obs.MaxRecords/2/scopes))
	ws, err := ReadScopes(ctx, v.Reg.Resources(sc), time.Now().UnixMilli()-SnapshotWindowMs, per, max(MaxLine, SeriesBudget(per*scopes, 0.5)/scopes),
		func(s string) bool { return s != ScopeStack })
	if err != nil {
		return nil, nil, err
	}
	block := func(w *Window) map[string]any {
		ser := w.Series()
		var latest any
		if len(ser) > 0 {
			latest = ser[len(ser)-1].Metrics
		}
		return map[string]any{"latest": latest, "history": ser}
	}
	bySession = map[string]map[string]any{}
	for s, w := range ws {
		if s != ScopeSandbox {
			bySession[s] = block(w)
		}
	}
	return block(ws[ScopeSandbox]), bySession, nil
}
