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
// tail, puts one marker row between them naming the omitted row offsets
// (read them with read_command_lines), and adds output_truncated with the
// same numbers. A single row longer than half the budget is cut and counts
// as omitted. 0 means unbounded; objects without output are left alone.
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
	marker := fmt.Sprintf("[… %d of %d rows omitted here (offsets %d to %d), output bounded to about %d tokens; "+
		"read them with read_command_lines start_offset=%d …]", omitted, n, omitFrom, omitTo-1, maxTokens, omitFrom)
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
	obj["output_truncated"] = map[string]any{
		"omitted_start_offset": omitFrom, "omitted_end_offset": omitTo, "omitted_rows": omitted,
		"max_output_tokens": maxTokens,
	}
}

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
