package supervisor

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

	"github.com/ephemeral-ai-lab/sandbox/catalog"
)

const (
	// obsMaxLine is the longest line a store holds (observability.max_line_bytes' maximum).
	obsMaxLine   = 16384
	scopeSandbox = "sandbox"
	scopeStack   = "stack"
	// stackEvery is how many intervals lie between two stack samples.
	stackEvery = 10
	// snapshotHistory bounds resources.history of a snapshot.
	snapshotHistory = 30
	// snapshotWindowMs is the window snapshot's resources come from.
	snapshotWindowMs = 60000
)

// counterKeys are the monotonic metrics (§10.2 _counters).
var counterKeys = []string{"cpu_usec", "io_rbytes", "io_wbytes"}

// resMetrics are the metrics of one sandbox or session sample.
type resMetrics struct {
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

func (m *resMetrics) add(o resMetrics) {
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
	*resMetrics
	*stackMetrics
	Counters []string `json:"_counters"`
}

// stackMetrics are the metrics of a stack sample.
type stackMetrics struct {
	LayerCount            int   `json:"layer_count"`
	LayersBytes           int64 `json:"layers_bytes"`
	LayersAllocatedBytes  int64 `json:"layers_allocated_bytes"`
	StorageAllocatedBytes int64 `json:"storage_allocated_bytes"`
	StagingEntryCount     int   `json:"staging_entry_count"`
	ActiveLeases          int   `json:"active_leases"`
}

// runSampler samples until ctx ends.
func (s *Supervisor) runSampler(ctx context.Context) {
	if s.obs == nil || !s.obs.resEnabled {
		return
	}
	t := time.NewTicker(time.Duration(s.cfg.Observability.ResourceStats.SampleIntervalMs) * time.Millisecond)
	defer t.Stop()
	for tick := uint64(1); ; tick++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.sampleOnce(tick%stackEvery == 0)
	}
}

// liveSession is one session the sampler looks at.
type liveSession struct {
	sb  *sandbox
	ss  *session
	id  string
	pid int // holder, 0 without one
	m   resMetrics
}

// sampleOnce writes one round of samples.
func (s *Supervisor) sampleOnce(withStack bool) {
	type group struct {
		sb   *sandbox
		sess []*liveSession
	}
	var groups []group
	var all []*liveSession
	for _, sb := range s.sandboxesSorted() {
		// Hold the sandbox's gate like a request does, so destroy never
		// removes the directory while a sample is being written into it;
		// a sandbox being destroyed is skipped.
		if !sb.Gate.TryRLock() {
			continue
		}
		defer sb.Gate.RUnlock()
		sb.Mu.Lock()
		state := sb.Rec.State
		sb.Mu.Unlock()
		if state != stateReady {
			continue
		}
		g := group{sb: sb}
		for _, ss := range sessionsSorted(sb) {
			ls := &liveSession{sb: sb, ss: ss, id: ss.id(), pid: ss.holderPid()}
			g.sess = append(g.sess, ls)
			all = append(all, ls)
		}
		if len(g.sess) > 0 {
			groups = append(groups, g)
		}
	}
	if len(groups) == 0 {
		return
	}
	s.measureSessions("/proc", all)
	ts := time.Now().UnixMilli()
	for _, g := range groups {
		st := s.obs.resources(g.sb)
		total := resMetrics{MetricsSource: "proc", CgroupError: s.cgroups.reasonOr("")}
		if dir := s.cgroups.sandboxPath(g.sb.Rec.ID); dir != "" {
			if m, err := readCgroupMetrics(dir); err == nil {
				total = m
			} else {
				total.CgroupError = "read " + dir + ": " + err.Error()
			}
		}
		if total.MetricsSource == "proc" {
			total.MemMaxUnlimited = true
			for _, ls := range g.sess {
				total.add(ls.m)
			}
		}
		appendSample(st, ts, scopeSandbox, &total, nil)
		for _, ls := range g.sess {
			appendSample(st, ts, ls.id, &ls.m, nil)
		}
		if withStack && g.sb.Stack != nil {
			nodes, depth := s.walkBounds()
			if sum, err := summarizeStack(g.sb.Stack, nodes, depth); err == nil {
				appendSample(st, ts, scopeStack, nil, &stackMetrics{LayerCount: len(sum.Layers), LayersBytes: sum.TotalBytes,
					LayersAllocatedBytes: sum.TotalAllocated, StorageAllocatedBytes: sum.StorageAllocated,
					StagingEntryCount: sum.StagingEntries, ActiveLeases: len(sum.Leases)})
			}
		}
	}
}

