package console

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io/fs"
	"os"
	"strings"
	"testing"
)

// TestVendoredMatchesLockfile is the CI check of the vendored libraries:
// every file under assets/vendor is listed in its MANIFEST with the version
// package-lock.json pins and the file's own checksum, and every package the
// lockfile pins directly is vendored. A library updated in package.json
// without `make ui`, or a hand-edited dist file, fails here.
func TestVendoredMatchesLockfile(t *testing.T) {
	lockb, err := os.ReadFile("package-lock.json")
	if err != nil {
		t.Fatal(err)
	}
	var lock struct {
		Packages map[string]struct {
			Version      string            `json:"version"`
			Dependencies map[string]string `json:"dependencies"`
		} `json:"packages"`
	}
	if err := json.Unmarshal(lockb, &lock); err != nil {
		t.Fatalf("package-lock.json: %v", err)
	}
	direct := lock.Packages[""].Dependencies
	if len(direct) == 0 {
		t.Fatal("package-lock.json names no direct dependencies")
	}
	files := Assets()
	mf, err := fs.ReadFile(files, "vendor/MANIFEST")
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	seen := map[string]bool{}
	sc := bufio.NewScanner(strings.NewReader(string(mf)))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 4 {
			t.Fatalf("MANIFEST line %q: want package version sha256 file", sc.Text())
		}
		pkg, ver, sum, name := f[0], f[1], f[2], f[3]
		locked, ok := lock.Packages["node_modules/"+pkg]
		if !ok || direct[pkg] == "" {
			t.Errorf("%s: package %s is not a direct dependency in package-lock.json", name, pkg)
		} else if locked.Version != ver {
			t.Errorf("%s: vendored from %s %s, lockfile pins %s (run make ui)", name, pkg, ver, locked.Version)
		}
		b, err := fs.ReadFile(files, "vendor/"+name)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if h := sha256.Sum256(b); hex.EncodeToString(h[:]) != sum {
			t.Errorf("%s: checksum differs from MANIFEST (edited by hand? run make ui)", name)
		}
		listed[name] = true
		seen[pkg] = true
	}
	for pkg := range direct {
		if !seen[pkg] {
			t.Errorf("package %s is in the lockfile but not vendored (run make ui)", pkg)
		}
	}
	err = fs.WalkDir(files, "vendor", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || p == "vendor/MANIFEST" {
			return err
		}
		if !listed[strings.TrimPrefix(p, "vendor/")] {
			t.Errorf("%s is not in MANIFEST", p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
