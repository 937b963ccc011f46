package layers

import (
	"strings"
	"sync"
	"unicode/utf8"
)

// This file implements git's ignore rules (gitignore(5), git's dir.c and
// wildmatch.c) for §9.2 routing and for runtime.publish.protected_paths. It
// follows git byte for byte: matching is on bytes (not runes), case sensitive,
// and a path below an ignored directory is ignored whatever the negations
// further down say (git never descends into an excluded directory).

// maxGitignoreSize mirrors git's PATTERN_MAX_FILE_SIZE: larger files are
// skipped entirely.
const maxGitignoreSize = 100 << 20

// gitPattern is one parsed gitignore line (git's struct path_pattern).
type gitPattern struct {
	pat       string // without the leading '!' and one trailing '/'
	prefix    int    // length of the literal head of pat (git's nowildcardlen)
	negative  bool   // "!pat"
	mustBeDir bool   // "pat/"
	noDir     bool   // no '/' in pat: matched against the basename at any depth
}

// patternList is the parsed content of one .gitignore, relative to dir.
type patternList struct {
	dir  string // workspace-relative directory holding the file, "" = root
	pats []gitPattern
}

// Ignorer answers "is this path ignored by the .gitignore files of view v"
// (§9.2). Safe for concurrent use; caches parsed files.
type Ignorer struct {
	v     *View
	mu    sync.Mutex
	lists map[string]*ignoreEntry
}

type ignoreEntry struct {
	once sync.Once
	list *patternList
}

// NewIgnorer returns an Ignorer reading the .gitignore files of v.
func NewIgnorer(v *View) *Ignorer {
	return &Ignorer{v: v, lists: make(map[string]*ignoreEntry)}
}

// Ignored reports whether the clean workspace-relative path (a directory when
// isDir) is ignored by the root .gitignore and those of its ancestor
// directories, with git semantics. The root itself is never ignored.
func (ig *Ignorer) Ignored(path string, isDir bool) bool {
	if ig == nil || ig.v == nil {
		return false
	}
	return decideIgnored(path, isDir, ig.listAt)
}

func (ig *Ignorer) listAt(dir string) *patternList {
	ig.mu.Lock()
	e := ig.lists[dir]
	if e == nil {
		e = &ignoreEntry{}
		ig.lists[dir] = e
	}
	ig.mu.Unlock()
	e.once.Do(func() { e.list = loadGitignore(ig.v, dir) })
	return e.list
}

// loadGitignore parses dir/.gitignore of v. A missing file, a non-regular one
// (symlinks included), an unreadable, oversized or non-UTF-8 one contributes
// nothing.
func loadGitignore(v *View, dir string) *patternList {
	p := ".gitignore"
	if dir != "" {
		p = dir + "/.gitignore"
	}
	e, err := v.Lstat(p)
	if err != nil || e.Kind != KindFile || e.Size >= maxGitignoreSize {
		return nil
	}
	data, err := v.ReadFile(p)
	if err != nil || len(data) >= maxGitignoreSize || !utf8.Valid(data) {
		return nil
	}
	pats := parsePatternLines(strings.TrimPrefix(string(data), "\ufeff"))
	if len(pats) == 0 {
		return nil
	}
	return &patternList{dir: dir, pats: pats}
}

// Patterns is a compiled list of gitignore-syntax patterns anchored at the
// workspace root (for runtime.publish.protected_paths).
type Patterns struct {
	list *patternList
}

// CompilePatterns compiles lines as the content of a root .gitignore. Blank
// lines and comments contribute nothing; no line is an error (a malformed
// pattern, e.g. an unclosed '[', simply never matches, as in git).
func CompilePatterns(lines []string) *Patterns {
	pats := parsePatternLines(strings.Join(lines, "\n"))
	if len(pats) == 0 {
		return &Patterns{}
	}
	return &Patterns{list: &patternList{pats: pats}}
}

// Match reports whether path (clean, workspace-relative) is matched, with the
// semantics of Ignorer.Ignored: last matching pattern wins, negation,
// directory-only patterns, and a match on any ancestor directory.
func (p *Patterns) Match(path string, isDir bool) bool {
	if p == nil || p.list == nil {
		return false
	}
	return decideIgnored(path, isDir, func(dir string) *patternList {
		if dir == "" {
			return p.list
		}
		return nil
	})
}

// decideIgnored walks path top-down like git's prep_exclude: each ancestor
// directory is checked against the lists loaded so far (its own .gitignore
// applies only below it); an excluded ancestor decides; otherwise the path
// itself is checked against all ancestors' lists, the deepest list with a
// matching pattern deciding.
func decideIgnored(path string, isDir bool, listAt func(dir string) *patternList) bool {
	if path == "" {
		return false
	}
	var stack []*patternList
	if l := listAt(""); l != nil {
		stack = append(stack, l)
	}
	start := 0
	for {
		end := strings.IndexByte(path[start:], '/')
		last := end < 0
		sub := path
		if !last {
			sub = path[:start+end]
		}
		base := sub[start:]
		for i := len(stack) - 1; i >= 0; i-- {
			if matched, negative := stack[i].match(sub, base, isDir || !last); matched {
				if !negative {
					return true
				}
				break
			}
		}
		if last {
			return false
		}
		if l := listAt(sub); l != nil {
			stack = append(stack, l)
		}
		start += end + 1
	}
}

