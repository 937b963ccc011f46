package images

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// ent is one tar entry of a test layer.
type ent struct {
	name string
	typ  byte
	body string
	link string
	mode int64
}

func layerTar(t *testing.T, ents []ent) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range ents {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Linkname: e.link, Mode: e.mode, Uid: 4242, Gid: 4242}
		if h.Mode == 0 {
			h.Mode = 0o644
			if e.typ == tar.TypeDir {
				h.Mode = 0o755
			}
		}
		if e.typ == tar.TypeReg {
			h.Size = int64(len(e.body))
		}
		if e.typ == tar.TypeChar {
			h.Devmajor, h.Devminor = 1, 3
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if e.typ == tar.TypeReg {
			tw.Write([]byte(e.body))
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func digest(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

func configJSON(env []string, nLayers int) []byte {
	b, _ := json.Marshal(map[string]any{"architecture": "amd64", "os": "linux",
		"config": map[string]any{"Env": env, "WorkingDir": "/srv"}, "rootfs": map[string]any{"type": "layers"}})
	return b
}

// writeTar writes named files into a tar at p.
func writeTar(t *testing.T, p string, files [][2]string) {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		tw.WriteHeader(&tar.Header{Name: f[0], Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(f[1]))})
		tw.Write([]byte(f[1]))
	}
	tw.Close()
	if err := os.WriteFile(p, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// dockerArchive writes a docker-save style archive of one image and returns its ID.
func dockerArchive(t *testing.T, p string, env []string, layers ...[]byte) string {
	t.Helper()
	cfg := configJSON(env, len(layers))
	id := digest(cfg)
	files := [][2]string{{strings.TrimPrefix(id, "sha256:") + ".json", string(cfg)}}
	var names []string
	for i, l := range layers {
		n := filepath.Join(strings.Repeat("l", i+1), "layer.tar")
		names = append(names, n)
		files = append(files, [2]string{n, string(l)})
	}
	man, _ := json.Marshal([]map[string]any{{"Config": files[0][0], "RepoTags": []string{"t:1"}, "Layers": names}})
	writeTar(t, p, append(files, [2]string{"manifest.json", string(man)}))
	return id
}

// ociArchive writes an OCI layout with gzip-compressed layers.
func ociArchive(t *testing.T, p string, env []string, layers ...[]byte) string {
	t.Helper()
	cfg := configJSON(env, len(layers))
	blob := func(b []byte) (string, [2]string) {
		d := digest(b)
		return d, [2]string{"blobs/sha256/" + strings.TrimPrefix(d, "sha256:"), string(b)}
	}
	cd, cf := blob(cfg)
	files := [][2]string{{"oci-layout", `{"imageLayoutVersion":"1.0.0"}`}, cf}
	var descs []map[string]any
	for _, l := range layers {
		var gz bytes.Buffer
		w := gzip.NewWriter(&gz)
		w.Write(l)
		w.Close()
		d, f := blob(gz.Bytes())
		files = append(files, f)
		descs = append(descs, map[string]any{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": d, "size": gz.Len()})
	}
	man, _ := json.Marshal(map[string]any{"schemaVersion": 2, "config": map[string]any{"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cd}, "layers": descs})
	md, mf := blob(man)
	idx, _ := json.Marshal(map[string]any{"schemaVersion": 2, "manifests": []any{
		map[string]any{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": md, "platform": map[string]any{"os": "linux", "architecture": "amd64"}},
		map[string]any{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": md, "platform": map[string]any{"os": "linux", "architecture": "s390x"}},
	}})
	writeTar(t, p, append(files, mf, [2]string{"index.json", string(idx)}))
	return cd
}

var (
	base = []ent{
		{name: "etc/", typ: tar.TypeDir},
		{name: "etc/os-release", typ: tar.TypeReg, body: "ID=test\n"},
		{name: "etc/gone.txt", typ: tar.TypeReg, body: "deleted above\n"},
		{name: "opaque/", typ: tar.TypeDir},
		{name: "opaque/old.txt", typ: tar.TypeReg, body: "hidden by the opaque marker\n"},
		{name: "bin/", typ: tar.TypeDir, mode: 0o555},
		{name: "bin/su", typ: tar.TypeReg, body: "#!/bin/sh\n", mode: 0o4755},
		{name: "bin/link", typ: tar.TypeLink, link: "bin/su", mode: 0o4755},
		{name: "bin/sh", typ: tar.TypeSymlink, link: "/bin/su"},
		{name: "dev/", typ: tar.TypeDir},
		{name: "dev/null", typ: tar.TypeChar},
	}
	upper = []ent{
		{name: "etc/.wh.gone.txt", typ: tar.TypeReg},
		{name: "opaque/", typ: tar.TypeDir},
		{name: "opaque/.wh..wh..opq", typ: tar.TypeReg},
		{name: "opaque/new.txt", typ: tar.TypeReg, body: "new\n"},
	}
)

func newCache(t *testing.T, max int64) (*Cache, string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "images")
	c, err := Open(Options{Dir: dir, DockerHost: "unix://" + filepath.Join(t.TempDir(), "no-docker.sock"), Pull: "missing", MaxBytes: max})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removeAll(dir) })
	return c, dir
}

func TestAcquireArchives(t *testing.T) {
	for _, tc := range []struct {
		name  string
		write func(t *testing.T, p string, env []string, layers ...[]byte) string
		kind  string
	}{
		{"docker-archive", dockerArchive, "docker-archive"},
		{"oci-archive", ociArchive, "oci-archive"},
		{"oci layout read as docker-archive", ociArchive, "docker-archive"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, dir := newCache(t, 1<<30)
			p := filepath.Join(t.TempDir(), "img.tar")
			id := tc.write(t, p, []string{"PATH=/bin", "FOO=bar"}, layerTar(t, base), layerTar(t, upper))
			var progress []string
			res, err := c.Acquire(context.Background(), tc.kind+":"+p, func(s string) { progress = append(progress, s) })
			if err != nil {
				t.Fatal(err)
			}
			if res.ID != id || res.Cached || res.Layers != 2 || res.SkippedDevices != 1 || res.WorkingDir != "/srv" {
				t.Fatalf("result %+v, want id %s, 2 layers, 1 skipped device", res, id)
			}
			if strings.Join(res.Env, " ") != "PATH=/bin FOO=bar" {
				t.Fatalf("env %v", res.Env)
			}
			if !strings.Contains(strings.Join(progress, "\n"), "unpacking layer 2 of 2") {
				t.Fatalf("progress %q", progress)
			}
			root := filepath.Join(dir, strings.TrimPrefix(id, "sha256:"), "rootfs")
			if res.Rootfs != root {
				t.Fatalf("rootfs %s, want %s", res.Rootfs, root)
			}
			for p, want := range map[string]bool{"etc/os-release": true, "etc/gone.txt": false, "opaque/old.txt": false,
				"opaque/new.txt": true, "dev/null": false, "etc/.wh.gone.txt": false, "opaque/.wh..wh..opq": false} {
				if _, err := os.Lstat(filepath.Join(root, p)); (err == nil) != want {
					t.Errorf("%s exists=%v, want %v", p, err == nil, want)
				}
			}
			su, err := os.Stat(filepath.Join(root, "bin/su"))
			if err != nil {
				t.Fatal(err)
			}
			if su.Mode()&(os.ModeSetuid|os.ModeSetgid) != 0 || su.Mode().Perm() != 0o755 {
				t.Errorf("bin/su mode %v: setuid must be cleared, permissions kept", su.Mode())
			}
			if st := su.Sys().(*syscall.Stat_t); int(st.Uid) != os.Getuid() || st.Nlink != 2 {
				t.Errorf("bin/su uid %d nlink %d: want the user's uid and the hardlink kept", st.Uid, st.Nlink)
			}
			if l, _ := os.Readlink(filepath.Join(root, "bin/sh")); l != "/bin/su" {
				t.Errorf("symlink target %q", l)
			}
			again, err := c.Acquire(context.Background(), tc.kind+":"+p, func(string) {})
			if err != nil || !again.Cached || again.ID != id {
				t.Fatalf("second acquire: %+v %v, want cached", again, err)
			}
			if ents, _ := os.ReadDir(dir); len(ents) != 1 {
				t.Fatalf("cache dir holds %d entries, want 1", len(ents))
			}
		})
	}
}

func TestAcquireBadInput(t *testing.T) {
	tmp := t.TempDir()
	arch := func(name string, layers ...[]byte) string {
		p := filepath.Join(tmp, name+".tar")
		dockerArchive(t, p, nil, layers...)
		return "docker-archive:" + p
	}
	garbage := filepath.Join(tmp, "garbage.tar")
	os.WriteFile(garbage, bytes.Repeat([]byte("not a tar "), 100), 0o644)
	two := filepath.Join(tmp, "two.tar")
	writeTar(t, two, [][2]string{{"manifest.json", `[{"Config":"a.json","Layers":[]},{"Config":"b.json","Layers":[]}]`}})
	truncated := filepath.Join(tmp, "truncated.tar")
	whole := layerTar(t, []ent{{name: "big", typ: tar.TypeReg, body: strings.Repeat("x", 5000)}})
	dockerArchive(t, truncated, nil, whole[:1536])

	for _, tc := range []struct {
		name, image string
		kind        Kind
		reason      string
	}{
		{"malformed reference", "UPPER/Case", BadInput, "malformed_reference"},
		{"short image id", "sha256:abc", BadInput, "malformed_reference"},
		{"relative archive path", "docker-archive:rel/x.tar", BadInput, "malformed_reference"},
		{"missing archive", "docker-archive:" + filepath.Join(tmp, "absent.tar"), BadInput, "archive_missing"},
		{"not a tar", "docker-archive:" + garbage, BadInput, "unreadable_archive"},
		{"two images", "docker-archive:" + two, BadInput, "unreadable_archive"},
		{"no OCI index", "oci-archive:" + two, BadInput, "unreadable_archive"},
		{"dot-dot entry", arch("dotdot", layerTar(t, base), layerTar(t, []ent{{name: "../escape", typ: tar.TypeReg, body: "x"}})), Failed, "unsafe_entry"},
		{"absolute entry", arch("abs", layerTar(t, []ent{{name: "/etc/abs", typ: tar.TypeReg, body: "x"}})), Failed, "unsafe_entry"},
		{"escaping hardlink", arch("hl", layerTar(t, []ent{{name: "h", typ: tar.TypeLink, link: "../../etc/passwd"}})), Failed, "unsafe_entry"},
		{"truncated layer", "docker-archive:" + truncated, Failed, "corrupt_layer"},
		{"engine unreachable", "esbx-test/busybox:1", Unavailable, "docker_unavailable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, dir := newCache(t, 1<<30)
			_, err := c.Acquire(context.Background(), tc.image, func(string) {})
			var ie *Error
			if !errors.As(err, &ie) || ie.Kind != tc.kind || ie.Reason != tc.reason {
				t.Fatalf("got %#v (%v), want kind %d reason %s", ie, err, tc.kind, tc.reason)
			}
			if ents, _ := os.ReadDir(dir); len(ents) != 0 {
				t.Fatalf("a failed acquire left %v in the cache", ents)
			}
			if _, err := os.Stat(filepath.Join(filepath.Dir(dir), "escape")); err == nil {
				t.Fatal("an entry escaped the rootfs")
			}
		})
	}
}

func TestReleasePrunesLRU(t *testing.T) {
	c, dir := newCache(t, 20) // room for one 12-byte image, not two
	tmp := t.TempDir()
	var ids []string
	for i, body := range []string{"first image\n", "other image\n"} {
		p := filepath.Join(tmp, strings.Repeat("x", i+1)+".tar")
		ids = append(ids, dockerArchive(t, p, []string{"N=" + body}, layerTar(t, []ent{{name: "f", typ: tar.TypeReg, body: body}})))
		if _, err := c.Acquire(context.Background(), "docker-archive:"+p, func(string) {}); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(c.Entries()); n != 2 {
		t.Fatalf("both referenced images must stay: %d entries", n)
	}
	c.Release(ids[1])
	if _, err := c.Lookup(ids[1]); err == nil {
		t.Fatal("the unreferenced image beyond cache_max_bytes was not pruned")
	}
	if _, err := c.Lookup(ids[0]); err != nil {
		t.Fatalf("the referenced image was pruned: %v", err)
	}
	c.Release(ids[0])
	if _, err := c.Lookup(ids[0]); err != nil {
		t.Fatalf("an image within cache_max_bytes was pruned: %v", err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Fatalf("cache dir: %v", ents)
	}
}

func TestOpenSweepsStaging(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "images")
	os.MkdirAll(filepath.Join(dir, ".staging-abc-1", "rootfs", "ro"), 0o755)
	os.Chmod(filepath.Join(dir, ".staging-abc-1", "rootfs", "ro"), 0o555)
	if _, err := Open(Options{Dir: dir}); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("staging left after Open: %v", ents)
	}
}

func TestDockerHost(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	for _, tc := range []struct {
		configured string
		env        map[string]string
		want       string
	}{
		{"tcp://127.0.0.1:2375", map[string]string{"DOCKER_HOST": "unix:///x.sock"}, "tcp://127.0.0.1:2375"},
		{"", map[string]string{"DOCKER_HOST": "unix:///x.sock"}, "unix:///x.sock"},
		{"", map[string]string{"XDG_RUNTIME_DIR": "/nonexistent"}, "unix:///var/run/docker.sock"},
	} {
		if got := DockerHost(tc.configured, env(tc.env)); got != tc.want && !(tc.want == "unix:///var/run/docker.sock" && strings.HasSuffix(got, "/docker.sock")) {
			t.Errorf("DockerHost(%q, %v) = %s, want %s", tc.configured, tc.env, got, tc.want)
		}
	}
}
