package layers

import (
	"bytes"
	"context"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

func TestPatternsMatch(t *testing.T) {
	cases := []struct {
		lines []string
		path  string
		isDir bool
		want  bool
	}{
		{[]string{"*.log"}, "a/b.log", false, true},
		{[]string{"*.log"}, "a/b.log/c", false, true}, // ancestor "a/b.log" matches
		{[]string{"*.log"}, "a/b.logx", false, false},
		{[]string{"/foo"}, "foo", false, true},
		{[]string{"/foo"}, "a/foo", false, false},
		{[]string{"foo"}, "a/b/foo", false, true},
		{[]string{"foo/"}, "foo", false, false},
		{[]string{"foo/"}, "foo", true, true},
		{[]string{"foo/"}, "a/foo", true, true},
		{[]string{"foo/"}, "foo/bar", false, true},
		{[]string{"a/b/"}, "a/b", false, false},
		{[]string{"a/b"}, "x/a/b", false, false}, // middle slash anchors
		{[]string{"a/**/b"}, "a/b", false, true},
		{[]string{"a/**/b"}, "a/x/y/b", false, true},
		{[]string{"a/**/b"}, "xa/b", false, false},
		{[]string{"**/foo"}, "foo", false, true},
		{[]string{"**/foo"}, "x/y/foo", false, true},
		{[]string{"**/a/b"}, "x/a/b", false, true},
		{[]string{"foo/**"}, "foo", true, false},
		{[]string{"foo/**"}, "foo/x/y", false, true},
		{[]string{"**"}, "anything/at/all", false, true},
		{[]string{"a/*.c"}, "a/b/x.c", false, false},
		{[]string{"a/*.c"}, "a/x.c", false, true},
		{[]string{"a?b"}, "a/b", false, false},
		{[]string{"x/a?b"}, "x/a/b", false, false},
		{[]string{"x/a[/]b"}, "x/a/b", false, false},
		{[]string{"*.log", "!keep.log"}, "x/keep.log", false, false},
		{[]string{"!keep.log", "*.log"}, "keep.log", false, true}, // the last match wins
		{[]string{"out/", "!out/keep"}, "out/keep", false, true},  // no re-include under an ignored dir
		{[]string{"out/*", "!out/keep"}, "out/keep", false, false},
		{[]string{"out/*", "!out/keep"}, "out/other", false, true},
		{[]string{"*", "!*/", "!*.keep"}, "a/b/x.keep", false, false},
		{[]string{"*", "!*/", "!*.keep"}, "a/b/x.txt", false, true},
		{[]string{"#a"}, "#a", false, false},
		{[]string{`\#a`}, "#a", false, true},
		{[]string{`\!a`}, "!a", false, true},
		{[]string{"!a"}, "!a", false, false},
		{[]string{`foo\ `}, "foo ", false, true},
		{[]string{"foo   "}, "foo", false, true},
		{[]string{"foo   "}, "foo ", false, false},
		{[]string{"foo\t"}, "foo", false, false}, // tabs are not trimmed
		{[]string{" lead"}, " lead", false, true},
		{[]string{"[a-c]x"}, "bx", false, true},
		{[]string{"[a-c]x"}, "dx", false, false},
		{[]string{"[!a]x"}, "bx", false, true},
		{[]string{"[!a]x"}, "ax", false, false},
		{[]string{"[^a]x"}, "ax", false, false},
		{[]string{"[]a]x"}, "]x", false, true},
		{[]string{"[[:digit:]]*"}, "7up", false, true},
		{[]string{"[[:digit:]]*"}, "up", false, false},
		{[]string{"[abc"}, "[abc", false, false}, // malformed: never matches
		{[]string{`\*star`}, "*star", false, true},
		{[]string{`\*star`}, "xstar", false, false},
		{[]string{"?.txt"}, "é.txt", false, false}, // bytes, as git
		{[]string{"??.txt"}, "é.txt", false, true},
		{[]string{"crlf\r"}, "crlf", false, true},
		{[]string{"a\nb"}, "b", false, true},
		{[]string{".git/"}, ".git/config", false, true},
		{[]string{}, "x", false, false},
		{[]string{"*"}, "", true, false}, // the root is never matched
	}
	for _, tc := range cases {
		if got := CompilePatterns(tc.lines).Match(tc.path, tc.isDir); got != tc.want {
			t.Errorf("CompilePatterns(%q).Match(%q, %v) = %v, want %v", tc.lines, tc.path, tc.isDir, got, tc.want)
		}
	}
	var nilP *Patterns
	if nilP.Match("x", false) {
		t.Error("nil Patterns matched")
	}
}

func TestWildmatchGitVectors(t *testing.T) {
	// A selection of git's t/t3070-wildmatch.sh vectors (WM_PATHNAME column).
	cases := []struct {
		text, pat string
		want      bool
	}{
		{"foo", "foo", true}, {"foo", "fo", false}, {"foo/bar", "foo/bar", true},
		{"foo/bar", "foo/*", true}, {"foo/bba/arr", "foo/*", false}, {"foo/bba/arr", "foo/**", true},
		{"foo/bba/arr", "foo*", false}, {"foo/bba/arr", "foo**", false}, {"foo/bba/arr", "foo/*arr", false},
		{"foo/bba/arr", "foo/**arr", false}, {"foo/bba/arr", "foo/*z", false}, {"foo/bba/arr", "foo/**z", false},
		{"foo/bar", "foo?bar", false}, {"foo/bar", "foo[/]bar", false}, {"foo/bar", "f[^eiu][^eiu][^eiu][^eiu][^eiu]r", false},
		{"foo-bar", "f[^eiu][^eiu][^eiu][^eiu][^eiu]r", true}, {"foo", "**/foo", true}, {"XXX/foo", "**/foo", true},
		{"bar/baz/foo", "**/foo", true}, {"bar/baz/foo", "*/foo", false}, {"foo/bar/baz", "**/bar*", false},
		{"deep/foo/bar/baz", "**/bar/*", true}, {"deep/foo/bar/baz/", "**/bar/*", false}, {"deep/foo/bar/baz/", "**/bar/**", true},
		{"deep/foo/bar", "**/bar/*", false}, {"deep/foo/bar/", "**/bar/**", true}, {"foo/bar/baz", "**/bar**", false},
		{"foo/bar/baz/x", "*/bar/**", true}, {"deep/foo/bar/baz/x", "*/bar/**", false}, {"deep/foo/bar/baz/x", "**/bar/*/*", true},
		{"a/b/c", "a/**/b/c", true}, {"a/b", "a/**/b", true}, {"abc/def", "a*/d*", true},
		{"]", "]", true}, {"a]b", "a[]]b", true}, {"ab", "a[]]b", false}, {"a-b", "a[]-]b", true},
		{"a]b", "a[]a-]b", true}, {"aab", "a[]a-]b", true}, {"]", "[!]-]", false}, {"a", "[!]-]", true},
		{"-", "[-]", true}, {"-", "[,-.]", true}, {"-", "[\\-_]", true}, {"\\", "[\\\\-^]", true},
		{"[", "[\\\\-^]", false}, {"5", "[[:digit:][:upper:][:space:]]", true}, {"1", "[[:digit:][:upper:][:space:]]", true},
		{"a", "[[:digit:][:upper:][:space:]]", false}, {" ", "[[:digit:][:upper:][:space:]]", true},
		{"3", "[[:digit:]]", true}, {".", "[[:digit:]]", false}, {"a", "[[:alpha:]-[:digit:]]", true},
		{"3", "[[:alpha:]-[:digit:]]", true}, {"-", "[[:alpha:]-[:digit:]]", true}, {"a", "[[:foo:]]", false},
		{"a", "[[:alpha]", true}, {"b", "[[:alpha]", false}, {"[", "[[]", true}, {"a", "[[:alpha:][]", true},
		{"-adobe-courier-bold-o-normal--12-120-75-75-/-70-iso8859-1", "-*-*-*-*-*-*-12-*-*-*-m-*-*-*", false},
		{"XXX/adobe/courier/bold/o/normal//12/120/75/75/m/70/iso8859/1", "XXX/*/*/*/*/*/*/12/*/*/*/m/*/*/*", true},
		{"abcd/abcdefg/abcdefghijk/abcdefghijklmnop.txt", "**/*a*b*g*n*t", true},
		{"abcd/abcdefg/abcdefghijk/abcdefghijklmnop.txtz", "**/*a*b*g*n*t", false},
		{"foo", "*/*/*", false}, {"foo/bar", "*/*/*", false}, {"foo/bb/aa/rr", "*/*/*", false}, {"foo/bb/aa/rr", "**/**/**", true},
		{"abcXdefXghi", "*X*i", true}, {"ab/cXd/efXg/hi", "*X*i", false}, {"ab/cXd/efXg/hi", "*/*X*/*/*i", true},
		{"ab/cXd/efXg/hi", "**/*X*/**/*i", true},
		{strings.Repeat("a", 60) + "b", strings.Repeat("*a", 16), false}, // no exponential blow-up
	}
	for _, tc := range cases {
		if got := wildmatch(tc.pat, tc.text, true); got != tc.want {
			t.Errorf("wildmatch(%q, %q) = %v, want %v", tc.pat, tc.text, got, tc.want)
		}
	}
}

// giView snapshots ws and returns the head view.
func giView(t *testing.T, ws string) *View {
	t.Helper()
	s, _, err := Create(context.Background(), filepath.Join(tempDir(t), "ls"), ws, SnapshotOptions{})
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	return s.View(mustHead(t, s))
}

func TestIgnorerView(t *testing.T) {
	ws := filepath.Join(tempDir(t), "ws")
	files := map[string]string{
		".gitignore":     "*.tmp\nbuild/\n/.git/hooks\n",
		"sub/.gitignore": "!keep.tmp\nlocal\n",
		"sub/keep.tmp":   "", "sub/x.tmp": "", "sub/local": "", "local": "",
		"bin/.gitignore":       "\xff\xfe*\n", // not UTF-8: contributes nothing
		"bin/x":                "",
		"real-ignore":          "*\n",
		"lnk/x":                "",
		"dirgi/.gitignore/x":   "",
		"dirgi/y":              "",
		"bom/.gitignore":       "\ufeffbom\r\n",
		"bom/bom":              "",
		"build/out/.gitignore": "!*\n",
		"build/out/a":          "",
		".git/config":          "",
		".git/hooks/pre":       "",
		"a.tmp":                "",
	}
	for p, c := range files {
		writeFile(t, filepath.Join(ws, p), c, 0o644)
	}
	symlink(t, "../real-ignore", filepath.Join(ws, "lnk", ".gitignore"))
	v := giView(t, ws)
	ig := NewIgnorer(v)
	cases := []struct {
		path  string
		isDir bool
		want  bool
	}{
		{"a.tmp", false, true},
		{"sub/x.tmp", false, true},
		{"sub/keep.tmp", false, false}, // the deeper file wins
		{"sub/local", false, true},
		{"local", false, false},
		{"bin/x", false, false},
		{"lnk/x", false, false}, // symlinked .gitignore ignored
		{"dirgi/y", false, false},
		{"bom/bom", false, true},
		{"build", true, true},
		{"build/out/a", false, true}, // build/out/.gitignore is never consulted
		{".git/config", false, false},
		{".git/hooks/pre", false, true},
		{".gitignore", false, false},
		{"", true, false},
		{"nonexistent/deep/x.tmp", false, true},
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for _, tc := range cases {
				if got := ig.Ignored(tc.path, tc.isDir); got != tc.want {
					t.Errorf("Ignored(%q, %v) = %v, want %v", tc.path, tc.isDir, got, tc.want)
				}
			}
		})
	}
	wg.Wait()
	if NewIgnorer(nil).Ignored("a.tmp", false) {
		t.Error("nil view ignored a path")
	}
}

