package workspace

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// Transcript file format (§6.7): one line per row,
// "[2006-01-02T15:04:05.000Z] " + row bytes + "\n". Rows never contain '\n'
// or '\r'. Row bytes are the PTY bytes as received: invalid UTF-8 is kept as
// is (encoding/json later shows each invalid byte as U+FFFD, and tokenCount
// counts each as one character, so both agree with what clients see).
//
// When the file cannot be written (a full disk), recording goes on in
// memory: the rows not yet written stay buffered and later rows join them,
// the newest WindowBytes' worth kept, so responses still carry the output.
// Err reports the failure; command outputs then say transcript_lost with the
// reason (commands.go). Rows held only in memory vanish with the process.
//
// After the MaxBytes cap has discarded rows, the number of the file's first
// row is kept in the sidecar "<path>.first" so that row numbers survive a
// reopen. A rotation writes "<path>.new" and "<path>.first.new", then renames
// them in that order; openTranscript rolls an interrupted rotation back (the
// ".new" transcript still exists) or forward (only ".first.new" is left).

const (
	tsLayout  = "2006-01-02T15:04:05.000Z"
	prefixLen = len("[" + tsLayout + "] ")

	defaultTranscriptMaxBytes    = 64 << 20
	defaultTranscriptWindowBytes = 1 << 20
	defaultIdleCommit            = 100 * time.Millisecond
	transcriptFlushBytes         = 64 << 10
)

// transcriptOptions configure a transcript; zero values take the defaults
// (64 MiB, 1 MiB, 100 ms, time.Now).
type TranscriptOptions struct {
	MaxBytes    int64         // runtime.command.max_transcript_bytes: beyond it the oldest half of the file is discarded
	WindowBytes int64         // runtime.command.max_transcript_window_bytes: responses carry only rows inside the last WindowBytes of the file
	IdleCommit  time.Duration // a partial line idle this long is committed as its own row
	Now         func() time.Time
}

func (o TranscriptOptions) withDefaults() TranscriptOptions {
	if o.MaxBytes <= 0 {
		o.MaxBytes = defaultTranscriptMaxBytes
	}
	if o.MaxBytes > math.MaxUint32 { // row offsets are uint32
		o.MaxBytes = math.MaxUint32
	}
	if o.WindowBytes <= 0 {
		o.WindowBytes = defaultTranscriptWindowBytes
	}
	if o.IdleCommit <= 0 {
		o.IdleCommit = defaultIdleCommit
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return o
}

// transcript turns a command's raw PTY output into rows (§6.3) and keeps them
// in commands/<id>/transcript.log, one row per line prefixed
// "[YYYY-MM-DDTHH:MM:SS.mmmZ] ". All methods are safe for concurrent use.
// Rows stay readable after Close (each read then opens the file briefly, so a
// terminal transcript holds no descriptor).
type Transcript struct {
	path   string
	opt    TranscriptOptions
	rowCap int // longest row in bytes; longer lines are split like an idle commit

	mu     sync.Mutex
	f      *os.File // nil once closed, and for reopened transcripts
	err    error    // first write error; later rows are kept in buf only
	first  int      // row number of the file's first line
	starts []uint32 // file offset of each retained row (4 bytes per row)
	size   int64    // bytes of the file covered by starts

	// Rows committed but not yet written: encoded lines in buf, their
	// offsets already appended to starts (the last bufRows entries), as if
	// buf followed the file's first size bytes. After a write error buf
	// holds every row recorded since, bounded by memCap.
	buf     []byte
	bufRows int

	// Partial line state.
	line      []byte    // pending row, after bare-\r collapsing
	cr        bool      // line was followed by a '\r' not yet known to be bare
	absorb    bool      // the previous row was cut (idle or length): a terminator right now ends it, not a new empty row
	lastWrite time.Time // when the last byte arrived

	timer *time.Timer
	armed bool

	// notify is closed (and forgotten) at the next committed row or at
	// Close: live followers (the HTTP transcript stream) wait on it.
	notify chan struct{}
}

// changed returns a channel closed when a row is committed after this
// call, or when the transcript is closed.
func (t *Transcript) Changed() <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.notify == nil {
		t.notify = make(chan struct{})
	}
	return t.notify
}

// wake releases the followers; t.mu is held.
func (t *Transcript) wake() {
	if t.notify != nil {
		close(t.notify)
		t.notify = nil
	}
}

func newTranscriptStruct(path string, opt TranscriptOptions) *Transcript {
	opt = opt.withDefaults()
	rowCap := int(min(opt.WindowBytes, opt.MaxBytes/2)) - prefixLen - 1
	if rowCap < utf8.UTFMax {
		rowCap = utf8.UTFMax
	}
	return &Transcript{path: path, opt: opt, rowCap: rowCap}
}

