package layers

import (
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/ephemeral-ai-lab/sandbox/internal/upperfmtcases"
	"golang.org/x/sys/unix"
)

// TestUpperFormatConformance reads every case of the shared upper-format
// table through each way layers reads the format — by host path (view,
// squash, update), beneath a Root (capture, the supervisor's upper-dir
// readers) and through a descriptor (export) — and requires the table's
// answer from each; fuseoverlay's test reads the same table with its twin.
func TestUpperFormatConformance(t *testing.T) {
	writers := upperfmtcases.Writers{
		Whiteout: MakeWhiteout,
		Opaque: func(dir, name string) error {
			p := filepath.Join(dir, name)
			if err := os.Mkdir(p, 0o755); err != nil {
				return err
			}
			return MakeOpaque(p)
		},
	}
	names := map[NameKind]string{NamePlain: "plain", NameOCIWhiteout: "oci_whiteout", NameOpaqueMarker: "opaque_marker"}
	for _, c := range upperfmtcases.Load(t) {
		t.Run(c.Name, func(t *testing.T) {
			parent := upperfmtcases.Build(t, c, writers)
			p := filepath.Join(parent, c.Entry)
			fi, err := os.Lstat(p)
			if err != nil {
				t.Fatal(err)
			}
			root, err := OpenRoot(parent)
			if err != nil {
				t.Fatal(err)
			}
			defer root.Close()
			top, err := root.OpenDir("")
			if err != nil {
				t.Fatal(err)
			}
			defer top.Close()
			rfi, err := top.Lstat(c.Entry)
			if err != nil {
				t.Fatal(err)
			}
			st := rfi.Sys().(*unix.Stat_t)

			if c.IsDir() {
				sub, err := top.OpenDir(c.Entry)
				if err != nil {
					t.Fatal(err)
				}
				defer sub.Close()
				fd, err := unix.Open(p, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
				if err != nil {
					t.Fatal(err)
				}
				defer unix.Close(fd)
				fdOp, err := fdOpaque(fd)
				if err != nil {
					t.Fatal(err)
				}
				for reader, got := range map[string]bool{
					"upper: IsUpperOpaque (Root)":  IsUpperOpaque(root, c.Entry),
					"upper: capture (Dir)":         hasOpaqueXattr(sub),
					"layer: IsLayerOpaque (path)":  IsLayerOpaque(p),
					"layer: fdOpaque (descriptor)": fdOp,
				} {
					want := c.Want.OpaqueLayer
					if reader[:5] == "upper" {
						want = c.Want.OpaqueUpper
					}
					if got != want {
						t.Errorf("%s = %v, want %v", reader, got, want)
					}
				}
			} else {
				for reader, got := range map[string]bool{
					"IsLayerWhiteout (path)":     IsLayerWhiteout(p, fi),
					"IsUpperWhiteout (Root)":     IsUpperWhiteout(root, c.Entry, st),
					"capture isWhiteoutAt (Dir)": isWhiteoutAt(top, c.Entry, rfi),
					"IsWhiteout (Root's stat)":   IsLayerWhiteout(p, rfi),
				} {
					if got != c.Want.Whiteout {
						t.Errorf("%s = %v, want %v", reader, got, c.Want.Whiteout)
					}
				}
			}
			kind, target := ParseName(LayerFormat, c.Entry)
			if names[kind] != c.Want.Name || target != c.Want.Target {
				t.Errorf("ParseName(LayerFormat) = %s %q, want %s %q", names[kind], target, c.Want.Name, c.Want.Target)
			}
			if kind, _ := ParseName(UpperFormat, c.Entry); kind != NamePlain {
				t.Errorf("ParseName(UpperFormat) = %s, want plain: an upper never reads names", names[kind])
			}
		})
	}
}

// TestCarrierRule: an upper directory is a carrier only when it is not
// opaque and the base has a directory with exactly its mode; a carrier
// written for a parent takes the base's mode (else 0755).
func TestCarrierRule(t *testing.T) {
	dir := func(m fs.FileMode) *Entry { return &Entry{Kind: KindDir, Mode: m} }
	for _, tc := range []struct {
		name     string
		opaque   bool
		mode     fs.FileMode
		base     *Entry
		carrier  bool
		makeMode fs.FileMode
	}{
		{"same mode", false, 0o755, dir(0o755), true, 0o755},
		{"sticky kept", false, 0o777 | fs.ModeSticky, dir(0o777 | fs.ModeSticky), true, 0o777 | fs.ModeSticky},
		{"other mode", false, 0o700, dir(0o755), false, 0o755},
		{"opaque", true, 0o755, dir(0o755), false, 0o755},
		{"no base", false, 0o755, nil, false, 0o755},
		{"base file", false, 0o644, &Entry{Kind: KindFile, Mode: 0o644}, false, 0o755},
	} {
		if got := IsCarrier(tc.opaque, tc.mode, tc.base); got != tc.carrier {
			t.Errorf("%s: IsCarrier = %v, want %v", tc.name, got, tc.carrier)
		}
		if got := CarrierMode(tc.base); got != tc.makeMode {
			t.Errorf("%s: CarrierMode = %v, want %v", tc.name, got, tc.makeMode)
		}
	}
}