// giWalk lists every entry of v below the root, with its directory flag.
func giWalk(t *testing.T, v *View, dir string, out map[string]bool) {
	t.Helper()
	es, err := v.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range es {
		out[e.Path] = e.Kind == KindDir
		if e.Kind == KindDir {
			giWalk(t, v, e.Path, out)
		}
	}
}

// gitCheckIgnore asks real git which of paths are ignored in the work tree ws.
func gitCheckIgnore(t *testing.T, gitDir, ws string, paths []string) map[string]bool {
	t.Helper()
	var in bytes.Buffer
	for _, p := range paths {
		in.WriteString(p + "\x00")
	}
	cmd := exec.Command("git", "check-ignore", "--no-index", "-v", "-n", "-z", "--stdin")
	home := t.TempDir()
	cmd.Env = append(os.Environ(), "GIT_DIR="+gitDir, "GIT_WORK_TREE="+ws, "GIT_CONFIG_NOSYSTEM=1",
		"GIT_CONFIG_GLOBAL=/dev/null", "HOME="+home, "XDG_CONFIG_HOME="+home)
	cmd.Dir = ws
	cmd.Stdin = &in
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if ee, ok := err.(*exec.ExitError); err != nil && !(ok && ee.ExitCode() == 1) {
		t.Fatalf("git check-ignore: %v: %s", err, stderr.String())
	}
	fields := strings.Split(strings.TrimSuffix(string(out), "\x00"), "\x00")
	if len(fields) != 4*len(paths) {
		t.Fatalf("git check-ignore: %d fields for %d paths: %s", len(fields), len(paths), stderr.String())
	}
	res := make(map[string]bool, len(paths))
	for i := 0; i < len(fields); i += 4 {
		pat := fields[i+2]
		res[fields[i+3]] = pat != "" && pat[0] != '!'
	}
	return res
}

