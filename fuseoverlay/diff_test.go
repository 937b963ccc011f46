package fuseoverlay

import (
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestDifferentialKernel runs the same operations on the kernel overlay
// (userxattr mode, in this user namespace) and on this driver, then
// compares the merged views, the commands' outcomes and the upper
// directories in their on-disk encoding.
func TestDifferentialKernel(t *testing.T) {
	requireNS(t)
	lowers := []tree{
		{"a": "A1", "d/": "", "d/n": "n", "gone": "=wh", "o/": "opq", "o/t": "t"},
		{"a": "A0", "b": "B", "gone": "G", "d/old": "o", "d/sub/x": "x", "o/h": "h", "e/": "", "e/f": "f", "s": "->b"},
	}
	steps := []string{
		"echo more >> a",
		"rm b",
		"mkdir newd && echo 1 > newd/f",
		"mv d/n d/n2",
		"mv d dd", // EXDEV: lower content
		"mv e e2", // coreutils falls back to copy + delete
		"rm -r o && mkdir o && echo z > o/z",
		"echo 3 > gone",
		"chmod 600 d/old",
		"ln -s a newlink",
		"ln a hard",
		"truncate -s 1 d/sub/x",
		"mv newd newd2",
		"rm s",
		"touch -d 2001-01-01 dd 2>/dev/null; true",
		"mkdir d/sub/y && rmdir d/sub/y",
		"mv a b",
	}
	type result struct {
		outcomes []string
		merged   string
		upper    string
	}
	run := func(mnt, upper string) result {
		var r result
		for _, s := range steps {
			cmd := exec.Command("sh", "-c", s)
			cmd.Dir = mnt
			out, err := cmd.CombinedOutput()
			msg := "ok"
			if err != nil {
				// Keep only the errno text: tools print paths that differ.
				msg = "fail"
				if i := strings.LastIndex(string(out), ": "); i >= 0 {
					msg += strings.TrimSpace(string(out[i:]))
				}
			}
			r.outcomes = append(r.outcomes, s+" => "+msg)
		}
		r.merged = walk(t, mnt)
		return r
	}

	// Kernel overlay.
	kbase := t.TempDir()
	var kl []string
	for i, lt := range lowers {
		d := filepath.Join(kbase, "l"+string(rune('0'+i)))
		must(t, os.Mkdir(d, 0o755))
		build(t, d, lt)
		kl = append(kl, d)
	}
	ku, kw, km := filepath.Join(kbase, "u"), filepath.Join(kbase, "w"), filepath.Join(kbase, "m")
	for _, d := range []string{ku, kw, km} {
		must(t, os.Mkdir(d, 0o755))
	}
	opts := "lowerdir=" + strings.Join(kl, ":") + ",upperdir=" + ku + ",workdir=" + kw + ",userxattr"
	if err := unix.Mount("overlay", km, "overlay", 0, opts); err != nil {
		t.Skipf("kernel overlay not mountable here: %v", err)
	}
	kr := run(km, ku)
	must(t, unix.Unmount(km, 0))
	kr.upper = renderUpper(t, ku)

	f := mountLayers(t, lowers, nil)
	fr := run(f.mnt, f.upper)
	f.unmount()
	fr.upper = renderUpper(t, f.upper)

	for i := range steps {
		if kr.outcomes[i] != fr.outcomes[i] {
			t.Errorf("outcome differs:\n kernel: %s\n fuse:   %s", kr.outcomes[i], fr.outcomes[i])
		}
	}
	if kr.merged != fr.merged {
		t.Errorf("merged view differs:\nkernel:\n%s\nfuse:\n%s", kr.merged, fr.merged)
	}
	if kr.upper != fr.upper {
		t.Errorf("upper differs:\nkernel:\n%s\nfuse:\n%s", kr.upper, fr.upper)
	}
}

// renderUpper renders an upper dir in terms of the overlay format: kinds
// (whiteout, opaque dir, dir, symlink, file+content), ignoring the
// kernel's bookkeeping xattrs (origin, impure).
func renderUpper(t *testing.T, root string) string {
	t.Helper()
	var lines []string
	err := filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if p == root {
			return nil
		}
		r, _ := filepath.Rel(root, p)
		k := upperKind(t, p)
		if k == "file" {
			b, _ := os.ReadFile(p)
			k += " " + string(b) + " " + fi.Mode().Perm().String()
		}
		lines = append(lines, r+" "+k)
		return nil
	})
	must(t, err)
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}
