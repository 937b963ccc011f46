package tests

// The package map as a test (the idea of Kubernetes' import-boss): the
// README's "Package map" table is the one statement of which package may
// import which; this test reads that table and `go list -json ./...` and
// fails on an import of ours the table does not allow, on a package the
// table does not name, and on a row that names no package. So the table and
// the code cannot drift apart: changing the layering means changing the
// README in the same commit.

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"slices"
	"strings"
	"testing"
)

const modulePath = "github.com/ephemeral-ai-lab/sandbox"

// pkgRule is one row of the table: the packages it covers and what they may
// import (module-relative patterns; "x/*" is every package below x).
type pkgRule struct {
	packages []string
	mayUse   []string
}

func matchPattern(pattern, pkg string) bool {
	if prefix, ok := strings.CutSuffix(pattern, "/*"); ok {
		return strings.HasPrefix(pkg, prefix+"/")
	}
	return pattern == pkg
}

// ruleFor is the row naming pkg exactly, else the row with the longest
// pattern covering it (so `cmd/sandbox-supervisor` widens `cmd/*`, and
// `cmd/internal/*` narrows it).
func ruleFor(rules []pkgRule, pkg string) (pkgRule, bool) {
	best, bestLen := -1, -1
	for i := range rules {
		for _, p := range rules[i].packages {
			if p == pkg {
				return rules[i], true
			}
			if matchPattern(p, pkg) && len(p) > bestLen {
				best, bestLen = i, len(p)
			}
		}
	}
	if best < 0 {
		return pkgRule{}, false
	}
	return rules[best], true
}

// checkImports returns one line per violation: a package without a row, an
// import its row does not allow, a row that covers no package.
func checkImports(rules []pkgRule, imports map[string][]string) []string {
	var bad []string
	used := map[string]bool{}
	pkgs := make([]string, 0, len(imports))
	for p := range imports {
		pkgs = append(pkgs, p)
	}
	slices.Sort(pkgs)
	for _, p := range pkgs {
		r, ok := ruleFor(rules, p)
		if !ok {
			bad = append(bad, fmt.Sprintf("%s: not in the package map", p))
			continue
		}
		for _, other := range rules {
			for _, q := range other.packages {
				if matchPattern(q, p) {
					used[q] = true
				}
			}
		}
		for _, imp := range imports[p] {
			if !slices.ContainsFunc(r.mayUse, func(pat string) bool { return matchPattern(pat, imp) }) {
				bad = append(bad, fmt.Sprintf("%s imports %s: the package map does not allow it", p, imp))
			}
		}
	}
	for _, r := range rules {
		for _, q := range r.packages {
			if !used[q] {
				bad = append(bad, fmt.Sprintf("%s: the package map names a package that does not exist", q))
			}
		}
	}
	return bad
}

// parsePackageMap reads the table under the README heading "## Package map":
// | package(s) | owns | may import | must never |. Packages and imports are
// the backquoted words of their cells; "nothing of ours" allows none.
func parsePackageMap(r io.Reader) ([]pkgRule, error) {
	var rules []pkgRule
	in := false
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "## ") {
			if in {
				break
			}
			in = line == "## Package map"
			continue
		}
		if !in || !strings.HasPrefix(line, "|") || strings.HasPrefix(line, "|---") || strings.HasPrefix(line, "| package") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		if len(cells) != 4 {
			return nil, fmt.Errorf("package map row %q: want 4 cells, have %d", line, len(cells))
		}
		r := pkgRule{packages: backquoted(cells[0]), mayUse: backquoted(cells[2])}
		if len(r.packages) == 0 {
			return nil, fmt.Errorf("package map row %q names no package", line)
		}
		if len(r.mayUse) == 0 && !strings.Contains(cells[2], "nothing of ours") {
			return nil, fmt.Errorf("package map row %q: say `nothing of ours` or name the imports", line)
		}
		rules = append(rules, r)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(rules) == 0 {
		return nil, fmt.Errorf("no \"## Package map\" table found")
	}
	return rules, nil
}

func backquoted(cell string) []string {
	var out []string
	parts := strings.Split(cell, "`")
	for i := 1; i < len(parts); i += 2 {
		out = append(out, strings.TrimSuffix(parts[i], "/"))
	}
	return out
}