func giGitDir(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git not installed")
	}
	d := filepath.Join(t.TempDir(), "repo")
	if out, err := exec.Command("git", "init", "-q", d).CombinedOutput(); err != nil {
		t.Fatalf("git init: %v: %s", err, out)
	}
	return filepath.Join(d, ".git")
}

// gitStatusIgnored lists the ignored non-directories of ws per git status.
func gitStatusIgnored(t *testing.T, gitDir, ws string) map[string]bool {
	t.Helper()
	cmd := exec.Command("git", "status", "--porcelain", "-z", "--ignored=traditional", "--untracked-files=all")
	home := t.TempDir()
	cmd.Env = append(os.Environ(), "GIT_DIR="+gitDir, "GIT_WORK_TREE="+ws, "GIT_CONFIG_NOSYSTEM=1",
		"GIT_CONFIG_GLOBAL=/dev/null", "HOME="+home, "XDG_CONFIG_HOME="+home)
	cmd.Dir = ws
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("git status: %v", err)
	}
	res := make(map[string]bool)
	for _, rec := range strings.Split(string(out), "\x00") {
		if p, ok := strings.CutPrefix(rec, "!! "); ok {
			res[p] = true
		}
	}
	return res
}

// giCompare checks Ignored against git for every entry of the snapshot of ws.
func giCompare(t *testing.T, gitDir, ws string) (ig *Ignorer, entries map[string]bool, n int) {
	t.Helper()
	v := giView(t, ws)
	entries = make(map[string]bool)
	giWalk(t, v, "", entries)
	paths := make([]string, 0, len(entries))
	for p := range entries {
		paths = append(paths, p)
	}
	slices.Sort(paths)
	want := gitCheckIgnore(t, gitDir, ws, paths)
	status := gitStatusIgnored(t, gitDir, ws)
	ig = NewIgnorer(v)
	for _, p := range paths {
		got := ig.Ignored(p, entries[p])
		if got != want[p] {
			t.Errorf("Ignored(%q, dir=%v) = %v, git check-ignore says %v", p, entries[p], got, want[p])
		}
		if !entries[p] && got != status[p] {
			t.Errorf("Ignored(%q) = %v, git status says %v", p, got, status[p])
		}
	}
	return ig, entries, len(paths)
}

