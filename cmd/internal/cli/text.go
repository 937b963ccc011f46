package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"text/tabwriter"

	"golang.org/x/sys/unix"
)

// Text renders a result or error object for people (--output text): lists
// as aligned tables, command output as its text plus a status line, diffs as
// unified diffs (coloured when color), blame as line ranges, publish
// results as a summary, anything else as "key: value" lines. JSON stays the
// default for scripts.
func Text(v any, color bool) string {
	m := toMap(v)
	var b strings.Builder
	switch {
	case m["error"] != nil:
		e, _ := m["error"].(map[string]any)
		fmt.Fprintf(&b, "error: %v: %v\n", e["kind"], e["message"])
		if d, _ := e["details"].(map[string]any); len(d) > 0 {
			writeFields(&b, d, "  ")
		}
	case m["command_session_id"] != nil && m["output"] != nil && m["status"] != nil:
		if out, _ := m["output"].(string); out != "" {
			b.WriteString(out + "\n")
		}
		fmt.Fprintf(&b, "[%v", m["status"])
		if m["exit_code"] != nil {
			fmt.Fprintf(&b, ", exit %v", m["exit_code"])
		}
		fmt.Fprintf(&b, "; rows %v-%v of %v; command %v; session %v]\n", m["start_offset"], m["end_offset"], m["total_lines"],
			m["command_session_id"], m["workspace_session_id"])
	case m["publish"] != nil && m["dry_run"] != nil:
		writePublish(&b, m)
	case m["sync"] != nil && m["dry_run"] != nil:
		writeSync(&b, m)
	case m["ranges"] != nil && m["line_count"] != nil:
		fmt.Fprintf(&b, "%v (%v lines, %v view)\n", m["path"], m["line_count"], m["view"])
		tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "LINES\tOWNER\tCOMMAND\tAGENT")
		for _, r := range list(m["ranges"]) {
			start := num(r["start_line"])
			end := start + num(r["line_count"]) - 1
			fmt.Fprintf(tw, "%d-%d\t%v\t%v\t%v\n", start, end, r["owner"], orDash(r["command_session_id"]), orDash(r["agent"]))
		}
		_ = tw.Flush()
	case m["files"] != nil && m["against"] != nil:
		for _, f := range list(m["files"]) {
			fmt.Fprintf(&b, "%v %v\n", f["status"], f["path"])
			if d, _ := f["diff"].(string); d != "" {
				b.WriteString(colorDiff(d, color))
				if !strings.HasSuffix(d, "\n") {
					b.WriteString("\n")
				}
			}
		}
		if hc := m["head_changed_paths"]; hc != nil && len(hc.([]any)) > 0 {
			fmt.Fprintf(&b, "changed meanwhile in the published state: %v\n", hc)
		}
	case m["content"] != nil && m["total_lines"] != nil:
		b.WriteString(fmt.Sprint(m["content"]) + "\n")
	default:
		writeObject(&b, m)
	}
	return b.String()
}

// writeObject prints the arrays of objects as tables and the rest as fields.
func writeObject(b *strings.Builder, m map[string]any) {
	var tables []string
	rest := map[string]any{}
	for k, v := range m {
		if arr, ok := v.([]any); ok && len(arr) > 0 && isObjects(arr) {
			tables = append(tables, k)
		} else {
			rest[k] = v
		}
	}
	sort.Strings(tables)
	writeFields(b, rest, "")
	for _, k := range tables {
		fmt.Fprintf(b, "%s:\n", k)
		writeTable(b, list(m[k]))
	}
}

func isObjects(arr []any) bool {
	for _, v := range arr {
		if _, ok := v.(map[string]any); !ok {
			return false
		}
	}
	return true
}

// writeTable aligns rows under the keys of the first row (then any new keys).
func writeTable(b *strings.Builder, rows []map[string]any) {
	var cols []string
	seen := map[string]bool{}
	for _, r := range rows {
		keys := make([]string, 0, len(r))
		for k := range r {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if !seen[k] {
				seen[k] = true
				cols = append(cols, k)
			}
		}
	}
	tw := tabwriter.NewWriter(b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  "+strings.ToUpper(strings.Join(cols, "\t")))
	for _, r := range rows {
		cells := make([]string, len(cols))
		for i, c := range cols {
			cells[i] = cell(r[c])
		}
		fmt.Fprintln(tw, "  "+strings.Join(cells, "\t"))
	}
	_ = tw.Flush()
}

func writeFields(b *strings.Builder, m map[string]any, indent string) {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(b, "%s%s: %s\n", indent, k, cell(m[k]))
	}
}

func writePublish(b *strings.Builder, m map[string]any) {
	p, _ := m["publish"].(map[string]any)
	sum, _ := p["summary"].(map[string]any)
	switch sum["result"] {
	case "published":
		fmt.Fprintf(b, "published %v of %v changed paths (%v merged) as layer %v\n", sum["published_paths"], sum["changed_paths"], sum["merged_paths"], p["layer_id"])
	case "would_publish":
		fmt.Fprintf(b, "dry run: would publish %v of %v changed paths (%v merged)\n", sum["published_paths"], sum["changed_paths"], sum["merged_paths"])
	case "would_reject":
		fmt.Fprintf(b, "dry run: would be rejected: %v conflicting of %v changed paths\n", sum["conflict_paths"], sum["changed_paths"])
	case "no_op":
		b.WriteString("nothing to publish\n")
	default:
		writeFields(b, p, "")
	}
	if v := sum["kept_head_paths"]; v != nil && num(v) > 0 {
		fmt.Fprintf(b, "kept the published version of %v paths (theirs)\n", v)
	}
	for _, r := range list(p["git_refs"]) {
		writeGitRef(b, r)
	}
	if plan, _ := m["plan"].(map[string]any); plan != nil && p["git_refs"] == nil {
		for _, r := range list(plan["git_refs"]) {
			writeGitRef(b, r)
		}
	}
	if n := num(sum["git_private_paths"]) + num(sum["git_protected_paths"]); n > 0 {
		fmt.Fprintf(b, "kept %v paths of the git directory in the session (its own state, config and hooks are never published)\n", n)
	}
	if plan, _ := m["plan"].(map[string]any); plan != nil {
		for _, c := range list(plan["conflicts"]) {
			fmt.Fprintf(b, "conflict: %v (%v, %v)\n", c["path"], c["outcome"], orDash(c["conflict_reason"]))
		}
	}
	fmt.Fprintf(b, "session %v", m["workspace_session_id"])
	if m["destroyed"] == true {
		b.WriteString(" closed")
	}
	if m["kept"] == true {
		fmt.Fprintf(b, " continues on the new head (%v)", revisionText(m["base_revision"]))
	}
	b.WriteString("\n")
}

