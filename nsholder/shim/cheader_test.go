package shim

import (
	"bytes"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
)

// TestCHeaderIsCurrent fails when the committed header of the C exec shim
// is not what the tables produce now.
func TestCHeaderIsCurrent(t *testing.T) {
	want, err := CHeader()
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join("..", "..", CHeaderPath))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s is stale: run go generate ./nsholder/shim", CHeaderPath)
	}
}

// TestSeccompArchNumbers holds every number of every table to
// golang.org/x/sys/unix's table of that architecture (its
// zsysnum_linux_<arch>.go, read as source so that all architectures are
// checked on any machine), and every name of an Absent list to its absence.
func TestSeccompArchNumbers(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", "{{.Dir}}", "golang.org/x/sys/unix").Output()
	if err != nil {
		t.Fatalf("go list golang.org/x/sys/unix: %v", err)
	}
	dir := strings.TrimSpace(string(out))
	for goarch, arch := range seccompArches {
		t.Run(goarch, func(t *testing.T) {
			nums := sysnums(t, filepath.Join(dir, "zsysnum_linux_"+goarch+".go"))
			for name, n := range arch.Syscalls {
				want, ok := nums["SYS_"+strings.ToUpper(name)]
				if !ok || want != n {
					t.Errorf("%s: %s = %d, x/sys/unix has %d (present %v)", arch.Name, name, n, want, ok)
				}
			}
			for name := range arch.Absent {
				if n, ok := nums["SYS_"+strings.ToUpper(name)]; ok {
					t.Errorf("%s: %s listed absent, x/sys/unix has it as %d", arch.Name, name, n)
				}
			}
			for _, r := range seccompRules {
				if _, ok := arch.Syscalls[r.Name]; !ok && !arch.Absent[r.Name] {
					t.Errorf("%s: rule %s has no number", arch.Name, r.Name)
				}
			}
		})
	}
}

// sysnums parses the SYS_* constants of one x/sys/unix source file.
func sysnums(t *testing.T, file string) map[string]uint32 {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), file, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	nums := map[string]uint32{}
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, spec := range g.Specs {
			v := spec.(*ast.ValueSpec)
			for i, name := range v.Names {
				if i >= len(v.Values) {
					continue
				}
				lit, ok := v.Values[i].(*ast.BasicLit)
				if !ok || lit.Kind != token.INT {
					continue
				}
				n, err := strconv.ParseUint(lit.Value, 0, 32)
				if err != nil {
					t.Fatalf("%s: %s = %s: %v", file, name.Name, lit.Value, err)
				}
				nums[name.Name] = uint32(n)
			}
		}
	}
	if len(nums) < 100 {
		t.Fatalf("%s: only %d system call numbers", file, len(nums))
	}
	return nums
}

// TestCHeaderSelectsNativeProgram compiles the header for this machine and
// checks that the program the C compiler selects is the one the Go shim
// installs here, and that its mask is keptCapMask.
func TestCHeaderSelectsNativeProgram(t *testing.T) {
	if nativeSeccompArch == nil {
		t.Skipf("no seccomp table for %s", runtime.GOARCH)
	}
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "cc"
	}
	if _, err := exec.LookPath(cc); err != nil {
		if os.Getenv("ESBX_REQUIRE_ALL") == "1" {
			t.Fatalf("ESBX_REQUIRE_ALL=1: no C compiler %q", cc)
		}
		t.Skipf("no C compiler %q", cc)
	}
	hdr, err := filepath.Abs(filepath.Join("..", "..", CHeaderPath))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	src := `#include <stdio.h>
#include "` + hdr + `"
int main(void) {
	printf("%s %llx\n", SHIM_SECCOMP_ARCH, (unsigned long long)SHIM_KEPT_CAPS);
	for (unsigned i = 0; i < sizeof shim_seccomp_filter / sizeof shim_seccomp_filter[0]; i++)
		printf("%x %d %d %x\n", shim_seccomp_filter[i].code, shim_seccomp_filter[i].jt,
		       shim_seccomp_filter[i].jf, shim_seccomp_filter[i].k);
	return 0;
}
`
	if err := os.WriteFile(filepath.Join(dir, "dump.c"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, err := exec.Command(cc, "-Wall", "-o", filepath.Join(dir, "dump"), filepath.Join(dir, "dump.c")).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", cc, err, b)
	}
	got, err := exec.Command(filepath.Join(dir, "dump")).Output()
	if err != nil {
		t.Fatal(err)
	}
	prog, err := buildSeccompFilter(nativeSeccompArch)
	if err != nil {
		t.Fatal(err)
	}
	var want strings.Builder
	want.WriteString(nativeSeccompArch.Name + " " + strconv.FormatUint(keptCapMask(), 16) + "\n")
	for _, in := range prog {
		want.WriteString(strconv.FormatUint(uint64(in.Code), 16) + " " + strconv.Itoa(int(in.Jt)) + " " +
			strconv.Itoa(int(in.Jf)) + " " + strconv.FormatUint(uint64(in.K), 16) + "\n")
	}
	if string(got) != want.String() {
		t.Errorf("the C header's program differs from the Go one:\n%s\nwant:\n%s", got, want.String())
	}
}
