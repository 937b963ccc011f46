package workspace

import (
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeClock is a manual clock; with IdleCommit = time.Hour the real idle
// timer never fires during a test and idle commits happen only via tick.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) advance(d time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	return c.now
}

const idleStep = "\x00IDLE" // a step that lets the pending line go idle

func newTestTranscript(t *testing.T, opt TranscriptOptions) (*Transcript, *fakeClock, string) {
	t.Helper()
	clk := &fakeClock{now: time.Date(2024, 3, 5, 6, 7, 8, 9e6, time.UTC)}
	if opt.IdleCommit == 0 {
		opt.IdleCommit = time.Hour
	}
	if opt.Now == nil {
		opt.Now = clk.Now
	}
	path := filepath.Join(t.TempDir(), "transcript.log")
	tr, err := NewTranscript(path, opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	return tr, clk, path
}

func feedSteps(t *testing.T, tr *Transcript, clk *fakeClock, steps []string) {
	t.Helper()
	for _, s := range steps {
		if s == idleStep {
			tr.tick(clk.advance(tr.opt.IdleCommit))
			continue
		}
		clk.advance(time.Millisecond)
		if n, err := tr.Write([]byte(s)); err != nil || n != len(s) {
			t.Fatalf("Write(%q) = %d, %v", s, n, err)
		}
	}
}

func allRows(tr *Transcript) []string {
	rows, _, _, _ := tr.Rows(0, 1<<30)
	return rows
}

func TestTranscriptSplitting(t *testing.T) {
	cases := []struct {
		name  string
		steps []string
		want  []string // rows before Close
		final []string // rows after Close, when different
	}{
		{"lf", []string{"a\nb\n"}, []string{"a", "b"}, nil},
		{"crlf then idle", []string{"a\r\nb", idleStep}, []string{"a", "b"}, nil},
		{"crlf split across writes", []string{"a\r", "\nb\r", "\n"}, []string{"a", "b"}, nil},
		{"progress bar", []string{"10%\r20%\r30%\n"}, []string{"30%"}, nil},
		{"progress bar across writes", []string{"10%\r", "20%\r", "30%\r\n"}, []string{"30%"}, nil},
		{"bare cr then idle", []string{"abc\rxy", idleStep}, []string{"xy"}, nil},
		{"escape sequences", []string{"\x1b[31mred\x1b[0m\n\x1b[2K\x1b[1Gdone\n"}, []string{"\x1b[31mred\x1b[0m", "\x1b[2K\x1b[1Gdone"}, nil},
		{"prompt idle then continuation", []string{"Password: ", idleStep, "x\n"}, []string{"Password: ", "x"}, nil},
		{"terminator right after idle commit is absorbed", []string{"Password: ", idleStep, "\r\n", "ok\n"}, []string{"Password: ", "ok"}, nil},
		{"idle with pending cr", []string{"50%\r", idleStep, "\n"}, []string{"50%"}, nil},
		{"idle with pending cr then text", []string{"50%\r", idleStep, "60%\n"}, []string{"50%", "60%"}, nil},
		{"no idle commit without output", []string{"a\n", idleStep, idleStep}, []string{"a"}, nil},
		{"empty lines kept", []string{"a\n\n\r\n\nb\n"}, []string{"a", "", "", "", "b"}, nil},
		{"utf8 split across writes", []string{"h\xc3", "\xa9llo \xe2\x82", "\xac\n"}, []string{"héllo €"}, nil},
		{"utf8 incomplete tail held at idle", []string{"a\xf0\x9f", idleStep, "\x98\x80b\n"}, []string{"a", "😀b"}, nil},
		{"invalid utf8 kept as is", []string{"a\xffb\n"}, []string{"a\xffb"}, nil},
		{"partial line without idle", []string{"abc"}, []string{}, []string{"abc"}},
		{"close commits partial", []string{"x\ny\rz"}, []string{"x"}, []string{"x", "z"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tr, clk, path := newTestTranscript(t, TranscriptOptions{})
			feedSteps(t, tr, clk, tc.steps)
			if got := allRows(tr); !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("rows = %q, want %q", got, tc.want)
			}
			if tr.Total() != len(tc.want) {
				t.Fatalf("Total = %d, want %d", tr.Total(), len(tc.want))
			}
			if err := tr.Close(); err != nil {
				t.Fatal(err)
			}
			final := tc.final
			if final == nil {
				final = tc.want
			}
			if got := allRows(tr); !reflect.DeepEqual(got, final) {
				t.Fatalf("rows after Close = %q, want %q", got, final)
			}
			re, err := OpenTranscript(path, TranscriptOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if got := allRows(re); !reflect.DeepEqual(got, final) {
				t.Fatalf("reopened rows = %q, want %q", got, final)
			}
		})
	}
}

func TestTranscriptIdleNeedsQuiet(t *testing.T) {
	// The real timer may fire too, but on the fake clock it never sees idle time.
	tr, clk, _ := newTestTranscript(t, TranscriptOptions{IdleCommit: 100 * time.Millisecond})
	t0 := clk.Now()
	tr.Write([]byte("ab"))
	tr.tick(t0.Add(50 * time.Millisecond))
	clk.advance(80 * time.Millisecond)
	tr.Write([]byte("c"))
	tr.tick(t0.Add(150 * time.Millisecond)) // only 70ms since "c"
	if n := tr.Total(); n != 0 {
		t.Fatalf("committed too early: %d rows", n)
	}
	tr.tick(t0.Add(180 * time.Millisecond))
	if got := allRows(tr); !reflect.DeepEqual(got, []string{"abc"}) {
		t.Fatalf("rows = %q", got)
	}
}

func TestTranscriptIdleTimer(t *testing.T) {
	path := filepath.Join(t.TempDir(), "transcript.log")
	tr, err := NewTranscript(path, TranscriptOptions{IdleCommit: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	tr.Write([]byte("Password: "))
	deadline := time.Now().Add(5 * time.Second)
	for tr.Total() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("idle timer never committed the prompt")
		}
		time.Sleep(2 * time.Millisecond)
	}
	tr.Write([]byte("x\n"))
	if got := allRows(tr); !reflect.DeepEqual(got, []string{"Password: ", "x"}) {
		t.Fatalf("rows = %q", got)
	}
}

func TestTranscriptLongRowsSplit(t *testing.T) {
	// WindowBytes leaves room for 10-byte rows.
	tr, clk, path := newTestTranscript(t, TranscriptOptions{WindowBytes: int64(prefixLen + 1 + 10)})
	feedSteps(t, tr, clk, []string{strings.Repeat("x", 25) + "\n", "aaaaaaaaa€b\n", strings.Repeat("y", 10), "\n"})
	// The window holds one such row, so read the rows from the file.
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	got := []string{}
	for _, l := range strings.Split(strings.TrimSuffix(string(b), "\n"), "\n") {
		got = append(got, stripPrefix(l))
	}
	want := []string{"xxxxxxxxxx", "xxxxxxxxxx", "xxxxx", "aaaaaaaaa", "€b", "yyyyyyyyyy"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("rows = %q, want %q", got, want)
	}
	if rows, first, _, tb := tr.Rows(0, 10); !reflect.DeepEqual(rows, want[5:]) || first != 5 || tb != 5 {
		t.Fatalf("Rows(0,10) = %q %d %d", rows, first, tb)
	}
}

func TestTranscriptTimestamps(t *testing.T) {
	tr, clk, path := newTestTranscript(t, TranscriptOptions{})
	clk.now = time.Date(2024, 3, 5, 6, 7, 8, 9_999_999, time.FixedZone("X", 5*3600))
	tr.Write([]byte("hello\n[not a prefix] x\n"))
	tr.Write([]byte("prompt"))
	clk.now = clk.now.Add(time.Hour)
	tr.tick(clk.now)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want := "[2024-03-05T01:07:08.009Z] hello\n" +
		"[2024-03-05T01:07:08.009Z] [not a prefix] x\n" +
		"[2024-03-05T01:07:08.009Z] prompt\n" // idle row: time of its last byte
	if string(b) != want {
		t.Fatalf("file = %q, want %q", b, want)
	}
	if got := allRows(tr); !reflect.DeepEqual(got, []string{"hello", "[not a prefix] x", "prompt"}) {
		t.Fatalf("rows = %q", got)
	}
}

// numbered writes rows "row-000" … with a fixed size: prefixLen+8 bytes on disk.
func numbered(from, to int) string {
	var b strings.Builder
	for i := from; i < to; i++ {
		fmt.Fprintf(&b, "row-%03d\n", i)
	}
	return b.String()
}

func rowNames(from, to int) []string {
	out := []string{}
	for i := from; i < to; i++ {
		out = append(out, fmt.Sprintf("row-%03d", i))
	}
	return out
}

const rowFileBytes = prefixLen + 8

func TestTranscriptRowsWindow(t *testing.T) {
	tr, _, _ := newTestTranscript(t, TranscriptOptions{})
	tr.Write([]byte(numbered(0, 10)))
	type res struct{ first, end, trunc int }
	cases := []struct {
		start, limit int
		rows         []string
		res          res
	}{
		{0, 3, rowNames(0, 3), res{0, 3, 0}},
		{4, 3, rowNames(4, 7), res{4, 7, 0}},
		{8, 100, rowNames(8, 10), res{8, 10, 0}},
		{-5, 2, rowNames(0, 2), res{0, 2, 0}},
		{10, 5, []string{}, res{10, 10, 0}},
		{50, 5, []string{}, res{10, 10, 0}},
		{3, 0, []string{}, res{3, 3, 0}},
	}
	for _, c := range cases {
		rows, first, end, trunc := tr.Rows(c.start, c.limit)
		if !reflect.DeepEqual(rows, c.rows) || (res{first, end, trunc}) != c.res {
			t.Errorf("Rows(%d,%d) = %q %d %d %d, want %q %v", c.start, c.limit, rows, first, end, trunc, c.rows, c.res)
		}
	}
}

func TestTranscriptSinceCursor(t *testing.T) {
	tr, _, _ := newTestTranscript(t, TranscriptOptions{})
	cursor := 0
	step := func(out string, want []string) {
		t.Helper()
		tr.Write([]byte(out))
		rows, first, end, trunc := tr.Since(cursor)
		if !reflect.DeepEqual(rows, want) || first != cursor || end != cursor+len(want) || trunc != 0 {
			t.Fatalf("Since(%d) = %q %d %d %d, want %q", cursor, rows, first, end, trunc, want)
		}
		cursor = end
	}
	step("a\nb\n", []string{"a", "b"})
	step("", []string{})
	step("par", []string{})
	step("tial\nc\n", []string{"partial", "c"})
	// Since never moves anything by itself: the same cursor gives the same rows.
	if rows, _, _, _ := tr.Since(2); !reflect.DeepEqual(rows, []string{"partial", "c"}) {
		t.Fatalf("Since(2) = %q", rows)
	}
}

func TestTranscriptWindowBytes(t *testing.T) {
	tr, _, _ := newTestTranscript(t, TranscriptOptions{WindowBytes: int64(3*rowFileBytes + 5)})
	tr.Write([]byte(numbered(0, 10)))
	type res struct{ first, end, trunc int }
	check := func(name string, rows []string, first, end, trunc int, wantRows []string, want res) {
		t.Helper()
		if !reflect.DeepEqual(rows, wantRows) || (res{first, end, trunc}) != want {
			t.Errorf("%s = %q %d %d %d, want %q %v", name, rows, first, end, trunc, wantRows, want)
		}
	}
	r, f, e, tb := tr.Rows(0, 100)
	check("Rows(0,100)", r, f, e, tb, rowNames(7, 10), res{7, 10, 7})
	r, f, e, tb = tr.Rows(5, 1)
	check("Rows(5,1)", r, f, e, tb, rowNames(7, 8), res{7, 8, 2})
	r, f, e, tb = tr.Rows(8, 1)
	check("Rows(8,1)", r, f, e, tb, rowNames(8, 9), res{8, 9, 0})
	r, f, e, tb = tr.Since(2)
	check("Since(2)", r, f, e, tb, rowNames(7, 10), res{7, 10, 5})
	r, f, e, tb = tr.Since(9)
	check("Since(9)", r, f, e, tb, rowNames(9, 10), res{9, 10, 0})
}

func TestTranscriptRotation(t *testing.T) {
	max := int64(10 * rowFileBytes)
	tr, _, path := newTestTranscript(t, TranscriptOptions{MaxBytes: max})
	tr.Write([]byte(numbered(0, 10))) // exactly MaxBytes: no rotation yet
	if rows, first, _, tb := tr.Rows(0, 100); first != 0 || tb != 0 || len(rows) != 10 {
		t.Fatalf("before rotation: first %d trunc %d rows %d", first, tb, len(rows))
	}
	tr.Write([]byte(numbered(10, 11))) // row 10 does not fit: keep the newest half (rows 5..9)
	rows, first, end, tb := tr.Rows(0, 100)
	if !reflect.DeepEqual(rows, rowNames(5, 11)) || first != 5 || end != 11 || tb != 5 || tr.Total() != 11 {
		t.Fatalf("after rotation: %q %d %d %d total %d", rows, first, end, tb, tr.Total())
	}
	if rows, first, _, tb := tr.Rows(7, 2); !reflect.DeepEqual(rows, rowNames(7, 9)) || first != 7 || tb != 0 {
		t.Fatalf("Rows(7,2) = %q %d %d", rows, first, tb)
	}
	b, _ := os.ReadFile(path)
	if int64(len(b)) != 6*int64(rowFileBytes) || !strings.HasSuffix(strings.SplitN(string(b), "\n", 2)[0], "row-005") {
		t.Fatalf("file after rotation: %d bytes, %q…", len(b), string(b[:rowFileBytes]))
	}
	tr.Write([]byte(numbered(11, 40))) // several more rotations
	tr.Close()
	rows, first, end, tb = tr.Rows(0, 100)
	if first == 0 || end != 40 || tb != first || !reflect.DeepEqual(rows, rowNames(first, 40)) {
		t.Fatalf("after more rotations: first %d end %d trunc %d rows %q", first, end, tb, rows)
	}
	if fi, _ := os.Stat(path); fi.Size() > max {
		t.Fatalf("file size %d > MaxBytes %d", fi.Size(), max)
	}

	re, err := OpenTranscript(path, TranscriptOptions{MaxBytes: max})
	if err != nil {
		t.Fatal(err)
	}
	rows2, first2, end2, tb2 := re.Rows(0, 100)
	if !reflect.DeepEqual(rows2, rows) || first2 != first || end2 != end || tb2 != tb || re.Total() != 40 {
		t.Fatalf("reopened: %q %d %d %d, want %q %d %d %d", rows2, first2, end2, tb2, rows, first, end, tb)
	}
	if _, err := re.Write([]byte("x\n")); err == nil {
		t.Fatal("write to a reopened transcript succeeded")
	}
}

func TestTranscriptRotationRecovery(t *testing.T) {
	write := func(t *testing.T, path, s string) {
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	line := func(s string) string { return "[2024-03-05T01:07:08.009Z] " + s + "\n" }
	t.Run("roll back", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "transcript.log")
		write(t, path, line("a")+line("b"))
		write(t, path+".first", "3\n")
		write(t, path+".new", line("b"))
		write(t, path+".first.new", "4\n")
		re, err := OpenTranscript(path, TranscriptOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if rows, first, _, _ := re.Rows(0, 10); first != 3 || !reflect.DeepEqual(rows, []string{"a", "b"}) {
			t.Fatalf("rows %q first %d", rows, first)
		}
	})
	t.Run("roll forward", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "transcript.log")
		write(t, path, line("b"))
		write(t, path+".first", "3\n")
		write(t, path+".first.new", "4\n")
		re, err := OpenTranscript(path, TranscriptOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if rows, first, _, _ := re.Rows(0, 10); first != 4 || !reflect.DeepEqual(rows, []string{"b"}) {
			t.Fatalf("rows %q first %d", rows, first)
		}
	})
	t.Run("torn last line", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "transcript.log")
		write(t, path, line("a")+"[2024-03-05T01:07:08.009Z] par")
		re, err := OpenTranscript(path, TranscriptOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if rows := allRows(re); !reflect.DeepEqual(rows, []string{"a", "par"}) {
			t.Fatalf("rows %q", rows)
		}
	})
}