// newTranscript creates (or truncates) the transcript file at path.
func NewTranscript(path string, opt TranscriptOptions) (*Transcript, error) {
	t := newTranscriptStruct(path, opt)
	for _, p := range []string{path + ".first", path + ".new", path + ".first.new"} {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, err
	}
	t.f = f
	return t, nil
}

// openTranscript reopens a transcript written earlier (a terminal command
// after a supervisor restart) read-only, rebuilding the row index from the
// file. A last line without its newline counts as a row.
func OpenTranscript(path string, opt TranscriptOptions) (*Transcript, error) {
	t := newTranscriptStruct(path, opt)
	if err := recoverRotation(path); err != nil {
		return nil, err
	}
	if b, err := os.ReadFile(path + ".first"); err == nil {
		n, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || n < 0 {
			return nil, fmt.Errorf("transcript %s: bad first-row file %q", path, b)
		}
		t.first = n
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	chunk := make([]byte, 64<<10)
	inRow := false
	for {
		n, err := f.Read(chunk)
		for c := chunk[:n]; len(c) > 0; {
			if !inRow {
				if t.size > math.MaxUint32 {
					return nil, fmt.Errorf("transcript %s: too large to index", path)
				}
				t.starts = append(t.starts, uint32(t.size))
				inRow = true
			}
			i := bytes.IndexByte(c, '\n')
			if i < 0 {
				t.size += int64(len(c))
				break
			}
			t.size += int64(i + 1)
			c = c[i+1:]
			inRow = false
		}
		if err == io.EOF {
			return t, nil
		}
		if err != nil {
			return nil, err
		}
	}
}

// recoverRotation finishes or undoes a rotation interrupted by a crash.
func recoverRotation(path string) error {
	if _, err := os.Stat(path + ".new"); err == nil {
		// The transcript was not replaced yet: roll back.
		for _, p := range []string{path + ".new", path + ".first.new"} {
			if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
				return err
			}
		}
		return nil
	}
	if _, err := os.Stat(path + ".first.new"); err == nil {
		return os.Rename(path+".first.new", path+".first") // roll forward
	}
	return nil
}

// Write feeds raw PTY bytes in any chunking. It always consumes p; after a
// file error it keeps returning that error and records into memory only.
func (t *Transcript) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.f == nil {
		return 0, os.ErrClosed
	}
	now := t.opt.Now()
	t.feed(p, now)
	t.lastWrite = now
	t.flush()
	if len(t.line) > 0 && !t.armed {
		t.arm(t.opt.IdleCommit)
	}
	return len(p), t.err
}

// feed applies the row rules of §6.3 to p.
func (t *Transcript) feed(p []byte, now time.Time) {
	for len(p) > 0 {
		if t.cr {
			t.cr = false
			if p[0] == '\n' { // "\r\n", possibly split across writes
				t.terminate(now)
				p = p[1:]
				continue
			}
			t.line = t.line[:0] // bare '\r': discard the text before it
		}
		i := bytes.IndexAny(p, "\r\n")
		if i < 0 {
			t.appendText(p, now)
			return
		}
		t.appendText(p[:i], now)
		if p[i] == '\r' {
			t.cr = true
		} else {
			t.terminate(now)
		}
		p = p[i+1:]
	}
}

func (t *Transcript) appendText(b []byte, now time.Time) {
	for len(b) > 0 {
		t.absorb = false
		room := t.rowCap - len(t.line)
		if len(b) <= room {
			t.line = append(t.line, b...)
			return
		}
		t.line = append(t.line, b[:room]...)
		b = b[room:]
		t.cut(now)
	}
}

// terminate ends the pending row at a line terminator.
func (t *Transcript) terminate(now time.Time) {
	if t.absorb && len(t.line) == 0 {
		t.absorb = false // the row was already committed by a cut
		return
	}
	t.commit(t.line, now)
	t.line = t.line[:0]
	t.absorb = false
}

// cut commits the pending partial line as its own row (idle or too long),
// holding back an incomplete trailing UTF-8 sequence for the next row.
func (t *Transcript) cut(ts time.Time) {
	keep := incompleteUTF8Tail(t.line)
	if len(t.line) == keep {
		return
	}
	t.commit(t.line[:len(t.line)-keep], ts)
	t.line = t.line[:copy(t.line, t.line[len(t.line)-keep:])]
	t.cr = false // a trailing '\r' belongs to the committed row
	t.absorb = len(t.line) == 0
}

// incompleteUTF8Tail returns the length of a trailing sequence that is the
// start of a valid UTF-8 encoding still missing bytes.
func incompleteUTF8Tail(b []byte) int {
	for i := 1; i < utf8.UTFMax && i <= len(b); i++ {
		if utf8.RuneStart(b[len(b)-i]) {
			if utf8.FullRune(b[len(b)-i:]) {
				return 0
			}
			return i
		}
	}
	return 0
}

