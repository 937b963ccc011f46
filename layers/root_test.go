package layers

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ephemeral-ai-lab/sandbox/internal/beneath"
	"golang.org/x/sys/unix"
)

const hostMarker = "host-secret-marker"

// hostDirWithSecret is a directory outside every root of the tests, with
// file holding hostMarker (and a user xattr where they are supported).
func hostDirWithSecret(t *testing.T) string {
	t.Helper()
	host := filepath.Join(tempDir(t), "host")
	writeFile(t, filepath.Join(host, "file"), hostMarker+"\n", 0o644)
	_ = unix.Lsetxattr(filepath.Join(host, "file"), "user.secret", []byte(hostMarker), 0)
	return host
}

// forResolvers runs body with openat2 and with the per-component walk that
// replaces it where the kernel lacks it.
func forResolvers(t *testing.T, body func(t *testing.T)) {
	for _, name := range []string{"openat2", "walk"} {
		t.Run(name, func(t *testing.T) {
			if name == "walk" {
				prev := resolve
				resolve = beneath.Walk
				t.Cleanup(func() { resolve = prev })
			}
			body(t)
		})
	}
}

// TestRootNeverFollowsSymlinks: a symlink in any component of a path below
// a Root is refused with ErrSymlink (and ELOOP), whether it points outside
// the root or inside it; nothing is read through it.
func TestRootNeverFollowsSymlinks(t *testing.T) {
	host := hostDirWithSecret(t)
	top := filepath.Join(tempDir(t), "top")
	writeFile(t, filepath.Join(top, "real", "file"), "inside\n", 0o644)
	writeFile(t, filepath.Join(top, "real", "sub", "deep"), "deep", 0o644)
	writeFile(t, filepath.Join(top, "f"), "f\n", 0o644)
	symlink(t, "real", filepath.Join(top, "in"))
	symlink(t, host, filepath.Join(top, "out"))
	symlink(t, "..", filepath.Join(top, "real", "up"))
	symlink(t, filepath.Join(host, "file"), filepath.Join(top, "real", "outfile"))

	forResolvers(t, func(t *testing.T) {
		r, err := OpenRoot(top)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		type op func(rel string) (string, error)
		read := func(rel string) (string, error) { b, err := r.ReadFile(rel); return string(b), err }
		open := func(rel string) (string, error) {
			f, err := r.Open(rel)
			if err != nil {
				return "", err
			}
			defer f.Close()
			b, err := io.ReadAll(f)
			return string(b), err
		}
		lstat := func(rel string) (string, error) {
			fi, err := r.Lstat(rel)
			if err != nil {
				return "", err
			}
			return fi.Mode().String(), nil
		}
		readDir := func(rel string) (string, error) {
			fis, err := r.ReadDir(rel)
			var names []string
			for _, fi := range fis {
				names = append(names, fi.Name())
			}
			return strings.Join(names, ","), err
		}
		openDir := func(rel string) (string, error) {
			d, err := r.OpenDir(rel)
			if err != nil {
				return "", err
			}
			defer d.Close()
			names, err := d.Names()
			return strings.Join(names, ","), err
		}
		readlink := r.Readlink
		xattr := func(rel string) (string, error) {
			v, ok := r.Getxattr(rel, "user.secret")
			if ok {
				return v, nil
			}
			return "", fs.ErrNotExist
		}
		cases := []struct {
			what    string
			op      op
			rel     string
			want    string
			wantErr error
		}{
			{"read", read, "real/file", "inside\n", nil},
			{"read", read, "real/sub/deep", "deep", nil},
			{"read through an outside link", read, "out/file", "", ErrSymlink},
			{"read through an inside link", read, "in/file", "", ErrSymlink},
			{"read through a link to ..", read, "real/up/f", "", ErrSymlink},
			{"read a final link", read, "real/outfile", "", ErrSymlink},
			{"read a directory", read, "real", "", ErrNotRegular},
			{"open through an outside link", open, "out/file", "", ErrSymlink},
			{"open a final link", open, "out", "", ErrSymlink},
			{"open below a file", open, "f/x", "", unix.ENOTDIR},
			{"open a missing file", open, "missing", "", fs.ErrNotExist},
			{"open ..", open, "../top/f", "", fs.ErrInvalid},
			{"open an absolute path", open, "/etc/passwd", "", fs.ErrInvalid},
			{"open an empty component", open, "real//file", "", fs.ErrInvalid},
			{"lstat a link", lstat, "out", "Lrwxrwxrwx", nil},
			{"lstat through a link", lstat, "out/file", "", ErrSymlink},
			{"lstat through an inside link", lstat, "in/sub/deep", "", ErrSymlink},
			{"lstat", lstat, "real/sub/deep", "-rw-r--r--", nil},
			{"readdir", readDir, "real", "file,outfile,sub,up", nil},
			{"readdir a link", readDir, "out", "", ErrSymlink},
			{"opendir a link", openDir, "in", "", ErrSymlink},
			{"opendir through a link", openDir, "real/up/real", "", ErrSymlink},
			{"readlink", readlink, "out", host, nil},
			{"readlink through a link", readlink, "in/up", "", ErrSymlink},
			{"xattr through a link", xattr, "out/file", "", fs.ErrNotExist},
			{"xattr of a final link", xattr, "real/outfile", "", fs.ErrNotExist},
		}
		for _, c := range cases {
			got, err := c.op(c.rel)
			if strings.Contains(got, hostMarker) || (err != nil && strings.Contains(err.Error(), hostMarker)) {
				t.Errorf("%s %q: read the host file: %q %v", c.what, c.rel, got, err)
			}
			switch {
			case c.wantErr == nil && err != nil:
				t.Errorf("%s %q: %v", c.what, c.rel, err)
			case c.wantErr != nil && !errors.Is(err, c.wantErr):
				t.Errorf("%s %q: got %q, %v; want %v", c.what, c.rel, got, err, c.wantErr)
			case c.wantErr == nil && got != c.want:
				t.Errorf("%s %q: got %q, want %q", c.what, c.rel, got, c.want)
			}
			if errors.Is(c.wantErr, ErrSymlink) && !errors.Is(err, unix.ELOOP) {
				t.Errorf("%s %q: %v is not ELOOP", c.what, c.rel, err)
			}
		}

		// Walk visits links as links and never enters them.
		var seen []string
		err = r.Walk(context.Background(), func(rel string, fi fs.FileInfo) error {
			seen = append(seen, rel+" "+fi.Mode().Type().String())
			return nil
		})
		want := []string{"f ----------", "in L---------", "out L---------", "real d---------", "real/file ----------",
			"real/outfile L---------", "real/sub d---------", "real/sub/deep ----------", "real/up L---------"}
		if err != nil || !slices.Equal(seen, want) {
			t.Errorf("walk: %v\n got  %q\n want %q", err, seen, want)
		}
		// One Root serves any number of listings of its top.
		for range 2 {
			if got, err := readDir(""); err != nil || got != "f,in,out,real" {
				t.Errorf("readdir of the root: %q %v", got, err)
			}
		}
	})

	// The root itself must not be a symlink; a closed Root refuses.
	if _, err := OpenRoot(filepath.Join(top, "in")); !errors.Is(err, ErrSymlink) && !errors.Is(err, unix.ENOTDIR) {
		t.Errorf("OpenRoot of a symlink: %v", err)
	}
	r, err := OpenRoot(top)
	if err != nil {
		t.Fatal(err)
	}
	r.Close()
	if _, err := r.Open("f"); err == nil {
		t.Error("Open after Close succeeded")
	}
}