func appendSample(st *obsStore, ts int64, scope string, m *resMetrics, sm *stackMetrics) {
	rec := sampleRecord{Kind: "sample", TS: ts, Scope: scope, resMetrics: m, stackMetrics: sm, Counters: []string{}}
	if m != nil {
		rec.Counters = counterKeys
	}
	st.appendRecord(&rec, nil) // strict: never truncated
}

// reasonOr is the reason delegation is not used, or def.
func (cg *cgroups) reasonOr(def string) string {
	if cg == nil {
		return "cgroups were not probed"
	}
	if cg.reason == "" {
		return def
	}
	return cg.reason
}

// measureSessions fills every session's metrics: from its cgroup when it
// has one, else from one scan of procRoot.
func (s *Supervisor) measureSessions(procRoot string, sess []*liveSession) {
	type nsKey struct{ pid, mnt nsID }
	byNS := map[nsKey]*liveSession{}
	pidNS := map[nsID]bool{}
	for _, ls := range sess {
		ls.m = resMetrics{MetricsSource: "proc", CgroupError: s.cgroups.reasonOr(""), MemMaxUnlimited: true}
		if dir := s.cgroups.sessionPath(ls.id); dir != "" {
			m, err := readCgroupMetrics(dir)
			if err == nil {
				ls.m = m
				continue
			}
			ls.m.CgroupError = "read " + dir + ": " + err.Error()
		}
		if ls.pid <= 0 {
			continue
		}
		dir := procRoot + "/" + strconv.Itoa(ls.pid)
		pn, err1 := statNS(dir, "pid")
		mn, err2 := statNS(dir, "mnt")
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
			pn, err := statNS(dir, "pid")
			if err != nil || !pidNS[pn] {
				continue
			}
			mn, err := statNS(dir, "mnt")
			if err != nil {
				continue
			}
			ls := byNS[nsKey{pn, mn}]
			if ls == nil {
				continue
			}
			p, err := readProc(dir)
			if err != nil {
				continue // exited meanwhile
			}
			ls.m.CPUUsec += p.cpuTimeUs()
			ls.m.MemCur += p.vmRSS
			ls.m.PidsCur++
			r, w := readProcIO(dir)
			ls.m.IORBytes += r
			ls.m.IOWBytes += w
		}
		if rerr != nil {
			return
		}
	}
}