func TestTranscriptReopen(t *testing.T) {
	tr, clk, path := newTestTranscript(t, TranscriptOptions{})
	feedSteps(t, tr, clk, []string{"one\r\ntwo\n\nthree\rTHREE\n", "prompt> ", idleStep, "four"})
	tr.Close()
	want := []string{"one", "two", "", "THREE", "prompt> ", "four"}
	re, err := OpenTranscript(path, TranscriptOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer re.Close()
	if got := allRows(re); !reflect.DeepEqual(got, want) || re.Total() != len(want) {
		t.Fatalf("reopened rows = %q (total %d), want %q", got, re.Total(), want)
	}
	if rows, first, end, _ := re.Rows(2, 2); !reflect.DeepEqual(rows, want[2:4]) || first != 2 || end != 4 {
		t.Fatalf("Rows(2,2) = %q %d %d", rows, first, end)
	}
}

func TestTranscriptConcurrent(t *testing.T) {
	const n = 3000
	path := filepath.Join(t.TempDir(), "transcript.log")
	tr, err := NewTranscript(path, TranscriptOptions{MaxBytes: int64(200 * rowFileBytes), WindowBytes: int64(50 * rowFileBytes), IdleCommit: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	var wg sync.WaitGroup
	done := make(chan struct{})
	wg.Add(1)
	go func() { // writer: arbitrary chunking
		defer wg.Done()
		defer close(done)
		rng := rand.New(rand.NewSource(1))
		data := []byte(strings.ReplaceAll(numbered(0, n), "\n", "\r\n"))
		for len(data) > 0 {
			k := min(1+rng.Intn(40), len(data))
			tr.Write(data[:k])
			data = data[k:]
		}
	}()
	check := func(rows []string, start, first, end, trunc int) {
		if end-first != len(rows) || first < 0 || end > n || (start >= 0 && start < first && trunc != first-start) {
			t.Errorf("bad window start %d: first %d end %d trunc %d rows %d", start, first, end, trunc, len(rows))
			return
		}
		for i, r := range rows {
			if want := fmt.Sprintf("row-%03d", first+i); r != want {
				t.Errorf("row %d = %q, want %q", first+i, r, want)
				return
			}
		}
	}
	for g := 0; g < 3; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			rng := rand.New(rand.NewSource(int64(g)))
			cursor := 0
			for {
				select {
				case <-done:
					return
				default:
				}
				total := tr.Total()
				start := rng.Intn(total + 1)
				rows, first, end, trunc := tr.Rows(start, 1+rng.Intn(100))
				check(rows, start, first, end, trunc)
				rows, first, end, trunc = tr.Since(cursor)
				check(rows, cursor, first, end, trunc)
				cursor = end
			}
		}(g)
	}
	wg.Wait()
	if tr.Total() != n {
		t.Fatalf("Total = %d, want %d", tr.Total(), n)
	}
}

func TestTranscriptTokenCount(t *testing.T) {
	cases := []struct {
		s    string
		want int
	}{{"", 0}, {"a", 1}, {"abcd", 1}, {"abcde", 2}, {"ééé€", 1}, {"ééé€x", 2}, {"a\xffbc", 1}}
	for _, c := range cases {
		if got := TokenCount(c.s); got != c.want {
			t.Errorf("tokenCount(%q) = %d, want %d", c.s, got, c.want)
		}
	}
}

// TestTranscriptDiskFull: when the file can no longer be written (here
// /dev/full, which fails every write with ENOSPC, as a full disk does), the
// rows already written stay readable from the file, every later row is kept
// in memory (the newest WindowBytes' worth), and Err says why (issue 13
// item 3: the rows were dropped and the command's output came back empty).
func TestTranscriptDiskFull(t *testing.T) {
	window := int64(10 * rowFileBytes)
	tr, _, path := newTestTranscript(t, TranscriptOptions{WindowBytes: window, MaxBytes: 100 * window})
	tr.Write([]byte(numbered(0, 3)))
	full, err := os.OpenFile("/dev/full", os.O_RDWR, 0)
	if err != nil {
		t.Skipf("no /dev/full: %v", err)
	}
	tr.mu.Lock()
	tr.f.Close()
	tr.f = full
	tr.mu.Unlock()
	if tr.Err() != nil {
		t.Fatalf("Err before any failure: %v", tr.Err())
	}

	if _, err := tr.Write([]byte(numbered(3, 6))); err == nil || !strings.Contains(err.Error(), "no space left on device") {
		t.Fatalf("Write on a full disk: %v", err)
	}
	if err := tr.Err(); err == nil || !strings.Contains(err.Error(), "no space left on device") {
		t.Fatalf("Err: %v", err)
	}
	// (While open, rows 0-2 are read through the descriptor: /dev/full
	// here, so they are checked after Close, from the file.)
	if got, first, end, _ := tr.Rows(3, 100); !reflect.DeepEqual(got, rowNames(3, 6)) || first != 3 || end != 6 || tr.Total() != 6 {
		t.Fatalf("rows after the failure: %q [%d,%d) (total %d)", got, first, end, tr.Total())
	}
	tr.Write([]byte("partial"))
	if err := tr.Close(); err == nil {
		t.Fatal("Close hid the write error")
	}
	// Closed: the file rows are read from the path, the rest from memory.
	if got := allRows(tr); !reflect.DeepEqual(got, append(rowNames(0, 6), "partial")) {
		t.Fatalf("rows after Close: %q", got)
	}
	if b, _ := os.ReadFile(path); strings.Count(string(b), "\n") != 3 {
		t.Fatalf("the file should hold the 3 rows written before the failure: %q", b)
	}
}

// TestTranscriptMemoryBound: rows kept in memory after a write error stay
// within the window; older ones count as truncated, like a rotation.
func TestTranscriptMemoryBound(t *testing.T) {
	window := int64(10 * rowFileBytes)
	tr, _, _ := newTestTranscript(t, TranscriptOptions{WindowBytes: window, MaxBytes: 100 * window})
	tr.Write([]byte(numbered(0, 3)))
	full, err := os.OpenFile("/dev/full", os.O_RDWR, 0)
	if err != nil {
		t.Skipf("no /dev/full: %v", err)
	}
	tr.mu.Lock()
	tr.f.Close()
	tr.f = full
	tr.mu.Unlock()
	for i := 3; i < 40; i++ {
		tr.Write([]byte(numbered(i, i+1)))
	}
	rows, first, end, trunc := tr.Rows(0, 1000)
	if !reflect.DeepEqual(rows, rowNames(30, 40)) || first != 30 || end != 40 || trunc != 30 || tr.Total() != 40 {
		t.Fatalf("Rows = %q %d %d %d (total %d)", rows, first, end, trunc, tr.Total())
	}
	tr.mu.Lock()
	held := len(tr.buf)
	tr.mu.Unlock()
	if int64(held) > window {
		t.Fatalf("%d bytes held in memory, window %d", held, window)
	}
}
