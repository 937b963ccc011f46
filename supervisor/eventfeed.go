package supervisor

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"sync"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/web"
)

// eventFeed numbers the records of every event log (spans and events) with
// one supervisor-wide sequence, stored in the record as "seq", and hands
// each stored record to the live subscribers (the HTTP event stream).
//
// Numbering, writing and handing out happen under one mutex, so a store's
// file and the live stream are both in sequence order and a client that
// resumes after sequence N (Last-Event-ID) gets exactly what came after N:
// replayed from disk, then live. The sequence continues after a restart
// from the highest one on disk. Subscribers get bounded buffers: one that
// falls behind is dropped (its channel closed), never waited for.
type eventFeed struct {
	mu   sync.Mutex
	seq  uint64
	subs map[*feedSub]struct{}
}

type feedSub struct {
	ch chan web.Record
}

// sequenced records carry the feed's sequence number.
type sequenced interface{ setSeq(n uint64) }

func (r *spanRecord) setSeq(n uint64)  { r.Seq = n }
func (r *eventRecord) setSeq(n uint64) { r.Seq = n }

// newEventFeed continues the sequence after the highest one found at the
// tail of any event log under data.
func newEventFeed(data string) *eventFeed {
	f := &eventFeed{subs: map[*feedSub]struct{}{}}
	logs, _ := filepath.Glob(filepath.Join(data, "sandboxes", "*", obsDirName, obsLogName))
	logs = append(logs, filepath.Join(data, "supervisor", obsDirName, obsLogName))
	for _, p := range logs {
		for _, seg := range []string{p, p + ".1"} {
			f.seq = max(f.seq, tailSeq(seg))
		}
	}
	return f
}

// tailSeq is the highest "seq" among the last complete lines of a segment
// (records are appended in sequence order, and a line is at most
// max_line_bytes, so the tail holds the newest).
func tailSeq(p string) uint64 {
	fh, err := os.Open(p)
	if err != nil {
		return 0
	}
	defer fh.Close()
	const tail = 64 << 10
	st, err := fh.Stat()
	if err != nil {
		return 0
	}
	off := max(st.Size()-tail, 0)
	buf := make([]byte, st.Size()-off)
	if _, err := fh.ReadAt(buf, off); err != nil && !errors.Is(err, io.EOF) {
		return 0
	}
	var best uint64
	for line := range bytes.SplitSeq(buf, []byte("\n")) {
		var h struct {
			Seq uint64 `json:"seq"`
		}
		if json.Unmarshal(line, &h) == nil {
			best = max(best, h.Seq)
		}
	}
	return best
}

// append numbers rec, lets write store it and, when stored, hands it to the
// subscribers. write returns the stored line (nil: dropped, which uses up
// no number).
func (f *eventFeed) append(rec sequenced, sandboxID, kind string, write func() []byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	rec.setSeq(f.seq + 1)
	line := write()
	if line == nil {
		return
	}
	f.seq++
	if len(f.subs) == 0 {
		return
	}
	r := web.Record{Seq: f.seq, SandboxID: sandboxID, Kind: kind, Line: json.RawMessage(bytes.TrimSuffix(line, []byte("\n")))}
	for sub := range f.subs {
		select {
		case sub.ch <- r:
		default:
			delete(f.subs, sub)
			close(sub.ch)
		}
	}
}

func (f *eventFeed) subscribe(buf int) (<-chan web.Record, func()) {
	sub := &feedSub{ch: make(chan web.Record, buf)}
	f.mu.Lock()
	f.subs[sub] = struct{}{}
	f.mu.Unlock()
	return sub.ch, func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		if _, ok := f.subs[sub]; ok {
			delete(f.subs, sub)
			close(sub.ch)
		}
	}
}

// webEvents is the event store as the HTTP stream sees it.
type webEvents struct{ s *Supervisor }

func (e webEvents) Subscribe(buf int) (<-chan web.Record, func()) {
	if e.s.obs == nil || e.s.obs.feed == nil {
		ch := make(chan web.Record)
		return ch, func() {}
	}
	return e.s.obs.feed.subscribe(buf)
}

// Replay reads the event logs (every sandbox's and the supervisor's, or one
// sandbox's) for records after `after`, keeping the newest max.
func (e webEvents) Replay(sandboxID string, after uint64, maxRecs int) ([]web.Record, int, error) {
	s := e.s
	type src struct {
		id string
		st *obsStore
	}
	var srcs []src
	s.mu.Lock()
	if sandboxID != "" {
		sb := s.sandboxes.Get(sandboxID)
		if sb == nil {
			s.mu.Unlock()
			return nil, 0, catalog.Errorf(catalog.NotFound, "sandbox not found: %s", sandboxID).With("sandbox_id", sandboxID)
		}
		srcs = append(srcs, src{sandboxID, s.obs.store(sb)})
	} else {
		srcs = append(srcs, src{"", s.obs.store(nil)})
		for id, sb := range s.sandboxes.All() {
			srcs = append(srcs, src{id, s.obs.store(sb)})
		}
	}
	s.mu.Unlock()
	if maxRecs <= 0 {
		return nil, 0, nil
	}
	var out []web.Record
	for _, sr := range srcs {
		if sr.st == nil {
			continue
		}
		snap, err := sr.st.open()
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				continue // the sandbox went away meanwhile
			}
			return nil, 0, err
		}
		err = snap.scan(func(line []byte) {
			var h struct {
				Kind string `json:"kind"`
				Seq  uint64 `json:"seq"`
			}
			if json.Unmarshal(line, &h) != nil || h.Seq <= after || (h.Kind != "event" && h.Kind != "span") {
				return
			}
			out = append(out, web.Record{Seq: h.Seq, SandboxID: sr.id, Kind: h.Kind, Line: json.RawMessage(bytes.Clone(line))})
		})
		snap.close()
		if err != nil {
			return nil, 0, err
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Seq < out[j].Seq })
	skipped := max(len(out)-maxRecs, 0)
	return out[skipped:], skipped, nil
}
