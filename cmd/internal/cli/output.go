package cli

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
)

// ClientArgs splits the client-side arguments (catalog Arg.ClientSide) off
// validated arguments: they shape the response here and are never sent.
func ClientArgs(op *catalog.Op, args catalog.Args) (server, client catalog.Args) {
	server, client = catalog.Args{}, catalog.Args{}
	for k, v := range args {
		if a := op.Arg(k); a != nil && a.ClientSide {
			client[k] = v
		} else {
			server[k] = v
		}
	}
	return server, client
}

// ansiEscape matches terminal escape sequences: CSI (colours, cursor moves),
// OSC (titles, hyperlinks) and the two-byte forms.
var ansiEscape = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]`)
})

// StripANSI removes terminal escape sequences from text meant for a model;
// the transcript on disk keeps the raw bytes.
func StripANSI(s string) string {
	if !strings.Contains(s, "\x1b") {
		return s
	}
	return strings.ReplaceAll(ansiEscape().ReplaceAllString(s, ""), "\x1b", "")
}

// BoundOutput bounds the "output" of a command output object (§3.3) to
// about maxTokens tokens (4 characters each, the contract's
// original_token_count measure). It keeps whole rows from the head and the
// tail, puts one marker row between them naming the omitted row offsets,
// and adds output_truncated with the same numbers. A single row longer
// than half the budget is cut (its head, or the last row's tail, shown)
// and counts as omitted.
//
// The marker names reads that return what was left out, never the same
// cut again (issue #27): whole omitted rows with read_command_lines
// start_offset/limit (under the same bound such a read keeps at least its
// first row, or cuts it and says so); a row shown only in part with
// start_offset=R limit=1 max_output_tokens=0, the one read that returns a
// row whole (rows are the transcript's unit: there is no read of a range
// within one). When rows before the response fell out of the transcript
// window (truncated_before), the marker says that they cannot be read.
// 0 means unbounded; objects without output are left alone.
func BoundOutput(obj map[string]any, maxTokens uint64) {
	out, ok := obj["output"].(string)
	if !ok || maxTokens == 0 || uint64(utf8.RuneCountInString(out)) <= maxTokens*4 {
		return
	}
	start := intField(obj["start_offset"])
	rows := strings.Split(out, "\n")
	n := len(rows)
	half := int(min(maxTokens*4/2, 1<<30))
	var head, tail []string
	used := 0
	h := 0
	for h < n && used+utf8.RuneCountInString(rows[h])+1 <= half {
		used += utf8.RuneCountInString(rows[h]) + 1
		h++
	}
	head = rows[:h]
	used = 0
	t := 0
	for t < n-h && used+utf8.RuneCountInString(rows[n-1-t])+1 <= half {
		used += utf8.RuneCountInString(rows[n-1-t]) + 1
		t++
	}
	tail = rows[n-t:]
	var partHead, partTail string
	if h == 0 {
		partHead = cutRunes(rows[0], half, false) + " …"
	}
	if t == 0 && n-h > 1 {
		partTail = "… " + cutRunes(rows[n-1], half, true)
	}
	omitFrom, omitTo := start+h, start+n-t
	omitted := omitTo - omitFrom
	// Whole rows omitted: [wholeFrom, wholeTo); the cut rows around them.
	wholeFrom, wholeTo := omitFrom, omitTo
	var partial []int
	if partHead != "" {
		partial = append(partial, omitFrom)
		wholeFrom++
	}
	if partTail != "" {
		partial = append(partial, omitTo-1)
		wholeTo--
	}
	var reads []string
	if partHead != "" {
		reads = append(reads, fmt.Sprintf("row %d is shown only in part: read it whole with read_command_lines start_offset=%d limit=1 max_output_tokens=0", omitFrom, omitFrom))
	}
	switch {
	case wholeTo-wholeFrom == 1:
		reads = append(reads, fmt.Sprintf("read row %d with read_command_lines start_offset=%d limit=1", wholeFrom, wholeFrom))
	case wholeTo > wholeFrom:
		reads = append(reads, fmt.Sprintf("read rows %d to %d with read_command_lines start_offset=%d limit=%d",
			wholeFrom, wholeTo-1, wholeFrom, min(wholeTo-wholeFrom, readLinesMax)))
	}
	if partTail != "" {
		reads = append(reads, fmt.Sprintf("row %d is shown only in part: read it whole with read_command_lines start_offset=%d limit=1 max_output_tokens=0", omitTo-1, omitTo-1))
	}
	if tb := intField(obj["truncated_before"]); tb > 0 {
		reads = append(reads, fmt.Sprintf("%d earlier rows fell out of the transcript window (truncated_before) and can no longer be read", tb))
	}
	marker := fmt.Sprintf("[… %d of %d rows omitted here (offsets %d to %d), output bounded to about %d tokens; %s …]",
		omitted, n, omitFrom, omitTo-1, maxTokens, strings.Join(reads, "; "))
	parts := append([]string{}, head...)
	if partHead != "" {
		parts = append(parts, partHead)
	}
	parts = append(parts, marker)
	if partTail != "" {
		parts = append(parts, partTail)
	}
	parts = append(parts, tail...)
	obj["output"] = strings.Join(parts, "\n")
	tr := map[string]any{
		"omitted_start_offset": omitFrom, "omitted_end_offset": omitTo, "omitted_rows": omitted,
		"max_output_tokens": maxTokens,
	}
	if len(partial) > 0 {
		tr["partial_row_offsets"] = partial
	}
	obj["output_truncated"] = tr
}

// readLinesMax is read_command_lines' largest limit
// (runtime.command.read_lines_max's default); a marker never names more.
const readLinesMax = 1000

func cutRunes(s string, n int, fromEnd bool) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	if fromEnd {
		return string(r[len(r)-n:])
	}
	return string(r[:n])
}

func intField(v any) int {
	switch n := v.(type) {
	case json.Number:
		i, _ := strconv.Atoi(string(n))
		return i
	case float64:
		return int(n)
	case int:
		return n
	}
	return 0
}
