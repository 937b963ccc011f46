package supervisor

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"
)

// The bounded event/span store of §10.1: per sandbox under
// sandboxes/<id>/observability/ and system-wide under
// supervisor/observability/, an event log observability.ndjson plus one
// rotated observability.ndjson.1. Appends are one JSON line each, written
// with a single write(2) on an O_APPEND descriptor under an exclusive flock
// of the directory's .lock (cross-process) and the store's mutex
// (in-process); rotation happens before an append would push the current
// segment over half of observability.max_disk_bytes. Nothing is cached:
// every read opens the segments, streams them and keeps only the bounded
// result.

const (
	obsDirName  = "observability"
	obsLogName  = "observability.ndjson"
	resLogName  = "resources.ndjson"
	obsLockName = ".lock"

	// obsMaxRecords and obsMaxBytes bound one query response (§10.1).
	obsMaxRecords = 500
	obsMaxBytes   = 256 << 10
	// obsEnvelopeSlack is left of obsMaxBytes for the response's own keys.
	obsEnvelopeSlack = 1 << 10
)

// SinkStats are the drop and truncation counters of a store (§10.1).
type SinkStats struct {
	DroppedStorage   uint64 `json:"dropped_storage"`
	DroppedOversized uint64 `json:"dropped_oversized"`
	TruncatedRecords uint64 `json:"truncated_records"`
}

type sinkCounters struct {
	droppedStorage, droppedOversized, truncated atomic.Uint64
}

func (c *sinkCounters) stats() SinkStats {
	return SinkStats{DroppedStorage: c.droppedStorage.Load(), DroppedOversized: c.droppedOversized.Load(), TruncatedRecords: c.truncated.Load()}
}

// obsStore is one event log directory.
type obsStore struct {
	dir      string
	name     string // segment name: observability.ndjson or resources.ndjson
	maxDisk  int64  // total of both segments
	maxLine  int    // including the newline
	mkParent bool   // create the parent too (system store); a sandbox store never recreates a removed sandbox directory
	mu       sync.Mutex
	sealed   bool // its sandbox is being removed: writes are dropped (seal)
	counters sinkCounters
	total    *sinkCounters // registry-wide totals (health), may be nil
	// feed numbers the records of an event log and streams them (nil for
	// resource stores); sandboxID names the store's sandbox ("" system).
	feed      *eventFeed
	sandboxID string
}

func (st *obsStore) half() int64 { return st.maxDisk / 2 }

func (st *obsStore) stats() SinkStats {
	if st == nil {
		return SinkStats{}
	}
	return st.counters.stats()
}

func (st *obsStore) count(f func(*sinkCounters) *atomic.Uint64) {
	f(&st.counters).Add(1)
	if st.total != nil {
		f(st.total).Add(1)
	}
}

func droppedStorage(c *sinkCounters) *atomic.Uint64   { return &c.droppedStorage }
func droppedOversized(c *sinkCounters) *atomic.Uint64 { return &c.droppedOversized }
func truncatedRecords(c *sinkCounters) *atomic.Uint64 { return &c.truncated }