// commit appends one row to the write buffer, rotating the file first when
// the row would take it past MaxBytes (or, once the file failed, making
// room in memory).
func (t *Transcript) commit(row []byte, ts time.Time) {
	n := int64(prefixLen + len(row) + 1)
	if t.err == nil && t.size+int64(len(t.buf))+n > t.opt.MaxBytes {
		t.flush()
		t.rotate()
	}
	if t.err != nil && int64(len(t.buf))+n > t.memCap() {
		t.shed(n)
	}
	t.starts = append(t.starts, uint32(t.size+int64(len(t.buf))))
	t.bufRows++
	t.buf = append(t.buf, '[')
	t.buf = ts.UTC().AppendFormat(t.buf, tsLayout)
	t.buf = append(t.buf, "] "...)
	t.buf = append(t.buf, row...)
	t.buf = append(t.buf, '\n')
	if len(t.buf) >= transcriptFlushBytes {
		t.flush()
	}
	t.wake()
}

// memCap bounds the rows held in memory after a write error: what one
// response can carry (no row is longer, see rowCap).
func (t *Transcript) memCap() int64 {
	return min(t.opt.WindowBytes, t.opt.MaxBytes/2)
}

// shed makes room for a row of need bytes in memory: the rows in the file
// go first (they lie before the newest WindowBytes anyway), then the oldest
// rows in memory; both count as discarded from then on, like a rotation.
func (t *Transcript) shed(need int64) {
	fileRows := len(t.starts) - t.bufRows
	k, cut := fileRows, int64(0) // rows dropped, bytes of buf dropped
	for k < len(t.starts) && int64(len(t.buf))-cut+need > t.memCap() {
		k++
		cut = int64(len(t.buf))
		if k < len(t.starts) {
			cut = int64(t.starts[k]) - t.size
		}
	}
	base := t.size + cut
	t.starts = t.starts[:copy(t.starts, t.starts[k:])]
	for i := range t.starts {
		t.starts[i] -= uint32(base)
	}
	t.buf = t.buf[:copy(t.buf, t.buf[cut:])]
	t.bufRows -= k - fileRows
	t.first += k
	t.size = 0 // nothing is read from the file any more
}

// flush writes the buffered rows. On failure they stay in buf (and in the
// index): from then on the transcript lives in memory.
func (t *Transcript) flush() {
	if len(t.buf) == 0 || t.err != nil {
		return
	}
	if _, err := t.f.WriteAt(t.buf, t.size); err != nil {
		t.err = fmt.Errorf("write transcript: %w", err)
		return
	}
	t.size += int64(len(t.buf))
	t.buf, t.bufRows = t.buf[:0], 0
}

// Err is the error that stopped the transcript file, nil while every row
// is stored.
func (t *Transcript) Err() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.err
}

// rotate keeps the rows inside the newest MaxBytes/2 bytes of the file
// (temp file + rename); row numbers stay, the first retained row moves on.
func (t *Transcript) rotate() {
	if t.err != nil {
		return
	}
	half := t.opt.MaxBytes / 2
	k := sort.Search(len(t.starts), func(i int) bool { return t.size-int64(t.starts[i]) <= half })
	off := t.size
	if k < len(t.starts) {
		off = int64(t.starts[k])
	}
	nf, err := t.writeRotated(off, t.first+k)
	if err != nil {
		os.Remove(t.path + ".new")
		os.Remove(t.path + ".first.new")
		t.err = fmt.Errorf("rotate transcript: %w", err)
		return
	}
	t.f.Close()
	t.f = nf
	n := copy(t.starts, t.starts[k:])
	t.starts = t.starts[:n]
	for i := range t.starts {
		t.starts[i] -= uint32(off)
	}
	t.first += k
	t.size -= off
}

func (t *Transcript) writeRotated(off int64, first int) (*os.File, error) {
	nf, err := os.OpenFile(t.path+".new", os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			nf.Close()
		}
	}()
	if _, err := io.Copy(nf, io.NewSectionReader(t.f, off, t.size-off)); err != nil {
		return nil, err
	}
	if err := nf.Sync(); err != nil {
		return nil, err
	}
	if err := writeFileSync(t.path+".first.new", []byte(strconv.Itoa(first)+"\n")); err != nil {
		return nil, err
	}
	if err := os.Rename(t.path+".new", t.path); err != nil { // commit point
		return nil, err
	}
	ok = true
	// On failure the ".first.new" left behind is rolled forward by openTranscript.
	_ = os.Rename(t.path+".first.new", t.path+".first")
	return nf, nil
}

