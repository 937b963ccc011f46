package obs

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"log/slog"
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
	DirName     = "observability"
	LogName     = "observability.ndjson"
	ResLogName  = "resources.ndjson"
	obsLockName = ".lock"

	// MaxRecords and MaxBytes bound one query response (§10.1).
	MaxRecords = 500
	MaxBytes   = 256 << 10
	// EnvelopeSlack is left of MaxBytes for the response's own keys.
	EnvelopeSlack = 1 << 10
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

// Store is one event log directory.
type Store struct {
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

func (st *Store) half() int64 { return st.maxDisk / 2 }

func (st *Store) Stats() SinkStats {
	if st == nil {
		return SinkStats{}
	}
	return st.counters.stats()
}

func (st *Store) count(f func(*sinkCounters) *atomic.Uint64) {
	f(&st.counters).Add(1)
	if st.total != nil {
		f(st.total).Add(1)
	}
}

func droppedStorage(c *sinkCounters) *atomic.Uint64   { return &c.droppedStorage }
func droppedOversized(c *sinkCounters) *atomic.Uint64 { return &c.droppedOversized }
func truncatedRecords(c *sinkCounters) *atomic.Uint64 { return &c.truncated }

// EncodeLine renders v as one JSON line, newline included.
func EncodeLine(v any) ([]byte, error) {
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
func (st *Store) AppendRecord(rec any, payload *any) {
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
func (st *Store) store(rec any, payload *any) []byte {
	line, err := EncodeLine(rec)
	if err != nil {
		st.count(droppedStorage)
		return nil
	}
	if len(line) > st.maxLine && payload != nil {
		orig, _ := EncodeLine(*payload)
		*payload = map[string]any{"_truncated": max(len(orig)-1, 0)}
		if line, err = EncodeLine(rec); err != nil {
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

func (st *Store) write(line []byte) error {
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

// Snapshot is one consistent read view of a store: both segments opened
// under a shared flock (so no rotation splits them), read after the lock is
// released. Opening creates nothing: a store that was never written has no
// files and yields no records.
type Snapshot struct {
	files []*os.File // oldest first
}

func (st *Store) Open() (*Snapshot, error) {
	snap := &Snapshot{}
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
			snap.Close()
			return nil, err
		}
		snap.files = append(snap.files, f)
	}
	return snap, nil
}

func (sn *Snapshot) Close() {
	for _, f := range sn.files {
		f.Close()
	}
	sn.files = nil
}

// Scan calls fn with every complete line, oldest first. The slice is only
// valid during the call. It may be called again (it rewinds). It stops
// with ctx's error when ctx ends.
func (sn *Snapshot) Scan(ctx context.Context, fn func(line []byte)) error {
	n := 0
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
			if n++; n%1024 == 0 {
				if err := ctx.Err(); err != nil {
					return err
				}
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
	Seq    uint64 `json:"seq"`
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
	if n <= 0 || n > MaxRecords {
		n = MaxRecords
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

// Registry owns every store of the supervisor.
type Registry struct {
	enabled bool
	data    string
	maxDisk int64
	maxLine int
	system  *Store
	total   sinkCounters
	spanSeq atomic.Uint64
	feed    *eventFeed // sequence and live subscribers of every event log
	// resEnabled and resMaxDisk configure the resource stores (§10.1).
	resEnabled bool
	resMaxDisk int64
	resTotal   sinkCounters
	log        *slog.Logger               // every event is also logged; nil: not logged
	newID      func(prefix string) string // mints synthetic trace ids

	mu        sync.Mutex
	stores    map[string]*Store // by sandbox directory
	resStores map[string]*Store // by sandbox directory
}

// Options configure a Registry (observability.* of the configuration).
type Options struct {
	Enabled      bool
	MaxDiskBytes int64
	MaxLineBytes int
	// ResourcesEnabled and ResourcesMaxDiskBytes configure the resource
	// stores (observability.resource_stats).
	ResourcesEnabled      bool
	ResourcesMaxDiskBytes int64
	// Log receives every event; nil logs nothing.
	Log *slog.Logger
	// NewID mints an id with a prefix (the synthetic trace ids); nil
	// makes every synthetic trace id the bare prefix plus a counter.
	NewID func(prefix string) string
}

// Scope names the stores records go to: a sandbox by its ID and directory,
// or (the zero Scope) the supervisor itself.
type Scope struct {
	ID  string
	Dir string
}

// New prepares the stores under data; nothing is created on disk until the
// first append. With Enabled false it returns a disabled registry: no
// store is ever created and every query is empty.
func New(opt Options, data string) *Registry {
	r := &Registry{enabled: opt.Enabled, data: data,
		maxDisk: opt.MaxDiskBytes, maxLine: opt.MaxLineBytes,
		stores: map[string]*Store{}, resStores: map[string]*Store{},
		resEnabled: opt.Enabled && opt.ResourcesEnabled,
		resMaxDisk: opt.ResourcesMaxDiskBytes, log: opt.Log, newID: opt.NewID}
	if r.enabled {
		r.feed = newEventFeed(data)
		r.system = r.newStore(filepath.Join(data, "supervisor", DirName), true, "")
	}
	return r
}

// Enabled reports whether events and spans are recorded.
func (r *Registry) Enabled() bool { return r != nil && r.enabled }

// ResourcesEnabled reports whether resource samples are recorded.
func (r *Registry) ResourcesEnabled() bool { return r != nil && r.resEnabled }

func (r *Registry) newStore(dir string, mkParent bool, sandboxID string) *Store {
	return &Store{dir: dir, name: LogName, maxDisk: r.maxDisk, maxLine: r.maxLine, mkParent: mkParent, total: &r.total,
		feed: r.feed, sandboxID: sandboxID}
}

// Resources returns the resource store of a sandbox (§10.1), nil when
// resource statistics or observability are disabled or sc is the
// supervisor's. Its appends are strict: a sample that does not fit is
// dropped, never truncated.
func (r *Registry) Resources(sc Scope) *Store {
	if r == nil || !r.resEnabled || sc.Dir == "" {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	st := r.resStores[sc.Dir]
	if st == nil {
		st = &Store{dir: filepath.Join(sc.Dir, DirName), name: ResLogName, maxDisk: r.resMaxDisk,
			maxLine: r.maxLine, total: &r.resTotal}
		r.resStores[sc.Dir] = st
	}
	return st
}

// Seal stops every write into a sandbox directory's stores before the
// directory is removed: a write in progress finishes first, every later one
// (a span that ends late, a background event) is dropped. The sealed stores
// stay registered, so no later lookup creates a fresh store that would
// recreate observability/ under a directory being deleted.
func (r *Registry) Seal(dir string) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range []map[string]*Store{r.stores, r.resStores} {
		st := m[dir]
		if st == nil {
			st = &Store{dir: filepath.Join(dir, DirName)}
			m[dir] = st
		}
		st.mu.Lock()
		st.sealed = true
		st.mu.Unlock()
	}
}

// Store returns the event log of sc (the zero Scope: the system store), or
// nil when observability is disabled.
func (r *Registry) Store(sc Scope) *Store {
	if r == nil || !r.enabled {
		return nil
	}
	if sc.Dir == "" {
		return r.system
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	st := r.stores[sc.Dir]
	if st == nil {
		st = r.newStore(filepath.Join(sc.Dir, DirName), false, sc.ID)
		r.stores[sc.Dir] = st
	}
	return st
}

// Totals are the counters of every event log together (health's
// event_store).
func (r *Registry) Totals() SinkStats {
	if r == nil {
		return SinkStats{}
	}
	return r.total.stats()
}
