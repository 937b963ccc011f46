package gitindex

import (
	"bytes"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func git(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null", "LC_ALL=C",
		"GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@e", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@e")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
	return string(out)
}

// A real index of every version and both hash functions parses to the
// entries `git ls-files -s` lists, and a rewrite of the stat data is read
// back by git exactly as written, with nothing else changed.
func TestParseRewriteRealIndexes(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git:", err)
	}
	cases := []struct {
		name  string
		init  []string
		setup [][]string
	}{
		{"v2", []string{"init", "-q"}, [][]string{{"update-index", "--index-version", "2"}}},
		{"v3-intent-to-add", []string{"init", "-q"}, [][]string{{"add", "-N", "new.txt"}}},
		{"v4", []string{"init", "-q"}, [][]string{{"update-index", "--index-version", "4"}}},
		{"sha256", []string{"init", "-q", "--object-format=sha256"}, nil},
		{"untracked-cache", []string{"init", "-q"}, [][]string{{"update-index", "--untracked-cache"}, {"status", "--porcelain"}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			git(t, dir, c.init...)
			files := map[string]string{"a.txt": "a\n", "dir/b.txt": "bee\n", "dir/sub/c": "c", "dir/sub/d-long-name.txt": "d\n", "new.txt": "n\n"}
			for p, s := range files {
				os.MkdirAll(filepath.Join(dir, filepath.Dir(p)), 0o755)
				os.WriteFile(filepath.Join(dir, p), []byte(s), 0o644)
			}
			os.Symlink("a.txt", filepath.Join(dir, "link"))
			git(t, dir, "add", "a.txt", "dir", "link")
			git(t, dir, "commit", "-qm", "init")
			for _, s := range c.setup {
				git(t, dir, s...)
			}
			path := filepath.Join(dir, ".git", "index")
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			x, err := Parse(bytes.Clone(data))
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, e := range x.Entries {
				got = append(got, strings.Join([]string{modeStr(e.Mode), hex.EncodeToString(e.OID), "0", e.Path}, " "))
			}
			want := strings.Fields(strings.ReplaceAll(strings.TrimSpace(git(t, dir, "ls-files", "-s")), "\t", " "))
			if g := strings.Fields(strings.Join(got, " ")); strings.Join(g, " ") != strings.Join(want, " ") {
				t.Fatalf("entries:\n got %v\nwant %v", g, want)
			}
			if c.name == "sha256" && x.HashSize != 32 || c.name != "sha256" && x.HashSize != 20 {
				t.Fatalf("hash size %d", x.HashSize)
			}
			for i := range x.Entries {
				e := x.Entries[i]
				if (e.Path == "new.txt") == e.Regular() {
					t.Errorf("%s: Regular() = %v", e.Path, e.Regular())
				}
				x.SetStat(i, Stat{CtimeSec: 11, CtimeNsec: 12, MtimeSec: e.Stat.MtimeSec, MtimeNsec: e.Stat.MtimeNsec,
					Dev: 7, Ino: uint32(1000 + i), UID: 4242, GID: 4343, Size: e.Stat.Size})
			}
			out := x.Bytes()
			if err := os.WriteFile(path, out, 0o644); err != nil {
				t.Fatal(err)
			}
			debug := git(t, dir, "ls-files", "--debug")
			for i, e := range x.Entries {
				for _, s := range []string{"ctime: 11:12", "dev: 7\tino: " + itoa(1000+i), "uid: 4242\tgid: 4343"} {
					blk := debugBlock(debug, e.Path)
					if !strings.Contains(blk, s) {
						t.Errorf("%s: ls-files --debug lacks %q:\n%s", e.Path, s, blk)
					}
				}
			}
			if again, err := Parse(bytes.Clone(out)); err != nil || len(again.Entries) != len(x.Entries) {
				t.Fatalf("reparse: %v", err)
			}
			if len(out) != len(data) || !bytes.Equal(out[:12], data[:12]) {
				t.Fatalf("the rewrite changed the layout")
			}
			git(t, dir, "fsck", "--no-progress")
		})
	}
}

func modeStr(m uint32) string { return strconv.FormatUint(uint64(m), 8) }

func itoa(i int) string { return strconv.Itoa(i) }

func debugBlock(debug, path string) string {
	lines := strings.Split(debug, "\n")
	for i, l := range lines {
		if l == path {
			end := i + 6
			if end > len(lines) {
				end = len(lines)
			}
			return strings.Join(lines[i:end], "\n")
		}
	}
	return ""
}

func TestParseRejects(t *testing.T) {
	cases := map[string][]byte{
		"empty":     nil,
		"signature": []byte("DIRX\x00\x00\x00\x02\x00\x00\x00\x00" + strings.Repeat("\x00", 20)),
		"version":   []byte("DIRC\x00\x00\x00\x05\x00\x00\x00\x00" + strings.Repeat("\x00", 20)),
		"count":     []byte("DIRC\x00\x00\x00\x02\x00\x00\x00\x09" + strings.Repeat("\x00", 20)),
	}
	for name, b := range cases {
		if _, err := Parse(b); err == nil {
			t.Errorf("%s: parsed", name)
		}
	}
	// A corrupt checksum is refused.
	ok := append([]byte("DIRC\x00\x00\x00\x02\x00\x00\x00\x00"), sum(20, []byte("DIRC\x00\x00\x00\x02\x00\x00\x00\x00"))...)
	if _, err := Parse(bytes.Clone(ok)); err != nil {
		t.Fatalf("empty index: %v", err)
	}
	ok[len(ok)-1] ^= 1
	if _, err := Parse(ok); err == nil {
		t.Error("bad checksum parsed")
	}
}

func TestBlobOID(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f")
	os.WriteFile(p, []byte("hello\n"), 0o644)
	want := strings.TrimSpace(git(t, dir, "hash-object", "--no-filters", p))
	f, _ := os.Open(p)
	defer f.Close()
	oid, err := BlobOID(f, 6, 20)
	if err != nil || hex.EncodeToString(oid) != want {
		t.Fatalf("BlobOID = %x, %v; want %s", oid, err, want)
	}
}