func TestGitignoreGitCrossCheck(t *testing.T) {
	gitDir := giGitDir(t)
	ws := filepath.Join(tempDir(t), "ws")
	gitignores := map[string]string{
		"": "# comment\n\\#hash\n\\!bang\n*.log\n!keep.log\nbuild/\n/rootonly\ndocs/*.tmp\n**/cache\nlogs/**\n" +
			"a/**/z\nfoo\\ \ntrail   \n*.o\n!important.o\nout/\n!out/keep.txt\nvendor\n!vendor/\n lead\n" +
			"[abc].txt\n[!x]y.md\n[a-c]range?\n*.[0-9]\ndironly/\nsub/inner/\n\\*star\nq\\?\n\\[x\\]\n" +
			"?.u\n*[[:digit:]]d\nfoo**/bar\n**/deep2/**\nmid/*/end\nnotdir/\n#*.c\nreinc/d/\n/h/[[:alpha]\nmid/m?end\n",
		"sub":       "!*.log\n*.txt\n!/keep.txt\ndeep/\n/anch\nx/y\n!cache\n",
		"sub/deep":  "!*\n",
		"sub/inner": "!*\n",
		"a":         "/b/c\n!z\n",
		"f":         "*\n!*/\n!*.keep\n!.gitignore\n",
		"g":         "**/x\n!/x\n*.log\n",
		"g/h":       "!*.log\n/only\n",
		"h":         "crlf\r\n  \r\n!\n/\n",
		"i":         "\ufeffbom\nmid/\n",
		"out":       "!*\n",
		"vendor":    "!keep.log\n",
		"logs":      "!x\n",
		"reinc":     "!d/\n",
		"trailbs":   "back\\\nsl\\\\\n",
	}
	dirs := []string{"", "sub", "sub/deep", "sub/inner", "sub/other", "sub/x", "a", "a/b", "a/x", "a/x/y",
		"f", "f/d1", "f/d1/d2", "g", "g/h", "g/x", "h", "i", "i/mid", "out", "vendor", "vendor/v", "logs",
		"logs/l", "build", "docs", "docs/n", "cache", "deep2", "mid", "mid/m", "foox", "foox/y",
		"trailbs", "dironly", "z", "reinc", "reinc/d"}
	names := []string{"x.log", "keep.log", "a.txt", "keep.txt", "z", "cache", "important.o", "b.o", "foo ",
		"trail", "#hash", "!bang", " lead", "rootonly", "anch", "x.tmp", "a.7", "xy.md", "ay.md", "brange1",
		"*star", "q?", "[x]", "é.u", "a.u", "x9d", "crlf", "bom", "only", "x", "y", "end", "bar", "back\\", "sl\\",
		"c", "a.c", "#a.c", "notdir", "dironly", "e.keep"}
	for _, d := range dirs {
		mkdir(t, filepath.Join(ws, d), 0o755)
	}
	for _, p := range []string{"a/x/z", "a/b/c", "sub/x/y", "sub/deep/keep.txt", "sub/inner/keep.log", "out/keep.txt",
		"out/sub/keep.txt", "vendor/v/a.log", "foox/y/bar", "foo/bar", "mid/m/end", "mid/end", "dironly/a", "deep2/q/r",
		"g/x/a", "g/h/x", "g/h/y.log", "g/h/only", "g/only", "f/d1/d2/a.keep", "f/d1/d2/a.txt", "f/d1/d2/.gitignore",
		"i/mid/a", "i/m/mid/a", "logs/l/x", "logs/x", "h/crlf", "h/ crlf", "i/bom", "trailbs/back\\", "trailbs/sl\\",
		"a.c", "#a.c", "é.u", "ab.u"} {
		writeFile(t, filepath.Join(ws, p), "", 0o644)
	}
	symlink(t, "mid", filepath.Join(ws, "notdir")) // a symlink is no directory for "notdir/"
	symlink(t, "../sub", filepath.Join(ws, "z", "dironly"))
	writeFile(t, filepath.Join(ws, "s", "real"), "*\n", 0o644)
	writeFile(t, filepath.Join(ws, "s", "ignored-if-followed"), "", 0o644)
	symlink(t, "real", filepath.Join(ws, "s", ".gitignore")) // git does not follow it either
	for _, d := range dirs {
		for _, n := range names {
			if _, err := os.Lstat(filepath.Join(ws, d, n)); err != nil {
				writeFile(t, filepath.Join(ws, d, n), "", 0o644)
			}
		}
	}
	for d, c := range gitignores {
		writeFile(t, filepath.Join(ws, d, ".gitignore"), c, 0o644)
	}
	ig, entries, n := giCompare(t, gitDir, ws)
	if n < 200 {
		t.Fatalf("only %d paths compared", n)
	}
	var ignored int
	for p, isDir := range entries {
		if ig.Ignored(p, isDir) {
			ignored++
		}
	}
	t.Logf("compared %d paths with git check-ignore (%d ignored)", n, ignored)
	if ignored == 0 || ignored == n {
		t.Fatalf("degenerate tree: %d of %d ignored", ignored, n)
	}
}

