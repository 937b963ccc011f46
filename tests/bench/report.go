package main

// The report: everything the bench prints also goes, structured, into one
// JSON document (-json FILE) so runs can be compared: each section's tables
// (every cell as printed plus its number), its notes, and the issue's
// targets with the measured value and whether it was met (printed, never
// asserted).

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

type report struct {
	Started  string           `json:"started"`
	Go       string           `json:"go"`
	Kernel   string           `json:"kernel"`
	CPUs     int              `json:"cpus"`
	UID      int              `json:"uid"`
	Reps     int              `json:"reps"`
	Quick    bool             `json:"quick"`
	Failed   bool             `json:"failed"`
	Sections []*reportSection `json:"sections"`
	// Targets repeats every section's targets in one list.
	Targets []reportTarget `json:"targets"`
}

type reportSection struct {
	Number  int            `json:"number"`
	Title   string         `json:"title"`
	Tables  []reportTable  `json:"tables"`
	Notes   []string       `json:"notes"`
	Targets []reportTarget `json:"targets"`
	Failed  string         `json:"failed,omitempty"`
}

// reportTable is one printed table: Rows hold the cells as printed, Values
// the same cells as numbers where they parse (durations in milliseconds,
// ratios "×" as plain numbers, "MiB" in MiB, "µs" per-file figures in
// milliseconds, counts "1k" as 1000).
type reportTable struct {
	Columns []string             `json:"columns"`
	Rows    []map[string]string  `json:"rows"`
	Values  []map[string]float64 `json:"values"`
}

type reportTarget struct {
	Section  int      `json:"section"`
	Name     string   `json:"name"`
	Measured string   `json:"measured"` // as printed, with its unit
	Value    *float64 `json:"value"`    // the number compared; null when not measured
	Target   string   `json:"target"`   // e.g. "< 1×"
	Met      *bool    `json:"met"`      // null when not measured
	Note     string   `json:"note,omitempty"`
}

// printf, println and print write to the bench's output and record the
// text as a note of the current section.
func (b *bench) printf(format string, a ...any) { b.emit(fmt.Sprintf(format, a...)) }
func (b *bench) println(a ...any)               { b.emit(fmt.Sprintln(a...)) }
func (b *bench) print(a ...any)                 { b.emit(fmt.Sprint(a...)) }

func (b *bench) emit(s string) {
	io.WriteString(b.out, s)
	if b.cur == nil {
		return
	}
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "== ") {
			b.cur.Notes = append(b.cur.Notes, l)
		}
	}
}

// tableWriter is a tabwriter on the bench's output that also records its
// rows (the first line is the header) in the current section at Flush.
type tableWriter struct {
	b   *bench
	tw  *tabwriter.Writer
	buf bytes.Buffer
}

func (b *bench) table(flags uint) *tableWriter {
	return &tableWriter{b: b, tw: tabwriter.NewWriter(b.out, 0, 0, 2, ' ', flags)}
}

func (t *tableWriter) Write(p []byte) (int, error) {
	t.buf.Write(p)
	return t.tw.Write(p)
}

func (t *tableWriter) Flush() error {
	err := t.tw.Flush()
	if t.b.cur == nil {
		return err
	}
	var tab reportTable
	for _, line := range strings.Split(strings.TrimRight(t.buf.String(), "\n"), "\n") {
		cells := strings.Split(line, "\t")
		for len(cells) > 0 && strings.TrimSpace(cells[len(cells)-1]) == "" {
			cells = cells[:len(cells)-1]
		}
		if tab.Columns == nil {
			tab.Columns = cells
			continue
		}
		row, vals := map[string]string{}, map[string]float64{}
		for i, c := range cells {
			col := fmt.Sprintf("column %d", i+1)
			if i < len(tab.Columns) {
				col = tab.Columns[i]
			}
			row[col] = c
			if v, ok := parseFigure(c); ok {
				vals[col] = v
			}
		}
		tab.Rows, tab.Values = append(tab.Rows, row), append(tab.Values, vals)
	}
	t.b.cur.Tables = append(t.b.cur.Tables, tab)
	t.buf.Reset()
	return err
}

// parseFigure reads a printed figure back as a number (see reportTable).
func parseFigure(s string) (float64, bool) {
	s = strings.TrimSpace(s)
	units := []struct {
		suffix string
		scale  float64
	}{{" ms", 1}, {" µs", 1e-3}, {" s", 1e3}, {"×", 1}, {" MiB", 1}, {"k", 1e3}, {"", 1}}
	for _, u := range units {
		if !strings.HasSuffix(s, u.suffix) {
			continue
		}
		if v, err := strconv.ParseFloat(strings.TrimSuffix(s, u.suffix), 64); err == nil {
			return v * u.scale, true
		}
	}
	return 0, false
}

// target prints one of the targets next to its measurement and
// records it. value is compared with limit by op ("<", "≤" or, for rates,
// "≥"); measured is value as printed. A NaN value means not measured (note
// says why).
func (b *bench) target(name, measured string, value float64, op string, limit float64, unit, note string) {
	t := reportTarget{Name: name, Measured: measured, Target: fmt.Sprintf("%s %s%s", op, strconv.FormatFloat(limit, 'f', -1, 64), unit), Note: note}
	verdict := "not measured"
	if !math.IsNaN(value) {
		met := value < limit || (op == "≤" && value == limit)
		if op == "≥" {
			met = value >= limit
		}
		t.Met, t.Value = &met, &value
		verdict = map[bool]string{true: "met", false: "MISSED"}[met]
	}
	if b.cur != nil {
		t.Section = b.cur.Number
		b.cur.Targets = append(b.cur.Targets, t)
	}
	b.rep.Targets = append(b.rep.Targets, t)
	line := fmt.Sprintf("target: %s: %s   (target %s) %s", name, measured, t.Target, verdict)
	if note != "" {
		line += " — " + note
	}
	io.WriteString(b.out, line+"\n")
}

// ratioValue is a/b as a number (NaN when b is zero).
func ratioValue(a, b time.Duration) float64 {
	if b <= 0 {
		return math.NaN()
	}
	return float64(a) / float64(b)
}

// writeReport writes the JSON document to path ("-" = standard output).
func (b *bench) writeReport(path string) error {
	data, err := json.MarshalIndent(b.rep, "", "  ")
	if err != nil {
		return err
	}
	data = append(data, '\n')
	if path == "-" {
		_, err = os.Stdout.Write(data)
		return err
	}
	return os.WriteFile(path, data, 0o644)
}