// ourImports lists every package of the module with the module's packages it
// imports (non-test code: tests may reach further to set up a case).
func ourImports(t *testing.T) map[string][]string {
	t.Helper()
	cmd := exec.Command("go", "list", "-json", "./...")
	cmd.Dir = ".."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	type listed struct {
		ImportPath string
		Imports    []string
	}
	res := map[string][]string{}
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		var p listed
		if err := dec.Decode(&p); err != nil {
			t.Fatalf("decode go list: %v", err)
		}
		rel := relPkg(p.ImportPath)
		var ours []string
		for _, imp := range p.Imports {
			if r := relPkg(imp); r != imp {
				ours = append(ours, r)
			}
		}
		res[rel] = ours
	}
	return res
}

func relPkg(p string) string {
	if p == modulePath {
		return "."
	}
	if r, ok := strings.CutPrefix(p, modulePath+"/"); ok {
		return path.Clean(r)
	}
	return p
}

func TestPackageMap(t *testing.T) {
	f, err := os.Open("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rules, err := parsePackageMap(f)
	if err != nil {
		t.Fatalf("README: %v", err)
	}
	for _, v := range checkImports(rules, ourImports(t)) {
		t.Error(v)
	}
}

// TestPackageMapChecker shows the checker failing on what it must refuse.
func TestPackageMapChecker(t *testing.T) {
	const readme = "# x\n\n## Package map\n\n| package | owns | may import | must never |\n|---|---|---|---|\n" +
		"| `layers` | storage | nothing of ours | import the supervisor |\n" +
		"| `supervisor` | wiring | `supervisor/*`, `layers` | be imported |\n" +
		"| `supervisor/*` | domain | `layers` | import the root |\n" +
		"| `supervisor/web` | http | `supervisor/rpc` | import domain packages |\n\n## Next\n| `x` | y | z | w |\n"
	rules, err := parsePackageMap(strings.NewReader(readme))
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name    string
		imports map[string][]string
		want    []string
	}{
		{"allowed", map[string][]string{"layers": nil, "supervisor": {"supervisor/rpc", "layers"}, "supervisor/rpc": {"layers"},
			"supervisor/web": {"supervisor/rpc"}}, nil},
		{"upward import", map[string][]string{"layers": {"supervisor"}, "supervisor": nil, "supervisor/web": nil},
			[]string{"layers imports supervisor: the package map does not allow it"}},
		{"domain package imports the root", map[string][]string{"layers": nil, "supervisor": nil, "supervisor/web": nil,
			"supervisor/rpc": {"supervisor"}}, []string{"supervisor/rpc imports supervisor: the package map does not allow it"}},
		{"exact row wins over the pattern", map[string][]string{"layers": nil, "supervisor": nil,
			"supervisor/web": {"layers"}}, []string{"supervisor/web imports layers: the package map does not allow it"}},
		{"package without a row", map[string][]string{"layers": nil, "supervisor": nil, "supervisor/web": nil, "fuseoverlay": nil},
			[]string{"fuseoverlay: not in the package map"}},
		{"row without a package", map[string][]string{"supervisor": nil, "supervisor/web": nil},
			[]string{"layers: the package map names a package that does not exist"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := checkImports(rules, tc.imports)
			if !slices.Equal(got, tc.want) {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
	// supervisor/rpc/* allows what supervisor/* does not: the longer pattern decides.
	nested := append(slices.Clip(rules), pkgRule{packages: []string{"supervisor/rpc/*"}, mayUse: []string{"supervisor/rpc"}})
	if got := checkImports(nested, map[string][]string{"layers": nil, "supervisor": nil, "supervisor/web": nil,
		"supervisor/rpc/x": {"supervisor/rpc"}}); len(got) != 0 {
		t.Errorf("the longest pattern did not win: %q", got)
	}
	if _, err := parsePackageMap(strings.NewReader("## Package map\n| `a` | b | c |\n")); err == nil {
		t.Error("a row with 3 cells was accepted")
	}
	if _, err := parsePackageMap(strings.NewReader("## Package map\n| `a` | b | | d |\n")); err == nil {
		t.Error("a row with an empty import cell was accepted")
	}
}
