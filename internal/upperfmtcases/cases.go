package upperfmtcases

import (
	_ "embed"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

//go:embed testdata/cases.json
var casesJSON []byte

// Case is one entry of the table, built by Build.
type Case struct {
	Name     string            `json:"name"`
	Entry    string            `json:"entry"` // its name in the parent
	Type     string            `json:"type"`  // chardev0 file dir symlink fifo make_whiteout make_opaque
	Size     int               `json:"size"`
	Xattrs   map[string]string `json:"xattrs"`
	Children []Child           `json:"children"`
	Needs    []string          `json:"needs"` // mknod user_xattr trusted_xattr
	Want     Want              `json:"want"`
}

// Child is an entry created inside a dir case.
type Child struct {
	Name string `json:"name"`
	Type string `json:"type"` // file or chardev0
}

// Want is what every reader must answer.
type Want struct {
	Whiteout    bool   `json:"whiteout"`
	OpaqueUpper bool   `json:"opaque_upper"`
	OpaqueLayer bool   `json:"opaque_layer"`
	Name        string `json:"name"` // plain oci_whiteout opaque_marker
	Target      string `json:"target"`
}

// IsDir reports whether the case builds a directory.
func (c Case) IsDir() bool { return c.Type == "dir" || c.Type == "make_opaque" }

// Load returns the table.
func Load(t testing.TB) []Case {
	t.Helper()
	var doc struct {
		Cases []Case `json:"cases"`
	}
	if err := json.Unmarshal(casesJSON, &doc); err != nil {
		t.Fatalf("upper-format cases: %v", err)
	}
	return doc.Cases
}

// Writers are a package's own ways of writing the format, for the make_*
// cases: a whiteout named name in dir, and an opaque directory named name
// in dir (created by the writer or before it, as the package does).
type Writers struct {
	Whiteout func(dir, name string) error
	Opaque   func(dir, name string) error
}

// Build creates c in a new empty directory and returns that parent. A case
// whose needs the host lacks is skipped, or fails when ESBX_REQUIRE_ALL=1
// (trusted xattrs are never settable without privilege: always skipped).
func Build(t *testing.T, c Case, w Writers) string {
	t.Helper()
	parent := t.TempDir()
	for _, need := range c.Needs {
		if ok, why := can(parent, need); !ok {
			if need == "trusted_xattr" || os.Getenv("ESBX_REQUIRE_ALL") != "1" {
				t.Skipf("%s: %s", need, why)
			}
			t.Fatalf("ESBX_REQUIRE_ALL=1 but %s: %s", need, why)
		}
	}
	p := filepath.Join(parent, c.Entry)
	var err error
	switch c.Type {
	case "chardev0":
		err = unix.Mknod(p, unix.S_IFCHR, 0)
	case "file":
		err = os.WriteFile(p, make([]byte, c.Size), 0o644)
	case "dir":
		err = os.Mkdir(p, 0o755)
		for _, ch := range c.Children {
			if err != nil {
				break
			}
			cp := filepath.Join(p, ch.Name)
			switch ch.Type {
			case "chardev0":
				err = unix.Mknod(cp, unix.S_IFCHR, 0)
			default:
				err = os.WriteFile(cp, nil, 0o644)
			}
		}
	case "symlink":
		err = os.Symlink("target", p)
	case "fifo":
		err = unix.Mkfifo(p, 0o644)
	case "make_whiteout":
		err = w.Whiteout(parent, c.Entry)
	case "make_opaque":
		err = w.Opaque(parent, c.Entry)
	default:
		err = errors.New("unknown type " + c.Type)
	}
	if err != nil {
		t.Fatalf("build %q: %v", c.Name, err)
	}
	for k, v := range c.Xattrs {
		if err := unix.Lsetxattr(p, k, []byte(v), 0); err != nil {
			t.Fatalf("build %q: setxattr %s: %v", c.Name, k, err)
		}
	}
	return parent
}

// can probes a host ability in dir.
func can(dir, need string) (bool, string) {
	p := filepath.Join(dir, ".probe")
	defer os.Remove(p)
	switch need {
	case "mknod":
		if err := unix.Mknod(p, unix.S_IFCHR, 0); err != nil {
			return false, "mknod of a 0:0 device refused: " + err.Error()
		}
		return true, ""
	case "user_xattr", "trusted_xattr":
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			return false, err.Error()
		}
		name := "user.probe"
		if need == "trusted_xattr" {
			name = "trusted.probe"
		}
		if err := unix.Lsetxattr(p, name, []byte("y"), 0); err != nil {
			return false, name + " refused: " + err.Error()
		}
		return true, ""
	}
	return false, "unknown need " + need
}
