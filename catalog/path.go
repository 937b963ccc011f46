package catalog

import (
	"strings"
	"unicode/utf8"
)

// WorkspacePath normalizes a file-operation path (§7.2) to a clean
// workspace-relative form ("" is the workspace root, allowed only when
// allowRoot is set). Anything that could leave the workspace is refused with
// invalid_request "invalid path: <p>", and so is a path that is not UTF-8
// (it could only be looked up as something else).
func WorkspacePath(p string, allowRoot bool) (string, *Error) {
	bad := func() (string, *Error) {
		return "", Errorf(InvalidRequest, "invalid path: %s", p).With("path", p)
	}
	if len(p) > 4096 || strings.IndexByte(p, 0) >= 0 || !utf8.ValidString(p) {
		return bad()
	}
	s := strings.ReplaceAll(p, `\`, "/")
	if strings.HasPrefix(s, "/") {
		switch {
		case s == "/" && allowRoot:
			return "", nil
		case s == "/workspace" || strings.HasPrefix(s, "/workspace/"):
			s = s[len("/workspace"):]
		default:
			return bad()
		}
	}
	var parts []string
	for _, seg := range strings.Split(s, "/") {
		switch seg {
		case "", ".":
			continue
		case "..":
			return bad()
		}
		if len(seg) > 255 {
			return bad()
		}
		parts = append(parts, seg)
	}
	if len(parts) == 0 && !allowRoot {
		return bad()
	}
	return strings.Join(parts, "/"), nil
}