// encodeLine renders v as one JSON line, newline included.
func encodeLine(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// appendRecord writes one record within the line cap. payload points at the
// record's attrs (or metrics) field: when the line is too long it is replaced
// by {"_truncated":<its original byte length>}; when the line still does not
// fit (or could never fit a segment) the record is dropped. Every failure is
// counted and swallowed: observability never fails a runtime operation.
func (st *obsStore) appendRecord(rec any, payload *any) {
	if st == nil {
		return
	}
	if sq, ok := rec.(sequenced); ok && st.feed != nil {
		st.feed.append(sq, st.sandboxID, recordKind(rec), func() []byte { return st.store(rec, payload) })
		return
	}
	st.store(rec, payload)
}

// recordKind is the kind of an event-log record.
func recordKind(rec any) string {
	if _, ok := rec.(*spanRecord); ok {
		return "span"
	}
	return "event"
}

// store encodes and appends rec; it returns the line written, nil when the
// record was dropped.
func (st *obsStore) store(rec any, payload *any) []byte {
	line, err := encodeLine(rec)
	if err != nil {
		st.count(droppedStorage)
		return nil
	}
	if len(line) > st.maxLine && payload != nil {
		orig, _ := encodeLine(*payload)
		*payload = map[string]any{"_truncated": max(len(orig)-1, 0)}
		if line, err = encodeLine(rec); err != nil {
			st.count(droppedStorage)
			return nil
		}
		if len(line) <= st.maxLine && int64(len(line)) <= st.half() {
			st.count(truncatedRecords)
		}
	}
	if len(line) > st.maxLine || int64(len(line)) > st.half() {
		st.count(droppedOversized)
		return nil
	}
	if err := st.write(line); err != nil {
		st.count(droppedStorage)
		return nil
	}
	return line
}

func (st *obsStore) write(line []byte) error {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.sealed {
		return nil // the sandbox is going away; nothing is lost that anyone could read
	}
	if st.mkParent {
		if err := os.MkdirAll(st.dir, 0o700); err != nil {
			return err
		}
	} else if err := os.Mkdir(st.dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	lock, err := os.OpenFile(filepath.Join(st.dir, obsLockName), os.O_CREATE|os.O_RDWR|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	defer lock.Close()
	if err := flockRetry(int(lock.Fd()), unix.LOCK_EX); err != nil {
		return err
	}
	cur := filepath.Join(st.dir, st.name)
	var size int64
	if fi, err := os.Stat(cur); err == nil {
		size = fi.Size()
	} else if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if size > 0 && size+int64(len(line)) > st.half() {
		if err := os.Rename(cur, cur+".1"); err != nil {
			return err
		}
	}
	f, err := os.OpenFile(cur, os.O_CREATE|os.O_WRONLY|os.O_APPEND|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	_, werr := f.Write(line)
	cerr := f.Close()
	if werr != nil {
		return werr
	}
	return cerr
}

func flockRetry(fd, how int) error {
	for {
		err := unix.Flock(fd, how)
		if err != unix.EINTR {
			return err
		}
	}
}

// obsSnapshot is one consistent read view of a store: both segments opened
// under a shared flock (so no rotation splits them), read after the lock is
// released. Opening creates nothing: a store that was never written has no
// files and yields no records.
type obsSnapshot struct {
	files []*os.File // oldest first
}

func (st *obsStore) open() (*obsSnapshot, error) {
	snap := &obsSnapshot{}
	if st == nil {
		return snap, nil
	}
	lock, err := os.OpenFile(filepath.Join(st.dir, obsLockName), os.O_RDONLY|syscall.O_CLOEXEC, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return snap, nil
	}
	if err != nil {
		return nil, err
	}
	defer lock.Close() // closing releases the shared lock
	if err := flockRetry(int(lock.Fd()), unix.LOCK_SH); err != nil {
		return nil, err
	}
	cur := filepath.Join(st.dir, st.name)
	for _, p := range []string{cur + ".1", cur} {
		f, err := os.Open(p)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			snap.close()
			return nil, err
		}
		snap.files = append(snap.files, f)
	}
	return snap, nil
}

func (sn *obsSnapshot) close() {
	for _, f := range sn.files {
		f.Close()
	}
	sn.files = nil
}

// scan calls fn with every complete line, oldest first. The slice is only
// valid during the call. It may be called again (it rewinds).
func (sn *obsSnapshot) scan(fn func(line []byte)) error {
	for _, f := range sn.files {
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return err
		}
		r := bufio.NewReaderSize(f, 64<<10)
		for {
			line, err := r.ReadSlice('\n')
			if errors.Is(err, bufio.ErrBufferFull) {
				// A line longer than any cap we write: skip it whole.
				for errors.Is(err, bufio.ErrBufferFull) {
					_, err = r.ReadSlice('\n')
				}
				if err == nil {
					continue
				}
			}
			if err == io.EOF {
				break // a torn last line (no newline) is ignored
			}
			if err != nil {
				return err
			}
			if len(line) > 1 {
				fn(line[:len(line)-1])
			}
		}
	}
	return nil
}

// recordHead is the part of a record the queries filter on.
type recordHead struct {
	Kind   string `json:"kind"`
	TS     int64  `json:"ts"`
	Trace  string `json:"trace"`
	Span   string `json:"span"`
	Parent string `json:"parent"`
	Name   string `json:"name"`
	DurMs  int64  `json:"dur_ms"`
}

// recordWindow keeps the newest records within a count and a byte budget,
// dropping the oldest first.
type recordWindow struct {
	max, maxBytes int
	bytes         int
	recs          []json.RawMessage
	heads         []recordHead
}

// newRecordWindow keeps at most n records (0 or above the cap: 500) within
// maxBytes of record text.
func newRecordWindow(n, maxBytes int) *recordWindow {
	if n <= 0 || n > obsMaxRecords {
		n = obsMaxRecords
	}
	return &recordWindow{max: n, maxBytes: maxBytes}
}

func (w *recordWindow) add(h recordHead, line []byte) {
	if len(line)+1 > w.maxBytes {
		return
	}
	w.recs = append(w.recs, json.RawMessage(bytes.Clone(line)))
	w.heads = append(w.heads, h)
	w.bytes += len(line) + 1
	for len(w.recs) > w.max || w.bytes > w.maxBytes {
		w.bytes -= len(w.recs[0]) + 1
		w.recs, w.heads = w.recs[1:], w.heads[1:]
	}
}

// obsRegistry owns every store of the supervisor.
type obsRegistry struct {
	enabled bool
	data    string
	maxDisk int64
	maxLine int
	system  *obsStore
	total   sinkCounters
	spanSeq atomic.Uint64
	feed    *eventFeed // sequence and live subscribers of every event log
	// resEnabled and resMaxDisk configure the resource stores (§10.1).
	resEnabled bool
	resMaxDisk int64
	resTotal   sinkCounters

	mu        sync.Mutex
	stores    map[string]*obsStore // by sandbox directory
	resStores map[string]*obsStore // by sandbox directory
}

// newObsRegistry prepares the stores; nothing is created on disk until the
// first append. With observability.enabled:false it returns a disabled
// registry: no store is ever created and every query is empty.
func newObsRegistry(cfg *Config, data string) *obsRegistry {
	r := &obsRegistry{enabled: cfg.Observability.Enabled, data: data,
		maxDisk: int64(cfg.Observability.MaxDiskBytes), maxLine: cfg.Observability.MaxLineBytes,
		stores: map[string]*obsStore{}, resStores: map[string]*obsStore{},
		resEnabled: cfg.Observability.Enabled && cfg.Observability.ResourceStats.Enabled,
		resMaxDisk: int64(cfg.Observability.ResourceStats.MaxDiskBytes)}
	if r.enabled {
		r.feed = newEventFeed(data)
		r.system = r.newStore(filepath.Join(data, "supervisor", obsDirName), true, "")
	}
	return r
}

func (r *obsRegistry) newStore(dir string, mkParent bool, sandboxID string) *obsStore {
	return &obsStore{dir: dir, name: obsLogName, maxDisk: r.maxDisk, maxLine: r.maxLine, mkParent: mkParent, total: &r.total,
		feed: r.feed, sandboxID: sandboxID}
}

// resources returns the resource store of sb (§10.1), nil when resource
// statistics or observability are disabled. Its appends are strict: a
// sample that does not fit is dropped, never truncated.
func (r *obsRegistry) resources(sb *sandbox) *obsStore {
	if r == nil || !r.resEnabled || sb == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	st := r.resStores[sb.Dir]
	if st == nil {
		st = &obsStore{dir: filepath.Join(sb.Dir, obsDirName), name: resLogName, maxDisk: r.resMaxDisk,
			maxLine: r.maxLine, total: &r.resTotal}
		r.resStores[sb.Dir] = st
	}
	return st
}

// seal stops every write into a sandbox directory's stores before the
// directory is removed: a write in progress finishes first, every later one
// (a span that ends late, a background event) is dropped. The sealed stores
// stay registered, so no later lookup creates a fresh store that would
// recreate observability/ under a directory being deleted.
func (r *obsRegistry) seal(dir string) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range []map[string]*obsStore{r.stores, r.resStores} {
		st := m[dir]
		if st == nil {
			st = &obsStore{dir: filepath.Join(dir, obsDirName)}
			m[dir] = st
		}
		st.mu.Lock()
		st.sealed = true
		st.mu.Unlock()
	}
}

// store returns the store of sb (nil: the system store), or nil when
// observability is disabled.
func (r *obsRegistry) store(sb *sandbox) *obsStore {
	if r == nil || !r.enabled {
		return nil
	}
	if sb == nil {
		return r.system
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	st := r.stores[sb.Dir]
	if st == nil {
		st = r.newStore(filepath.Join(sb.Dir, obsDirName), false, sb.Rec.ID)
		r.stores[sb.Dir] = st
	}
	return st
}

// obsStats returns the counters of sb's store, or with sb nil the totals of
// every store (health's event_store).
func (s *Supervisor) obsStats(sb *sandbox) SinkStats {
	if s.obs == nil {
		return SinkStats{}
	}
	if sb == nil {
		return s.obs.total.stats()
	}
	return s.obs.store(sb).stats()
}
