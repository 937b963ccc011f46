package fuseoverlay

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/ephemeral-ai-lab/sandbox/internal/upperfmtcases"
	"golang.org/x/sys/unix"
)

// TestUpperFormatConformance reads every case of the shared upper-format
// table with this package's fd-based readers; layers' test reads the same
// table with layers/upperfmt.go, so the two cannot drift apart.
func TestUpperFormatConformance(t *testing.T) {
	writers := upperfmtcases.Writers{
		Whiteout: func(dir, name string) error {
			return withDirFD(dir, func(fd int) error { return makeWhiteout(fd, name) })
		},
		Opaque: func(dir, name string) error {
			if err := os.Mkdir(filepath.Join(dir, name), 0o755); err != nil {
				return err
			}
			return withDirFD(dir, func(fd int) error { return setOpaque(fd, name) })
		},
	}
	names := map[int]string{namePlain: "plain", nameOCIWhiteout: "oci_whiteout", nameOpaqueMarker: "opaque_marker"}
	for _, c := range upperfmtcases.Load(t) {
		t.Run(c.Name, func(t *testing.T) {
			parent := upperfmtcases.Build(t, c, writers)
			err := withDirFD(parent, func(fd int) error {
				var st unix.Stat_t
				if err := fstatat(fd, c.Entry, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
					return err
				}
				if c.IsDir() {
					if got := isOpaque(fd, c.Entry); got != c.Want.OpaqueLayer {
						t.Errorf("isOpaque = %v, want %v", got, c.Want.OpaqueLayer)
					}
				} else if got := isWhiteout(fd, c.Entry, &st); got != c.Want.Whiteout {
					t.Errorf("isWhiteout = %v, want %v", got, c.Want.Whiteout)
				}
				kind, target := parseName(c.Entry)
				if names[kind] != c.Want.Name || target != c.Want.Target {
					t.Errorf("parseName = %s %q, want %s %q", names[kind], target, c.Want.Name, c.Want.Target)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}

func withDirFD(dir string, fn func(fd int) error) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return fn(fd)
}
