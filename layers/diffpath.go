package layers

import "strings"

// QuoteDiffPath writes a path for a unified diff's "--- "/"+++ " header the
// way git does with its default core.quotePath=true (quote.c's
// quote_c_style): a name holding a control character, a double quote, a
// backslash, DEL or any byte ≥ 0x80 is written in double quotes with C
// escapes (\a \b \t \n \v \f \r \" \\) and every other such byte as a
// three-digit octal escape; any other name is written as it is (git's
// trailing tab after a name holding a space is not: it tells a name from a
// timestamp, and these headers carry none). name
// includes the diff's a/ or b/ prefix, which git puts inside the quotes.
//
// Without it a file named "x\n+++ b/y\n@@ -0,0 +1 @@\n+z" forges a second
// header, a hunk and added lines in every reader of the diff (issue #27
// item 5). Bytes ≥ 0x80 are quoted too (git's default), so a diff's header
// lines are plain ASCII; the JSON path beside each diff keeps the name as
// it is for display.
func QuoteDiffPath(name string) string {
	need := false
	for i := 0; i < len(name); i++ {
		if diffQuoteByte(name[i]) {
			need = true
			break
		}
	}
	if !need {
		return name
	}
	var b strings.Builder
	b.Grow(len(name) + 8)
	b.WriteByte('"')
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !diffQuoteByte(c) {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('\\')
		switch c {
		case '\a':
			b.WriteByte('a')
		case '\b':
			b.WriteByte('b')
		case '\t':
			b.WriteByte('t')
		case '\n':
			b.WriteByte('n')
		case '\v':
			b.WriteByte('v')
		case '\f':
			b.WriteByte('f')
		case '\r':
			b.WriteByte('r')
		case '"', '\\':
			b.WriteByte(c)
		default:
			b.WriteByte('0' + c>>6)
			b.WriteByte('0' + (c>>3)&7)
			b.WriteByte('0' + c&7)
		}
	}
	b.WriteByte('"')
	return b.String()
}

func diffQuoteByte(c byte) bool {
	return c < 0x20 || c == '"' || c == '\\' || c >= 0x7f
}