func writeSync(b *strings.Builder, m map[string]any) {
	s, _ := m["sync"].(map[string]any)
	switch s["result"] {
	case "synced":
		fmt.Fprintf(b, "synced onto %v: kept %v of %v changed paths (%v merged)\n", revisionText(s["base_revision"]), s["kept_paths"], s["changed_paths"], s["merged_paths"])
	case "would_sync":
		fmt.Fprintf(b, "dry run: would sync onto %v keeping %v of %v changed paths (%v merged)\n", revisionText(s["base_revision"]), s["kept_paths"], s["changed_paths"], s["merged_paths"])
	case "would_reject":
		fmt.Fprintf(b, "dry run: would be rejected: %v conflicting of %v changed paths\n", s["conflict_paths"], s["changed_paths"])
	case "no_op":
		b.WriteString("already on the head\n")
	default:
		writeFields(b, s, "")
	}
	if v := s["kept_head_paths"]; v != nil && num(v) > 0 {
		fmt.Fprintf(b, "took the head's version of %v paths (theirs)\n", v)
	}
	if plan, _ := m["plan"].(map[string]any); plan != nil {
		for _, c := range list(plan["conflicts"]) {
			fmt.Fprintf(b, "conflict: %v (%v, %v)\n", c["path"], c["outcome"], orDash(c["conflict_reason"]))
		}
	}
	fmt.Fprintf(b, "session %v\n", m["workspace_session_id"])
}

// revisionText is a revision object as "manifest version N".
func revisionText(v any) string {
	if r, ok := v.(map[string]any); ok && r["manifest_version"] != nil {
		return fmt.Sprintf("manifest version %v", r["manifest_version"])
	}
	return cell(v)
}

func colorDiff(d string, color bool) string {
	if !color {
		return d
	}
	lines := strings.SplitAfter(d, "\n")
	for i, l := range lines {
		switch {
		case strings.HasPrefix(l, "+++"), strings.HasPrefix(l, "---"):
			lines[i] = "\x1b[1m" + strings.TrimSuffix(l, "\n") + "\x1b[0m" + suffixNL(l)
		case strings.HasPrefix(l, "+"):
			lines[i] = "\x1b[32m" + strings.TrimSuffix(l, "\n") + "\x1b[0m" + suffixNL(l)
		case strings.HasPrefix(l, "-"):
			lines[i] = "\x1b[31m" + strings.TrimSuffix(l, "\n") + "\x1b[0m" + suffixNL(l)
		case strings.HasPrefix(l, "@@"):
			lines[i] = "\x1b[36m" + strings.TrimSuffix(l, "\n") + "\x1b[0m" + suffixNL(l)
		}
	}
	return strings.Join(lines, "")
}

func suffixNL(l string) string {
	if strings.HasSuffix(l, "\n") {
		return "\n"
	}
	return ""
}

func cell(v any) string {
	switch x := v.(type) {
	case nil:
		return "-"
	case string:
		if x == "" {
			return "-"
		}
		return strings.ReplaceAll(x, "\n", `\n`)
	case map[string]any, []any:
		s := string(compact(x))
		if len(s) > 80 {
			s = s[:77] + "..."
		}
		return s
	}
	return fmt.Sprint(v)
}

func orDash(v any) string { return cell(v) }

func list(v any) []map[string]any {
	arr, _ := v.([]any)
	out := make([]map[string]any, 0, len(arr))
	for _, x := range arr {
		if m, ok := x.(map[string]any); ok {
			out = append(out, m)
		}
	}
	return out
}

func num(v any) int { return intField(v) }

func compact(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}

// toMap turns a response (map) or an envelope (struct) into a map with
// exact numbers.
func toMap(v any) map[string]any {
	if m, ok := v.(map[string]any); ok {
		return m
	}
	d := json.NewDecoder(bytes.NewReader(compact(v)))
	d.UseNumber()
	var m map[string]any
	_ = d.Decode(&m)
	return m
}

// isTerminal reports whether w is a terminal (diffs are coloured there).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), ioctlGetTermios)
	return err == nil
}

// writeGitRef is one ref decision of a publish (contract A8) and the
// session's commits it carries.
func writeGitRef(b *strings.Builder, r map[string]any) {
	fmt.Fprintf(b, "git %v: %v", r["ref"], r["action"])
	if n := r["new"]; n != nil && n != "" {
		fmt.Fprintf(b, " → %.12v", n)
	}
	if n := r["note"]; n != nil && n != "" {
		fmt.Fprintf(b, " (%v)", n)
	}
	b.WriteString("\n")
	for _, c := range list(r["session_commits"]) {
		fmt.Fprintf(b, "  commit %.12v %v (%v)\n", c["commit"], c["subject"], c["author"])
	}
}