// match is git's last_matching_pattern_from_list: the last matching pattern
// of the list decides (matched), negative tells whether it is a "!" one.
func (l *patternList) match(path, basename string, isDir bool) (matched, negative bool) {
	name := path
	if l.dir != "" {
		if len(path) <= len(l.dir) || path[len(l.dir)] != '/' || path[:len(l.dir)] != l.dir {
			return false, false
		}
		name = path[len(l.dir)+1:]
	}
	for i := len(l.pats) - 1; i >= 0; i-- {
		g := &l.pats[i]
		if g.mustBeDir && !isDir {
			continue
		}
		var ok bool
		if g.noDir {
			ok = wildmatch(g.pat, basename, false)
		} else {
			ok = matchPathname(g, name)
		}
		if ok {
			return true, g.negative
		}
	}
	return false, false
}

// matchPathname is git's match_pathname: the literal head is compared
// first, the rest goes to wildmatch as a pattern of its own (so "**" right
// after the head counts as leading, as in git).
func matchPathname(g *gitPattern, name string) bool {
	pat, prefix := g.pat, g.prefix
	if pat != "" && pat[0] == '/' {
		pat, prefix = pat[1:], prefix-1
	}
	if prefix > 0 {
		if prefix > len(name) || pat[:prefix] != name[:prefix] {
			return false
		}
		pat, name = pat[prefix:], name[prefix:]
		if pat == "" && name == "" {
			return true
		}
	}
	return wildmatch(pat, name, true)
}

// parsePatternLines is git's add_patterns_from_buffer (without the BOM).
func parsePatternLines(data string) []gitPattern {
	var out []gitPattern
	for data != "" {
		var line string
		line, data, _ = strings.Cut(data, "\n")
		if line == "" || line[0] == '#' {
			continue
		}
		line = strings.TrimSuffix(line, "\r")
		if i := strings.IndexByte(line, 0); i >= 0 {
			line = line[:i] // git works on C strings
		}
		g := parsePattern(trimTrailingSpaces(line))
		if g.pat != "" { // an empty pattern never matches
			out = append(out, g)
		}
	}
	return out
}

// trimTrailingSpaces drops unescaped trailing spaces (git's
// trim_trailing_spaces); tabs are kept.
func trimTrailingSpaces(s string) string {
	lastSpace := -1
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case ' ':
			if lastSpace < 0 {
				lastSpace = i
			}
			continue
		case '\\':
			i++
			if i >= len(s) {
				return s
			}
		}
		lastSpace = -1
	}
	if lastSpace >= 0 {
		return s[:lastSpace]
	}
	return s
}

// parsePattern is git's parse_path_pattern.
func parsePattern(s string) gitPattern {
	var g gitPattern
	if s != "" && s[0] == '!' {
		g.negative, s = true, s[1:]
	}
	if n := len(s); n > 0 && s[n-1] == '/' {
		g.mustBeDir, s = true, s[:n-1]
	}
	g.noDir = !strings.Contains(s, "/")
	g.pat = s
	g.prefix = len(s)
	for i := 0; i < len(s); i++ {
		if isGlobSpecial(s[i]) {
			g.prefix = i
			break
		}
	}
	return g
}

func isGlobSpecial(c byte) bool { return c == '*' || c == '?' || c == '[' || c == '\\' }

// wildmatch results (git's wildmatch.h).
const (
	wmMatch           = 0
	wmNoMatch         = 1
	wmAbortAll        = -1
	wmAbortToStarStar = -2
)

// wildmatch is git's wildmatch(pattern, text, pathname ? WM_PATHNAME : 0).
func wildmatch(pattern, text string, pathname bool) bool {
	return dowild(pattern, 0, text, 0, pathname) == wmMatch
}

// at returns s[i], or 0 past the end (the C string terminator).
func at(s string, i int) byte {
	if i < len(s) {
		return s[i]
	}
	return 0
}