func writeFileSync(path string, b []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// arm schedules an idle check; the timer goroutine calls onIdle.
func (t *Transcript) arm(d time.Duration) {
	t.armed = true
	if t.timer == nil {
		t.timer = time.AfterFunc(d, t.onIdle)
	} else {
		t.timer.Reset(d)
	}
}

func (t *Transcript) onIdle() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.armed = false
	if t.f == nil {
		return
	}
	if wait := t.tickLocked(t.opt.Now()); wait > 0 {
		t.arm(max(wait, time.Millisecond))
	}
}

// tick commits the pending partial line if it has been idle for IdleCommit
// at now (the idle timer calls it; tests call it with a fake clock).
func (t *Transcript) tick(now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.f != nil {
		t.tickLocked(now)
	}
}

// tickLocked returns how much longer the pending line must stay idle, or 0.
func (t *Transcript) tickLocked(now time.Time) time.Duration {
	if len(t.line) == 0 {
		return 0
	}
	if idle := now.Sub(t.lastWrite); idle < t.opt.IdleCommit {
		return t.opt.IdleCommit - idle
	}
	t.cut(t.lastWrite)
	t.flush()
	return 0
}

// Close commits a pending partial row, stops the idle timer and closes the
// file. The transcript stays readable; further writes fail.
func (t *Transcript) Close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.f == nil {
		return nil
	}
	if t.timer != nil {
		t.timer.Stop()
		t.armed = false
	}
	if len(t.line) > 0 {
		t.commit(t.line, t.lastWrite)
		t.line = nil
	}
	t.flush()
	err := t.f.Close()
	t.f = nil
	t.wake()
	if t.err != nil {
		return t.err
	}
	return err
}

// Total returns the number of rows recorded so far.
func (t *Transcript) Total() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.first + len(t.starts)
}

// Rows returns rows [start, start+limit) clamped to what is retained: a start
// before the first available row (discarded by the MaxBytes cap, or outside
// the last WindowBytes of the file) begins at that row, and truncatedBefore
// counts the requested rows skipped (first - start). A start past the end
// gives first == end == Total(). On a read error no rows are returned.
func (t *Transcript) Rows(start, limit int) (rows []string, first, end, truncatedBefore int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.rowsLocked(start, limit)
}

// Since returns the rows from cursor to the current end, bounded by
// WindowBytes like Rows.
func (t *Transcript) Since(cursor int) (rows []string, first, end, truncatedBefore int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.rowsLocked(cursor, math.MaxInt)
}

func (t *Transcript) rowsLocked(start, limit int) (rows []string, first, end, truncatedBefore int) {
	total := t.first + len(t.starts)
	// First row inside the last WindowBytes of the file (and memory).
	size := t.size + int64(len(t.buf))
	lo := t.first + sort.Search(len(t.starts), func(i int) bool {
		return size-int64(t.starts[i]) <= t.opt.WindowBytes
	})
	first = min(max(start, 0), total)
	if first < lo {
		truncatedBefore, first = lo-first, lo
	}
	end = first + min(max(limit, 0), total-first)
	if first == end {
		return []string{}, first, end, truncatedBefore
	}
	rows, err := t.read(first-t.first, end-t.first)
	if err != nil {
		return []string{}, first, first, truncatedBefore
	}
	return rows, first, end, truncatedBefore
}

// read returns the retained rows with indexes [i, j) into starts: from the
// file, and from buf for rows not written (after a write error).
func (t *Transcript) read(i, j int) ([]string, error) {
	off := int64(t.starts[i])
	stop := t.size + int64(len(t.buf))
	if j < len(t.starts) {
		stop = int64(t.starts[j])
	}
	b := make([]byte, stop-off)
	if off < t.size {
		f := t.f
		if f == nil {
			var err error
			if f, err = os.Open(t.path); err != nil {
				return nil, err
			}
			defer f.Close()
		}
		if _, err := f.ReadAt(b[:min(stop, t.size)-off], off); err != nil {
			return nil, err
		}
	}
	if stop > t.size {
		from := max(off, t.size)
		copy(b[from-off:], t.buf[from-t.size:stop-t.size])
	}
	s := string(b)
	rows := make([]string, 0, j-i)
	for k := i; k < j; k++ {
		a, z := int64(t.starts[k])-off, stop-off
		if k+1 < j {
			z = int64(t.starts[k+1]) - off
		}
		rows = append(rows, stripPrefix(strings.TrimSuffix(s[a:z], "\n")))
	}
	return rows, nil
}

// stripPrefix removes the "[YYYY-MM-DDTHH:MM:SS.mmmZ] " prefix of a line.
func stripPrefix(line string) string {
	if len(line) >= prefixLen && line[0] == '[' && line[11] == 'T' && line[24] == 'Z' && line[25] == ']' && line[26] == ' ' {
		return line[prefixLen:]
	}
	return line
}

// tokenCount is ceil(characters / 4), characters being runes (an invalid
// UTF-8 byte counts as one).
func TokenCount(s string) int {
	return (utf8.RuneCountInString(s) + 3) / 4
}
