package obs

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"sync"
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

// feedSub is one subscriber: offer hands it a record without blocking
// (false: its buffer is full), close closes its channel.
type feedSub struct {
	offer func(Record) bool
	close func()
}

// Record is one stored event-log record as the live stream carries it.
type Record struct {
	Seq       uint64
	SandboxID string // "" for the supervisor's own store
	Kind      string // "event" or "span"
	Line      json.RawMessage
}

// sequenced records carry the feed's sequence number.
type sequenced interface{ setSeq(n uint64) }

func (r *spanRecord) setSeq(n uint64)  { r.Seq = n }
func (r *eventRecord) setSeq(n uint64) { r.Seq = n }

// newEventFeed continues the sequence after the highest one found at the
// tail of any event log under data.
func newEventFeed(data string) *eventFeed {
	f := &eventFeed{subs: map[*feedSub]struct{}{}}
	logs, _ := filepath.Glob(filepath.Join(data, "sandboxes", "*", DirName, LogName))
	logs = append(logs, filepath.Join(data, "supervisor", DirName, LogName))
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
	r := Record{Seq: f.seq, SandboxID: sandboxID, Kind: kind, Line: json.RawMessage(bytes.TrimSuffix(line, []byte("\n")))}
	for sub := range f.subs {
		if !sub.offer(r) {
			delete(f.subs, sub)
			sub.close()
		}
	}
}

// Subscribe streams every record stored from now on, converted by conv,
// through a channel buffering buf records; a subscriber that falls behind
// is dropped (its channel closed). The returned func unsubscribes. With
// observability disabled the channel never delivers.
func Subscribe[T any](r *Registry, buf int, conv func(Record) T) (<-chan T, func()) {
	if r == nil || r.feed == nil {
		return make(chan T), func() {}
	}
	f := r.feed
	ch := make(chan T, buf)
	sub := &feedSub{
		offer: func(rec Record) bool {
			select {
			case ch <- conv(rec):
				return true
			default:
				return false
			}
		},
		close: func() { close(ch) },
	}
	f.mu.Lock()
	f.subs[sub] = struct{}{}
	f.mu.Unlock()
	return ch, func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		if _, ok := f.subs[sub]; ok {
			delete(f.subs, sub)
			sub.close()
		}
	}
}

// Replay reads the event logs of scopes for records after `after`,
// keeping the newest maxRecs in sequence order; skipped is how many older
// ones did not fit. A store whose sandbox went away meanwhile is skipped.
func (r *Registry) Replay(ctx context.Context, scopes []Scope, after uint64, maxRecs int) (recs []Record, skipped int, err error) {
	if maxRecs <= 0 {
		return nil, 0, nil
	}
	var out []Record
	for _, sc := range scopes {
		if err := ctx.Err(); err != nil {
			return nil, 0, err
		}
		st := r.Store(sc)
		if st == nil {
			continue
		}
		snap, err := st.Open()
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				continue // the sandbox went away meanwhile
			}
			return nil, 0, fmt.Errorf("replay %s: %w", st.dir, err)
		}
		err = snap.Scan(ctx, func(line []byte) {
			var h struct {
				Kind string `json:"kind"`
				Seq  uint64 `json:"seq"`
			}
			if json.Unmarshal(line, &h) != nil || h.Seq <= after || (h.Kind != "event" && h.Kind != "span") {
				return
			}
			out = append(out, Record{Seq: h.Seq, SandboxID: sc.ID, Kind: h.Kind, Line: json.RawMessage(bytes.Clone(line))})
		})
		snap.Close()
		if err != nil {
			return nil, 0, fmt.Errorf("replay %s: %w", st.dir, err)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Seq < out[j].Seq })
	skipped = max(len(out)-maxRecs, 0)
	return out[skipped:], skipped, nil
}