// dowild is a transcription of git's wildmatch.c dowild (git ≥ 2.41, with
// the abort codes that keep it polynomial). p and t are C-string-like: at()
// yields 0 at their end; neither contains NUL.
func dowild(p string, pi int, t string, ti int, pathname bool) int {
	for ; pi < len(p); pi, ti = pi+1, ti+1 {
		pch, tch := p[pi], at(t, ti)
		if tch == 0 && pch != '*' {
			return wmAbortAll
		}
		switch pch {
		case '\\':
			pi++
			if tch != at(p, pi) {
				return wmNoMatch
			}
		case '?':
			if pathname && tch == '/' {
				return wmNoMatch
			}
		case '*':
			var matchSlash bool
			pi++
			if at(p, pi) == '*' {
				prev := pi - 2
				for pi++; at(p, pi) == '*'; pi++ {
				}
				switch {
				case !pathname:
					matchSlash = true
				case (prev < 0 || p[prev] == '/') &&
					(pi == len(p) || p[pi] == '/' || (p[pi] == '\\' && at(p, pi+1) == '/')):
					if at(p, pi) == '/' && dowild(p, pi+1, t, ti, pathname) == wmMatch {
						return wmMatch
					}
					matchSlash = true
				}
			} else {
				matchSlash = !pathname
			}
			if pi == len(p) {
				if !matchSlash && strings.IndexByte(t[ti:], '/') >= 0 {
					return wmAbortToStarStar
				}
				return wmMatch
			}
			if !matchSlash && p[pi] == '/' {
				slash := strings.IndexByte(t[ti:], '/')
				if slash < 0 {
					return wmAbortAll
				}
				ti += slash
				continue // the slash is consumed by the loop
			}
			for tch != 0 {
				if !isGlobSpecial(p[pi]) {
					pc := p[pi]
					for tch = at(t, ti); tch != 0 && (matchSlash || tch != '/'); tch = at(t, ti) {
						if tch == pc {
							break
						}
						ti++
					}
					if tch != pc {
						if matchSlash {
							return wmAbortAll
						}
						return wmAbortToStarStar
					}
				}
				if m := dowild(p, pi, t, ti, pathname); m != wmNoMatch {
					if !matchSlash || m != wmAbortToStarStar {
						return m
					}
				} else if !matchSlash && tch == '/' {
					return wmAbortToStarStar
				}
				ti++
				tch = at(t, ti)
			}
			return wmAbortAll
		case '[':
			pi++
			pch = at(p, pi)
			if pch == '^' {
				pch = '!'
			}
			negated := pch == '!'
			if negated {
				pi++
				pch = at(p, pi)
			}
			var prevCh byte
			matched := false
			for {
				if pch == 0 {
					return wmAbortAll
				}
				switch {
				case pch == '\\':
					pi++
					pch = at(p, pi)
					if pch == 0 {
						return wmAbortAll
					}
					if tch == pch {
						matched = true
					}
				case pch == '-' && prevCh != 0 && at(p, pi+1) != 0 && at(p, pi+1) != ']':
					pi++
					pch = p[pi]
					if pch == '\\' {
						pi++
						pch = at(p, pi)
						if pch == 0 {
							return wmAbortAll
						}
					}
					if tch <= pch && tch >= prevCh {
						matched = true
					}
					pch = 0 // makes prevCh 0
				case pch == '[' && at(p, pi+1) == ':':
					s := pi + 2
					pi = s
					for pi < len(p) && p[pi] != ']' {
						pi++
					}
					if pi == len(p) {
						return wmAbortAll
					}
					if pi-s-1 < 0 || p[pi-1] != ':' {
						// no ":]": a plain '[' in the set
						pi = s - 2
						pch = '['
						if tch == pch {
							matched = true
						}
						break
					}
					in, ok := charClass(p[s:pi-1], tch)
					if !ok {
						return wmAbortAll // malformed [:class:]
					}
					if in {
						matched = true
					}
					pch = 0
				default:
					if tch == pch {
						matched = true
					}
				}
				prevCh = pch
				pi++
				if pch = at(p, pi); pch == ']' {
					break
				}
			}
			if matched == negated || (pathname && tch == '/') {
				return wmNoMatch
			}
		default:
			if tch != pch {
				return wmNoMatch
			}
		}
	}
	if ti < len(t) {
		return wmNoMatch
	}
	return wmMatch
}

// charClass evaluates [:name:] for c in the C locale (git's sane_ctype:
// bytes >= 0x80 belong to no class).
func charClass(name string, c byte) (in, ok bool) {
	lower := c >= 'a' && c <= 'z'
	upper := c >= 'A' && c <= 'Z'
	digit := c >= '0' && c <= '9'
	alnum := lower || upper || digit
	graph := c > ' ' && c < 0x7f
	space := c == ' ' || c == '\t' || c == '\n' || c == '\r'
	switch name {
	case "alnum":
		return alnum, true
	case "alpha":
		return lower || upper, true
	case "blank":
		return c == ' ' || c == '\t', true
	case "cntrl":
		return c < ' ' || c == 0x7f, true
	case "digit":
		return digit, true
	case "graph":
		return graph, true
	case "lower":
		return lower, true
	case "print":
		return graph || c == ' ', true
	case "punct":
		return graph && !alnum, true
	case "space":
		return space, true
	case "upper":
		return upper, true
	case "xdigit":
		return digit || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'), true
	}
	return false, false
}