// TestCaptureSymlinkToHostDir: an upper dir whose d is a link to a host
// directory captures d as a symlink and nothing below it; when d turns
// into such a link after the capture (a session swapping it), every reader
// of the captured writes refuses instead of reading the host file: digest,
// diff-style opens and publication.
func TestCaptureSymlinkToHostDir(t *testing.T) {
	host := hostDirWithSecret(t)
	forResolvers(t, func(t *testing.T) {
		upper := filepath.Join(tempDir(t), "upper")
		mkdir(t, upper, 0o755)
		symlink(t, host, filepath.Join(upper, "d"))
		cs, err := Capture(context.Background(), upper, nil)
		if err != nil {
			t.Fatal(err)
		}
		checkLines(t, "link to a host dir", fmtChanges(cs.Changes), []string{"symlink d -> " + host})
		cs.Close()

		// Captured while d was a directory, read after the swap.
		s := stdStack(t)
		base := mustHead(t, s)
		upper = filepath.Join(tempDir(t), "upper")
		writeFile(t, filepath.Join(upper, "d", "file"), "inside\n", 0o644)
		cs, err = Capture(context.Background(), upper, s.View(base))
		if err != nil {
			t.Fatal(err)
		}
		defer cs.Close()
		checkLines(t, "directory", fmtChanges(cs.Changes), []string{"directory d -rwxr-xr-x", "write d/file -rw-r--r--"})
		if err := os.Rename(filepath.Join(upper, "d"), filepath.Join(upper, "dreal")); err != nil {
			t.Fatal(err)
		}
		symlink(t, host, filepath.Join(upper, "d"))
		for _, c := range cs.Changes {
			if c.Kind != ChangeWrite {
				continue
			}
			if f, _, err := c.OpenSource(); !errors.Is(err, ErrSymlink) {
				if f != nil {
					b, _ := io.ReadAll(f)
					f.Close()
					t.Errorf("OpenSource %s after the swap read %q", c.Path, b)
				}
				t.Errorf("OpenSource %s after the swap: %v, want ErrSymlink", c.Path, err)
			}
		}
		if d, err := ComputeLayerDigest(cs.Changes); !errors.Is(err, ErrSymlink) {
			t.Errorf("digest after the swap: %q %v, want ErrSymlink", d, err)
		}
		before := mustHead(t, s)
		if _, _, err := s.PublishChangeset(context.Background(), base, cs, PublishOptions{Implicit: true}); !errors.Is(err, ErrSymlink) {
			t.Errorf("publish after the swap: %v, want ErrSymlink", err)
		}
		if after := mustHead(t, s); after.Version != before.Version {
			t.Errorf("publish after the swap committed %+v", after)
		}
		for p, v := range tree(t, s) {
			if strings.Contains(v, hostMarker) {
				t.Errorf("head holds the host file at %s", p)
			}
		}
	})
}