// readProcIO reads read_bytes and write_bytes of /proc/<pid>/io (0 when
// unreadable).
func readProcIO(dir string) (r, w uint64) {
	b, err := readSmall(dir+"/io", 1024)
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

// seriesPoint is one entry of a resources series.
type seriesPoint struct {
	TS            int64            `json:"ts"`
	SampleDeltaMs *int64           `json:"sample_delta_ms"`
	Metrics       map[string]any   `json:"metrics"`
	Deltas        map[string]int64 `json:"deltas"`
}

// sampleWindow keeps the newest samples of one scope within a count and a
// byte budget, plus the sample just before the oldest kept (the base of
// the first delta).
type sampleWindow struct {
	max, maxBytes, bytes int
	lines                [][]byte
	before               []byte // the sample preceding lines[0]
}

func (w *sampleWindow) add(line []byte) {
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

// windowMs validates window_ms against observability.views.resource_window_ms.
func (s *Supervisor) windowMs(c *call) (int64, error) {
	w := c.args.Uint("window_ms")
	if maxW := s.cfg.Observability.Views.ResourceWindowMs; w > uint64(maxW) {
		return 0, catalog.Errorf(catalog.InvalidRequest, "window_ms exceeds max (%d)", maxW).With("max", maxW)
	}
	return int64(w), nil
}

// pointOverhead is what a series point adds to its sample's bytes (the
// deltas and the wrapping keys).
const pointOverhead = 160

// seriesBudget is the sample bytes a series of at most n points may keep so
// that the response stays within obsMaxBytes, with share of the whole
// budget (1 for a response that is only the series).
func seriesBudget(n int, share float64) int {
	return int(float64(obsMaxBytes-obsEnvelopeSlack)*share) - pointOverhead*n
}

// readScopes scans sb's resource store once and returns, for every scope
// keep accepts, the newest samples at or after since (at most max each,
// within maxBytes of sample text each).
func (s *Supervisor) readScopes(sb *sandbox, since int64, max, maxBytes int, keep func(scope string) bool) (map[string]*sampleWindow, error) {
	out := map[string]*sampleWindow{}
	snap, err := s.obs.resources(sb).open()
	if err != nil {
		return nil, catalog.Errorf(catalog.OperationFailed, "read resource store: %v", err)
	}
	defer snap.close()
	var last = map[string][]byte{} // the newest sample before since, per scope
	err = snap.scan(func(line []byte) {
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
			w = &sampleWindow{max: max, maxBytes: maxBytes}
			if b := last[h.Scope]; b != nil {
				w.before = append([]byte(nil), b...)
			}
			out[h.Scope] = w
		}
		w.add(line)
	})
	if err != nil {
		return nil, catalog.Errorf(catalog.OperationFailed, "read resource store: %v", err)
	}
	return out, nil
}

// sampleHeader is what the queries filter samples on.
type sampleHeader struct {
	Kind  string `json:"kind"`
	TS    int64  `json:"ts"`
	Scope string `json:"scope"`
}

// samplePrefix starts every sample line appendSample writes (field order
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
func (w *sampleWindow) series() []seriesPoint {
	out := []seriesPoint{}
	if w == nil {
		return out
	}
	var prev map[string]any
	var prevTS int64
	if w.before != nil {
		prev, prevTS = decodeSample(w.before)
	}
	for _, line := range w.lines {
		m, ts := decodeSample(line)
		p := seriesPoint{TS: ts, Metrics: m, Deltas: map[string]int64{}}
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

// decodeSample returns a sample's metrics (without kind, ts, scope and
// _counters) and its time.
func decodeSample(line []byte) (map[string]any, int64) {
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

// noSamples is the error of a view without samples in its window.
func (s *Supervisor) noSamples(what string, windowMs int64) string {
	switch {
	case s.obs == nil || !s.obs.enabled:
		return "observability is disabled (observability.enabled: false)"
	case !s.obs.resEnabled:
		return "resource sampling is disabled (observability.resource_stats.enabled: false)"
	}
	return fmt.Sprintf("no %s resource samples in the last %d ms: samples are taken every %d ms while the sandbox has a live session, never on demand",
		what, windowMs, s.cfg.Observability.ResourceStats.SampleIntervalMs)
}

// resources is the resources operation (§10.3).
func (s *Supervisor) resources(c *call) (any, error) {
	window, err := s.windowMs(c)
	if err != nil {
		return nil, err
	}
	since := time.Now().UnixMilli() - window
	if c.sb != nil {
		ws, err := s.readScopes(c.sb, since, obsMaxRecords, seriesBudget(obsMaxRecords, 1), func(sc string) bool { return sc == scopeSandbox })
		if err != nil {
			return nil, err
		}
		series := ws[scopeSandbox].series()
		availability, errs := "available", []string{}
		if len(series) == 0 {
			availability, errs = "partial", []string{s.noSamples("sandbox", window)}
		}
		return map[string]any{"view": "resources", "scope": "sandbox", "sandbox_id": c.sb.Rec.ID, "source": "supervisor_disk",
			"availability": availability, "errors": errs, "series": series}, nil
	}
	fleet := map[string]any{}
	availability, errs := "available", []string{}
	for _, sb := range s.sandboxesSorted() {
		node := map[string]any{"availability": "available", "errors": []string{}, "current": nil}
		ws, err := s.readScopes(sb, since, 1, obsMaxLine, func(sc string) bool { return sc == scopeSandbox })
		switch {
		case err != nil:
			node["availability"], node["errors"] = "unavailable", []string{boundedError(err.Error())}
		case ws[scopeSandbox] == nil || len(ws[scopeSandbox].lines) == 0:
			node["availability"], node["errors"] = "partial", []string{s.noSamples("sandbox", window)}
		default:
			node["current"], _ = decodeSample(ws[scopeSandbox].lines[0])
		}
		if node["availability"] != "available" {
			availability = "partial"
			errs = append(errs, sb.Rec.ID+": "+node["errors"].([]string)[0])
		}
		fleet[sb.Rec.ID] = node
	}
	if len(errs) > 16 {
		errs = append(errs[:16], fmt.Sprintf("… and %d more", len(errs)-16))
	}
	return map[string]any{"view": "resources", "scope": "fleet", "availability": availability, "errors": errs, "sandboxes": fleet}, nil
}

// cgroupView is the cgroup operation (§10.3): the samples of the sandbox or
// of one live session, and the processes of that scope.
func (s *Supervisor) cgroupView(c *call) (any, error) {
	window, err := s.windowMs(c)
	if err != nil {
		return nil, err
	}
	scope := c.args.String("scope")
	sessions := sessionsSorted(c.sb)
	cgPath := s.cgroups.sandboxPath(c.sb.Rec.ID)
	if scope != scopeSandbox {
		ss, e := lookupSession(c.sb, scope)
		if e != nil {
			return nil, e
		}
		sessions = []*session{ss}
		cgPath = s.cgroups.sessionPath(scope)
	}
	// The topology (≤ 512 rows) takes up to about half of the response.
	ws, err := s.readScopes(c.sb, time.Now().UnixMilli()-window, obsMaxRecords/2, seriesBudget(obsMaxRecords/2, 0.5), func(sc string) bool { return sc == scope })
	if err != nil {
		return nil, err
	}
	series := ws[scope].series()
	availability, errs := "available", []string{}
	if len(series) == 0 {
		what := "session"
		if scope == scopeSandbox {
			what = "sandbox"
		}
		availability, errs = "partial", []string{s.noSamples(what, window)}
	}
	out := map[string]any{"view": "cgroup", "scope": scope, "availability": availability, "errors": errs,
		"series": series, "topology": buildTopology("/proc", sessions), "cgroup_delegated": s.cgroups != nil && s.cgroups.delegated}
	if cgPath != "" {
		out["cgroup_path"] = cgPath
	} else {
		out["cgroup_path"] = nil
	}
	return out, nil
}

// snapshotResources is snapshot's resources blocks: {latest, history} for
// the sandbox and each session, from the samples of the last minute.
func (s *Supervisor) snapshotResources(sb *sandbox) (sandboxRes map[string]any, bySession map[string]map[string]any, err error) {
	// The history of every scope shares about half of the response (the
	// rest is the sandbox's other blocks): 30 points each, fewer when a
	// sandbox has many sessions.
	scopes := len(sessionsSorted(sb)) + 1
	per := max(1, min(snapshotHistory, obsMaxRecords/2/scopes))
	ws, err := s.readScopes(sb, time.Now().UnixMilli()-snapshotWindowMs, per, max(obsMaxLine, seriesBudget(per*scopes, 0.5)/scopes),
		func(sc string) bool { return sc != scopeStack })
	if err != nil {
		return nil, nil, err
	}
	block := func(w *sampleWindow) map[string]any {
		ser := w.series()
		var latest any
		if len(ser) > 0 {
			latest = ser[len(ser)-1].Metrics
		}
		return map[string]any{"latest": latest, "history": ser}
	}
	bySession = map[string]map[string]any{}
	for sc, w := range ws {
		if sc != scopeSandbox {
			bySession[sc] = block(w)
		}
	}
	return block(ws[scopeSandbox]), bySession, nil
}

// stackTrend is layerstack's trend: the stack samples of the window.
func (s *Supervisor) stackTrend(sb *sandbox, windowMs int64) ([]seriesPoint, error) {
	ws, err := s.readScopes(sb, time.Now().UnixMilli()-windowMs, obsMaxRecords/2, seriesBudget(obsMaxRecords/2, 0.5), func(sc string) bool { return sc == scopeStack })
	if err != nil {
		return nil, err
	}
	return ws[scopeStack].series(), nil
}
