package fuseoverlay

import (
	"sync"
	"time"
)

// recorder buffers provenance records in operation order. A write run (a
// contiguous range written through one handle) owns one slot in the buffer
// that later contiguous writes extend in place, so coalescing keeps order.
// A nil *recorder records nothing (Options.Sink nil): every method is a
// cheap no-op then.
type recorder struct {
	sink func([]Record)

	sinkMu sync.Mutex // serializes Sink calls so batches arrive in order
	mu     sync.Mutex
	buf    []Record
	gen    uint64 // bumped at every flush: runs from older generations are closed
}

// run is the open write range of one handle.
type run struct {
	gen  uint64
	idx  int
	next int64 // offset right after the range
	ok   bool
}

func newRecorder(sink func([]Record)) *recorder {
	if sink == nil {
		return nil
	}
	return &recorder{sink: sink}
}

// op appends a non-write record.
func (r *recorder) op(rec Record) {
	if r == nil {
		return
	}
	rec.Time = time.Now()
	r.mu.Lock()
	r.buf = append(r.buf, rec)
	r.mu.Unlock()
}

// add appends a record that has its time already.
func (r *recorder) add(rec Record) {
	if r == nil {
		return
	}
	r.mu.Lock()
	r.buf = append(r.buf, rec)
	r.mu.Unlock()
}

// write records n bytes at off through the handle whose run is ru.
func (r *recorder) write(ru *run, command, path string, off, n int64) {
	if r == nil || n <= 0 {
		return
	}
	r.mu.Lock()
	if ru.ok && ru.gen == r.gen && ru.next == off && ru.idx < len(r.buf) &&
		r.buf[ru.idx].Command == command && r.buf[ru.idx].Path == path {
		r.buf[ru.idx].Length += n
		ru.next = off + n
		r.mu.Unlock()
		return
	}
	r.buf = append(r.buf, Record{Time: time.Now(), Command: command, Op: "write", Path: path, Offset: off, Length: n})
	*ru = run{gen: r.gen, idx: len(r.buf) - 1, next: off + n, ok: true}
	r.mu.Unlock()
}

// flush passes the buffered records to the sink.
func (r *recorder) flush() {
	if r == nil {
		return
	}
	r.sinkMu.Lock()
	defer r.sinkMu.Unlock()
	r.mu.Lock()
	batch := r.buf
	r.buf = nil
	r.gen++
	r.mu.Unlock()
	if len(batch) > 0 {
		r.sink(batch)
	}
}

// loop flushes every interval until stop is closed.
func (r *recorder) loop(interval time.Duration, stop <-chan struct{}) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			r.mu.Lock()
			empty := len(r.buf) == 0
			r.mu.Unlock()
			if !empty {
				r.flush()
			}
		}
	}
}
