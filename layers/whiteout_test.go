package layers

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestWhiteoutFallbacks publishes deletes and an opaque directory with mknod
// refused (xattr form) and with xattrs refused too (OCI names); the merged
// view must hide the same paths in every case.
func TestWhiteoutFallbacks(t *testing.T) {
	tests := []struct {
		name      string
		noMknod   bool
		noXattr   bool
		wantEntry string // what the layer holds for the deleted docs/a.md
	}{
		{"chardev", false, false, "chardev"},
		{"xattr", true, false, "xattr"},
		{"oci", true, true, "oci"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if !tc.noMknod && !canMknodWhiteout(tempDir(t)) {
				t.Skip("mknod of 0:0 refused here")
			}
			if !tc.noXattr && !canUserXattr(tempDir(t)) {
				t.Skip("user xattrs unsupported here")
			}
			if tc.noMknod {
				mknod = func(string, uint32, int) error { return unix.EPERM }
				t.Cleanup(func() { mknod = unix.Mknod })
			}
			if tc.noXattr {
				fsetxattr = func(int, string, []byte, int) error { return unix.ENOTSUP }
				lsetxattr = func(string, string, []byte, int) error { return unix.ENOTSUP }
				t.Cleanup(func() { fsetxattr, lsetxattr = unix.Fsetxattr, unix.Lsetxattr })
			}
			s := newTestStack(t)
			changes := []Change{{Kind: ChangeDelete, Path: "docs/a.md"}, {Kind: ChangeOpaqueDir, Path: "src", Mode: 0o755}, write("src/only.go", "x", 0o644)}
			res := publish(t, s, changes...)
			layer := filepath.Join(s.Dir(), "layers", res.LayerID)
			switch tc.wantEntry {
			case "chardev", "xattr":
				fi, err := os.Lstat(filepath.Join(layer, "docs", "a.md"))
				if err != nil || !isWhiteoutFile(filepath.Join(layer, "docs", "a.md"), fi) {
					t.Fatalf("no whiteout in the layer: %v", err)
				}
				if isChar := fi.Mode()&os.ModeCharDevice != 0; isChar != (tc.wantEntry == "chardev") {
					t.Errorf("whiteout encoding: char device = %v", isChar)
				}
			case "oci":
				if _, err := os.Lstat(filepath.Join(layer, "docs", ".wh.a.md")); err != nil {
					t.Fatalf("no OCI whiteout: %v", err)
				}
			}
			_, markerErr := os.Lstat(filepath.Join(layer, "src", opaqueMarker))
			if wantMarker := tc.noXattr; (markerErr == nil) != wantMarker {
				t.Errorf("opaque marker present = %v, want %v", markerErr == nil, wantMarker)
			}
			v := s.View(mustHead(t, s))
			for _, gone := range []string{"docs/a.md", "src/main.go", "src/lib"} {
				if _, err := v.Lstat(gone); !isNotExist(err) {
					t.Errorf("%s visible: %v", gone, err)
				}
			}
			if es, _ := v.ReadDir("docs"); !equalStrings(entryNames(es), []string{"b.md"}) {
				t.Errorf("docs = %v", entryNames(es))
			}
			if es, _ := v.ReadDir("src"); !equalStrings(entryNames(es), []string{"only.go"}) {
				t.Errorf("src = %v", entryNames(es))
			}
			if again := publish(t, s, changes...); !again.NoOp {
				t.Error("identical republish was not a no-op")
			}
		})
	}
}
