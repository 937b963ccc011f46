package layers

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/ephemeral-ai-lab/sandbox/layers/gitindex"
	"golang.org/x/sys/unix"
)

func gitT(t *testing.T, dir string, args ...string) {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null",
		"GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@e", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@e")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
}

func readIndex(t *testing.T, p string) *gitindex.Index {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	x, err := gitindex.Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	return x
}

// sessionStat is what RestatGitIndex writes for a layer file.
func sessionStat(t *testing.T, p string) gitindex.Stat {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	uid, gid := SessionOwner(st.Uid, st.Gid)
	return gitindex.Stat{CtimeSec: uint32(st.Ctim.Sec), CtimeNsec: uint32(st.Ctim.Nsec), MtimeSec: uint32(st.Mtim.Sec),
		MtimeNsec: uint32(st.Mtim.Nsec), Ino: uint32(st.Ino), UID: uid, GID: gid, Size: uint32(st.Size)}
}

// The snapshot rewrites the base's git index: every entry git on the host
// would call clean, or whose copy hashes to the entry's object, gets the
// layer file's stat data as a session sees it; changed files keep the
// host's (git then compares content); the user's repository is untouched;
// the base root hash covers the rewritten index.
func TestSnapshotRestatsGitIndex(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git:", err)
	}
	root := t.TempDir()
	for p, c := range map[string]string{"a.txt": "a\n", "d/b.txt": "bee\n", "touched.txt": "same\n", "changed.txt": "one\n",
		"sametime.txt": "1234\n", "run.sh": "#!/bin/sh\n", "sub/s.txt": "nested\n"} {
		writeFile(t, filepath.Join(root, p), c, 0o644)
	}
	os.Chmod(filepath.Join(root, "run.sh"), 0o755)
	os.Symlink("a.txt", filepath.Join(root, "link"))
	gitT(t, root, "init", "-q")
	gitT(t, root, "add", "-A")
	gitT(t, root, "commit", "-qm", "init")
	// A nested repository has its own index.
	gitT(t, filepath.Join(root, "sub"), "init", "-q")
	gitT(t, filepath.Join(root, "sub"), "add", "-A")
	// Let the index be older than the edits below, then: a touched file
	// (new mtime, same content), a changed one, and one changed with its
	// size and mtime put back (only its ctime tells).
	past := time.Now().Add(-time.Hour)
	for _, p := range []string{"a.txt", "d/b.txt", "touched.txt", "changed.txt", "sametime.txt", "run.sh", ".git/index", "sub/s.txt", "sub/.git/index"} {
		os.Chtimes(filepath.Join(root, p), past, past)
	}
	os.Chtimes(filepath.Join(root, "touched.txt"), time.Now(), time.Now())
	writeFile(t, filepath.Join(root, "changed.txt"), "two, longer\n", 0o644)
	writeFile(t, filepath.Join(root, "sametime.txt"), "5678\n", 0o644)
	os.Chtimes(filepath.Join(root, "sametime.txt"), past, past)
	hostIndex, _ := os.ReadFile(filepath.Join(root, ".git", "index"))

	st, _, err := Create(context.Background(), filepath.Join(t.TempDir(), "stack"), root, SnapshotOptions{})
	if err != nil {
		t.Fatal(err)
	}
	base := filepath.Join(st.Dir(), layersDirName, BaseLayerID)
	if after, _ := os.ReadFile(filepath.Join(root, ".git", "index")); !bytes.Equal(after, hostIndex) {
		t.Fatal("the snapshot changed the user's index")
	}
	for _, repo := range []struct{ index, workTree string }{{".git/index", ""}, {"sub/.git/index", "sub"}} {
		x := readIndex(t, filepath.Join(base, repo.index))
		host := readIndex(t, filepath.Join(root, repo.index))
		for i, e := range x.Entries {
			want := sessionStat(t, filepath.Join(base, repo.workTree, e.Path))
			switch e.Path {
			case "changed.txt", "sametime.txt":
				if e.Stat != host.Entries[i].Stat {
					t.Errorf("%s: a changed file's stat data were rewritten: %+v", e.Path, e.Stat)
				}
			default:
				if e.Stat != want {
					t.Errorf("%s %s: stat %+v, want %+v", repo.index, e.Path, e.Stat, want)
				}
			}
		}
	}
	want, err := st.StoredDigest(BaseLayerID)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := BaseRootHash(base); err != nil || got != want {
		t.Fatalf("base root hash %s, stored %s (%v)", got, want, err)
	}
}

// RestatGitIndexInView (the publish's call) trusts size and mtime only for
// entries that were not racily clean, hashes the rest, and leaves a file
// whose content differs.
func TestRestatGitIndexInView(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git:", err)
	}
	root := t.TempDir()
	writeFile(t, filepath.Join(root, "w", "a.txt"), "a\n", 0o644)
	writeFile(t, filepath.Join(root, "w", "b.txt"), "b\n", 0o644)
	gitT(t, filepath.Join(root, "w"), "init", "-q")
	gitT(t, filepath.Join(root, "w"), "add", "-A")
	data, _ := os.ReadFile(filepath.Join(root, "w", ".git", "index"))
	// The view holds a.txt as it was and b.txt changed.
	st, _, err := Create(context.Background(), filepath.Join(t.TempDir(), "stack"), root, SnapshotOptions{})
	if err != nil {
		t.Fatal(err)
	}
	head, err := st.Head()
	if err != nil {
		t.Fatal(err)
	}
	base := filepath.Join(st.Dir(), layersDirName, BaseLayerID)
	os.Chmod(filepath.Join(base, "w"), 0o755)
	os.Chmod(filepath.Join(base, "w", "b.txt"), 0o644)
	writeFile(t, filepath.Join(base, "w", "b.txt"), "B\n", 0o644)
	v := st.View(head)
	for _, c := range []struct {
		name                  string
		mtime                 unix.Timespec
		set, hashed, leftWant int
	}{
		{"hash-all", unix.Timespec{}, 1, 1, 1},
		{"trusted", unix.NsecToTimespec(time.Now().Add(time.Hour).UnixNano()), 1, 0, 1},
		{"racy", unix.NsecToTimespec(time.Now().Add(-time.Hour).UnixNano()), 1, 1, 1},
	} {
		out, stats, err := RestatGitIndexInView(context.Background(), data, v, "w", c.mtime)
		if err != nil {
			t.Fatal(err)
		}
		if stats.Set != c.set || stats.Hashed != c.hashed || stats.Left != c.leftWant {
			t.Errorf("%s: %+v", c.name, stats)
		}
		x, _ := gitindex.Parse(out)
		if got, want := x.Entries[0].Stat, sessionStat(t, filepath.Join(base, "w", "a.txt")); got != want {
			t.Errorf("%s: a.txt %+v, want %+v", c.name, got, want)
		}
	}
}
