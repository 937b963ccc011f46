package nsholder

import (
	"bufio"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// ShimLoader lets the Go exec shim (the holder's own binary in shim mode)
// start where the session root lacks the binary's dynamic loader and
// libraries: an image root, when the supervisor was built with cgo (what
// `go build` and `go install` do wherever a C compiler is installed) and
// sandbox-exec-shim is not installed next to it.
//
// The holder opens Interp and every Preload before pivot_root, like the
// binary itself, and execs the loader by descriptor:
//
//	/proc/self/fd/4 --preload "/proc/self/fd/5 …" /proc/self/fd/3 nsholder shim -- ARGV…
//
// The loader maps the host's libraries from those descriptors and satisfies
// the binary's DT_NEEDED entries by their sonames, so nothing of the host is
// visible in the root: the descriptors are regular files (no ".." to walk
// out of), read-only, and marked close-on-exec by the shim before the
// command runs. Needs glibc's ld.so 2.30 or later (--preload).
type ShimLoader struct {
	Interp  string   `json:"interp"`
	Preload []string `json:"preload"`
}

// GoShimLoader returns what the Go shim needs to start in a root without the
// host's libraries: nil for a static binary (it starts anywhere), else the
// loader of self (its PT_INTERP) and the shared libraries the running
// process mapped for it (from /proc/self/maps, kept when their soname is
// needed by self or by another kept library). self must be the running
// binary.
func GoShimLoader(self string) (*ShimLoader, error) {
	f, err := elf.Open(self)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", self, err)
	}
	defer f.Close()
	interp := ""
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			b := make([]byte, p.Filesz)
			if _, err := p.ReadAt(b, 0); err != nil {
				return nil, fmt.Errorf("read PT_INTERP of %s: %w", self, err)
			}
			interp = strings.TrimRight(string(b), "\x00")
		}
	}
	if interp == "" {
		return nil, nil // static: no loader, no libraries
	}
	need, err := f.ImportedLibraries()
	if err != nil {
		return nil, fmt.Errorf("read DT_NEEDED of %s: %w", self, err)
	}
	mapped, err := mappedFiles()
	if err != nil {
		return nil, err
	}
	// interp as mapped (a symlink such as /lib64/ld-linux-x86-64.so.2 is
	// mapped under its target's name): the loader is exec'd, not preloaded.
	interpReal, err := filepath.EvalSymlinks(interp)
	if err != nil {
		return nil, fmt.Errorf("dynamic loader %s: %w", interp, err)
	}
	bySoname := map[string]string{}
	sonameOf := map[string][]string{} // path → its DT_NEEDED
	for _, p := range mapped {
		if p == interpReal {
			continue
		}
		lf, err := elf.Open(p)
		if err != nil {
			continue // a mapped file that is not ELF (or gone): not a library of ours
		}
		names, _ := lf.DynString(elf.DT_SONAME)
		deps, _ := lf.ImportedLibraries()
		lf.Close()
		if len(names) == 1 {
			bySoname[names[0]] = p
			sonameOf[p] = deps
		}
	}
	l := &ShimLoader{Interp: interpReal}
	seen := map[string]bool{}
	for len(need) > 0 {
		n := need[0]
		need = need[1:]
		if seen[n] {
			continue
		}
		seen[n] = true
		p, ok := bySoname[n]
		if !ok {
			if filepath.Base(n) == filepath.Base(interp) {
				continue // the loader itself (libc needs it by soname)
			}
			return nil, fmt.Errorf("library %s of %s is not mapped by this process", n, self)
		}
		l.Preload = append(l.Preload, p)
		need = append(need, sonameOf[p]...)
	}
	return l, nil
}

// mappedFiles lists the distinct files mapped by this process, in order.
func mappedFiles() ([]string, error) {
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	seen := map[string]bool{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// address perms offset dev inode pathname
		fields := strings.Fields(sc.Text())
		if len(fields) < 6 || !strings.HasPrefix(fields[5], "/") || seen[fields[5]] {
			continue
		}
		seen[fields[5]] = true
		out = append(out, fields[5])
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read /proc/self/maps: %w", err)
	}
	if len(out) == 0 {
		return nil, errors.New("/proc/self/maps lists no file")
	}
	return out, nil
}

// loaderFds are the descriptors of the loader and its libraries, in the
// order a command's shim receives them (from shimFD+1).
func (r *sessionRoot) loaderFds() []uintptr {
	var out []uintptr
	for _, f := range r.loader {
		out = append(out, f.Fd())
	}
	return out
}