func TestGitignoreGitFuzz(t *testing.T) {
	gitDir := giGitDir(t)
	rng := rand.New(rand.NewSource(20240611))
	comps := []string{"a", "b", "ab", "x.log", "y.txt", "c"}
	globs := []string{"a", "b", "ab", "*", "**", "?", "[ab]", "[!a]*", "*.log", "x*", "c", "*b", "a?", "[a-b]*", "**"}
	var total int
	for round := range 60 {
		ws := filepath.Join(tempDir(t), "ws")
		var dirs []string
		var walk func(dir string, depth int)
		walk = func(dir string, depth int) {
			dirs = append(dirs, dir)
			for _, c := range comps {
				p := filepath.Join(dir, c)
				switch r := rng.Intn(4); {
				case depth < 3 && r == 0:
					walk(p, depth+1)
				case r <= 2:
					writeFile(t, filepath.Join(ws, p), "", 0o644)
				}
			}
		}
		walk("", 0)
		rootOnly := round%2 == 0
		var rootLines []string
		for i, d := range dirs {
			if i > 0 && (rootOnly || rng.Intn(3) != 0) {
				continue
			}
			var lines []string
			for range 1 + rng.Intn(6) {
				var b strings.Builder
				if rng.Intn(3) == 0 {
					b.WriteString("!")
				}
				if rng.Intn(4) == 0 {
					b.WriteString("/")
				}
				for k := range 1 + rng.Intn(3) {
					if k > 0 {
						b.WriteString("/")
					}
					b.WriteString(globs[rng.Intn(len(globs))])
				}
				if rng.Intn(3) == 0 {
					b.WriteString("/")
				}
				lines = append(lines, b.String())
			}
			if i == 0 {
				rootLines = lines
			}
			writeFile(t, filepath.Join(ws, d, ".gitignore"), strings.Join(lines, "\n")+"\n", 0o644)
		}
		ig, entries, n := giCompare(t, gitDir, ws)
		total += n
		if rootOnly {
			p := CompilePatterns(rootLines)
			for path, isDir := range entries {
				if p.Match(path, isDir) != ig.Ignored(path, isDir) {
					t.Errorf("round %d: Patterns%q.Match(%q) disagrees with Ignorer", round, rootLines, path)
				}
			}
		}
		if t.Failed() {
			t.Fatalf("round %d failed; root .gitignore %q", round, rootLines)
		}
	}
	t.Logf("compared %d paths with git check-ignore over 60 random trees", total)
}
