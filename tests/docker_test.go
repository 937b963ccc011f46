package tests

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// The Docker tests need a Docker Engine the test user can reach (the
// default socket or DOCKER_HOST) holding the images .ci/docker.sh builds.
const (
	busyboxImage = "esbx-test/busybox:1" // busybox-static, /etc/os-release ID=esbx-test, /usr/local/bin/esbx-image-only
	layeredImage = "esbx-test/layered:1" // + a layer deleting /etc/deleted-later.txt and adding /etc/layer2.txt
)

// requireDocker returns the image ID of busyboxImage, or skips (fails
// under ESBX_REQUIRE_ALL) when the engine or the test images are missing.
func requireDocker(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("docker", "image", "inspect", "--format", "{{.Id}}", busyboxImage, layeredImage).CombinedOutput()
	if err != nil {
		skipOrFail(t, "no Docker Engine with the test images (run .ci/docker.sh as root): docker image inspect: %v: %s", err, out)
	}
	return strings.Fields(string(out))[0]
}

// shell runs a command in a new implicit session and returns its output;
// it fails the test unless the command exits 0.
func (e *env) shell(id, cmd string) string {
	e.t.Helper()
	r := e.rt(id, "exec_command", "--yield-time-ms", "120000", cmd) // returns at exit; the long yield only absorbs a loaded machine
	if r["status"] != "ok" || num(e.t, r["exit_code"]) != 0 {
		e.t.Fatalf("exec %q: %v", cmd, r)
	}
	return strings.ReplaceAll(r["output"].(string), "\r\n", "\n")
}

// unpackSpan returns the attributes of the image.unpack span of the last
// system-scope request (create_sandbox).
func (e *env) unpackSpan() map[string]any {
	e.t.Helper()
	tr := e.ok("sandbox-observability-cli", "trace")
	var found map[string]any
	var walk func(nodes []any)
	walk = func(nodes []any) {
		for _, n := range nodes {
			node := n.(map[string]any)
			if sp := node["span"].(map[string]any); sp["name"] == "image.unpack" {
				found = sp["attrs"].(map[string]any)
			}
			walk(node["children"].([]any))
		}
	}
	walk(tr["spans"].([]any))
	if found == nil {
		e.t.Fatalf("no image.unpack span in the last trace: %v", tr)
	}
	return found
}

func (e *env) imageEntries() []string {
	e.t.Helper()
	ents, err := os.ReadDir(filepath.Join(e.data(), "images"))
	if err != nil && !os.IsNotExist(err) {
		e.t.Fatal(err)
	}
	var out []string
	for _, en := range ents {
		out = append(out, en.Name())
	}
	return out
}

func TestDockerImageSandbox(t *testing.T) {
	imageID := requireDocker(t)
	e := newEnv(t)
	e.start()
	root := e.project(map[string]string{"README.md": "project\n"})

	// First creation: exported by the Engine and unpacked, with progress on stderr.
	pr := e.run("sandbox-manager-cli", "--progress", "create_sandbox", "--workspace-bind-root", root, "--image", busyboxImage)
	if pr.code != 0 {
		t.Fatalf("create: exit %d: %s", pr.code, pr.stderr)
	}
	for _, want := range []string{"[progress ", "exporting image", "unpacking layer 1 of 1", "snapshot done"} {
		if !strings.Contains(pr.stderr, want) {
			t.Errorf("--progress output lacks %q:\n%s", want, pr.stderr)
		}
	}
	rec := pr.obj(t)
	if rec["image"] != busyboxImage || rec["rootfs"] != imageID || rec["state"] != "ready" {
		t.Fatalf("record: %v, want image %s rootfs %s", rec, busyboxImage, imageID)
	}
	if sp := e.unpackSpan(); sp["cached"] != false || sp["image_id"] != imageID {
		t.Fatalf("first unpack span %v, want cached:false", sp)
	}
	a := rec["id"].(string)

	// The image is "/": its command, marker file and Env; the host's /etc is not there.
	out := e.shell(a, `esbx-image-only && cat /etc/os-release && echo "host=$(cat /etc/hostname) ws=$WORKSPACE_SESSION_ID cwd=$(pwd)" && `+
		`test ! -e /etc/debian_version && grep -q "$WORKSPACE_SESSION_ID" /etc/hosts && `+
		`echo from-image-session > /workspace/made.txt && echo tampered > /etc/os-release && echo x > /bin/extra && rm /etc/deleted-later.txt`)
	for _, want := range []string{"only in the image: from-image", "ID=esbx-test", "cwd=/workspace"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	var host, ws string
	for _, f := range strings.Fields(out) {
		if v, ok := strings.CutPrefix(f, "host="); ok {
			host = v
		}
		if v, ok := strings.CutPrefix(f, "ws="); ok {
			ws = v
		}
	}
	if host == "" || host != ws {
		t.Errorf("/etc/hostname %q, want the session ID %q", host, ws)
	}

	// A second session sees the published workspace change, but none of the
	// first session's image changes; neither does the cache.
	out = e.shell(a, `cat /workspace/made.txt; cat /etc/os-release; test ! -e /bin/extra && test -e /etc/deleted-later.txt && echo image-intact`)
	for _, want := range []string{"from-image-session", "ID=esbx-test", "image-intact"} {
		if !strings.Contains(out, want) {
			t.Errorf("second session output lacks %q:\n%s", want, out)
		}
	}
	cached := filepath.Join(e.data(), "images", strings.TrimPrefix(imageID, "sha256:"), "rootfs")
	if b, err := os.ReadFile(filepath.Join(cached, "etc", "os-release")); err != nil || !strings.Contains(string(b), "ID=esbx-test") {
		t.Errorf("cached os-release changed: %q %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(cached, "bin", "extra")); err == nil {
		t.Error("a session's new image file leaked into the cache")
	}
	if _, err := os.Stat(filepath.Join(cached, "etc", "deleted-later.txt")); err != nil {
		t.Error("a session's deletion leaked into the cache")
	}

	// A second sandbox of the same image reuses the cache: no export, no unpack.
	pr = e.run("sandbox-manager-cli", "--progress", "create_sandbox", "--workspace-bind-root", root, "--image", imageID)
	if pr.code != 0 {
		t.Fatalf("second create: exit %d: %s", pr.code, pr.stderr)
	}
	if strings.Contains(pr.stderr, "unpacking layer") || strings.Contains(pr.stderr, "exporting image") {
		t.Errorf("second create unpacked again:\n%s", pr.stderr)
	}
	if sp := e.unpackSpan(); sp["cached"] != true || sp["image_id"] != imageID {
		t.Fatalf("second unpack span %v, want cached:true", sp)
	}
	b := pr.obj(t)["id"].(string)
	if out := e.shell(b, `cat /etc/os-release; test ! -e /workspace/made.txt && echo own-workspace`); !strings.Contains(out, "ID=esbx-test") || !strings.Contains(out, "own-workspace") {
		t.Errorf("second sandbox: %s", out)
	}

	imgs := e.mgr("list_docker_images")
	if imgs["docker"] != "available" || !strings.Contains(toJSON(imgs["images"]), busyboxImage) || !strings.Contains(toJSON(imgs["images"]), layeredImage) {
		t.Errorf("list_docker_images: %v", imgs)
	}
	if h := e.ok("sandbox-observability-cli", "health"); h["docker"].(map[string]any)["available"] != true {
		t.Errorf("health docker: %v", h["docker"])
	}

	// Destroying releases the reference; within images.cache_max_bytes the rootfs stays cached.
	e.mgr("destroy_sandbox", "--sandbox-id", a)
	e.mgr("destroy_sandbox", "--sandbox-id", b)
	if got := e.imageEntries(); len(got) != 1 || got[0] != strings.TrimPrefix(imageID, "sha256:") {
		t.Errorf("image cache after destroy: %v", got)
	}
}

func TestDockerLayeredImage(t *testing.T) {
	requireDocker(t)
	e := newEnv(t)
	e.start()
	id := e.createSandbox(e.project(map[string]string{"a": "a\n"}), "--image", layeredImage)
	if sp := e.unpackSpan(); num(t, sp["layers"]) != 2 {
		t.Fatalf("unpack span %v, want 2 layers", sp)
	}
	out := e.shell(id, `test ! -e /etc/deleted-later.txt && echo deleted; cat /etc/layer2.txt /etc/os-release`)
	for _, want := range []string{"deleted", "layer2", "ID=esbx-test"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

// archive writes a docker-archive of one image whose layers hold the given
// entries (name → content; a "dev:" content makes a character device).
func archive(t *testing.T, p string, layers ...map[string]string) {
	t.Helper()
	var tars [][]byte
	for _, l := range layers {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for name, body := range l {
			h := &tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o755, Size: int64(len(body))}
			if strings.HasSuffix(name, "/") {
				h.Typeflag, h.Size = tar.TypeDir, 0
			}
			if body == "dev:" {
				h.Typeflag, h.Size, h.Devmajor, h.Devminor = tar.TypeChar, 0, 1, 3
			}
			if err := tw.WriteHeader(h); err != nil {
				t.Fatal(err)
			}
			if h.Typeflag == tar.TypeReg {
				tw.Write([]byte(body))
			}
		}
		tw.Close()
		tars = append(tars, buf.Bytes())
	}
	cfg, _ := json.Marshal(map[string]any{"os": "linux", "config": map[string]any{"Env": []string{"PATH=/bin", "FROM_ARCHIVE=yes"}}})
	sum := sha256.Sum256(cfg)
	cfgName := hex.EncodeToString(sum[:]) + ".json"
	files := [][2]string{{cfgName, string(cfg)}}
	var names []string
	for i, l := range tars {
		n := filepath.Join(strings.Repeat("l", i+1), "layer.tar")
		names = append(names, n)
		files = append(files, [2]string{n, string(l)})
	}
	man, _ := json.Marshal([]map[string]any{{"Config": cfgName, "Layers": names}})
	files = append(files, [2]string{"manifest.json", string(man)})
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

// busyboxLayer is a layer with a static shell, for archive-only images.
func busyboxLayer(t *testing.T) map[string]string {
	t.Helper()
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		skipOrFail(t, "busybox-static is needed for archive images: %v", err)
	}
	return map[string]string{"bin/": "", "bin/busybox": string(bb), "bin/sh": string(bb), "bin/cat": string(bb), "etc/": "", "etc/os-release": "ID=from-archive\n"}
}

func TestDockerBadInput(t *testing.T) {
	requireDocker(t)
	e := newEnv(t)
	e.start()
	root := e.project(map[string]string{"a": "a\n"})
	dir := t.TempDir()
	garbage := filepath.Join(dir, "garbage.tar")
	os.WriteFile(garbage, bytes.Repeat([]byte("not a tar archive "), 200), 0o644)
	dotdot := filepath.Join(dir, "dotdot.tar")
	archive(t, dotdot, busyboxLayer(t), map[string]string{"../escape": "x"})
	abs := filepath.Join(dir, "abs.tar")
	archive(t, abs, map[string]string{"/etc/abs": "x"})

	for _, tc := range []struct {
		image, kind, reason, msg string
	}{
		{"Not A Reference!", "invalid_request", "malformed_reference", "not a valid Docker reference"},
		{"sha256:1234", "invalid_request", "malformed_reference", "64 lowercase hex"},
		{"esbx-test/no-such-image:1", "operation_failed", "pull_failed", "pull esbx-test/no-such-image:1"},
		{"docker-archive:" + filepath.Join(dir, "absent.tar"), "invalid_request", "archive_missing", "absent.tar"},
		{"docker-archive:" + garbage, "invalid_request", "unreadable_archive", "not a readable tar archive"},
		{"oci-archive:" + garbage, "invalid_request", "unreadable_archive", "not a readable tar archive"},
		{"docker-archive:" + dotdot, "operation_failed", "unsafe_entry", `layer 2 of 2: entry "../escape"`},
		{"docker-archive:" + abs, "operation_failed", "unsafe_entry", `entry "/etc/abs"`},
	} {
		body := e.fail(1, tc.kind, "sandbox-manager-cli", "create_sandbox", "--workspace-bind-root", root, "--image", tc.image)
		d := body["details"].(map[string]any)
		if d["reason"] != tc.reason || !strings.Contains(body["message"].(string), tc.msg) {
			t.Errorf("%s: %v, want reason %s and a message naming %q", tc.image, body, tc.reason, tc.msg)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "escape")); err == nil {
		t.Error("a layer entry escaped")
	}
	if l := e.mgr("list_sandboxes")["sandboxes"].([]any); len(l) != 0 {
		t.Errorf("refused creates left records: %v", l)
	}
	if d := sandboxDirs(t, e); len(d) != 0 {
		t.Errorf("refused creates left sandbox dirs: %v", d)
	}
	if got := e.imageEntries(); len(got) != 0 {
		t.Errorf("refused creates left image cache entries: %v", got)
	}

	// A device node in a layer is skipped, not created, and not an error.
	dev := filepath.Join(dir, "dev.tar")
	archive(t, dev, busyboxLayer(t), map[string]string{"devices/": "", "devices/null": "dev:"})
	id := e.createSandbox(root, "--image", "docker-archive:"+dev)
	if sp := e.unpackSpan(); num(t, sp["skipped_devices"]) != 1 {
		t.Errorf("unpack span %v, want skipped_devices 1", sp)
	}
	if out := e.shell(id, `test -d /devices && test ! -e /devices/null && echo "skipped $FROM_ARCHIVE"; cat /etc/os-release`); !strings.Contains(out, "skipped yes") || !strings.Contains(out, "ID=from-archive") {
		t.Errorf("device image: %s", out)
	}
}

func TestDockerPullNeverAndPrune(t *testing.T) {
	requireDocker(t)
	e := newEnv(t)
	writeConfig(t, e, "images:\n  pull: never\n  cache_max_bytes: 0\n")
	e.start()
	root := e.project(map[string]string{"a": "a\n"})
	body := e.fail(1, "invalid_request", "sandbox-manager-cli", "create_sandbox", "--workspace-bind-root", root, "--image", "esbx-test/no-such-image:1")
	if !strings.Contains(body["message"].(string), "not present") {
		t.Errorf("pull never: %v", body)
	}
	arch := filepath.Join(t.TempDir(), "img.tar")
	archive(t, arch, busyboxLayer(t))
	id := e.createSandbox(root, "--image", "docker-archive:"+arch)
	if got := e.imageEntries(); len(got) != 1 {
		t.Fatalf("a referenced image must stay cached beyond cache_max_bytes: %v", got)
	}
	e.mgr("destroy_sandbox", "--sandbox-id", id)
	if got := e.imageEntries(); len(got) != 0 {
		t.Errorf("cache_max_bytes 0: the unreferenced image was not pruned: %v", got)
	}

	// One reference per sandbox of a batch.
	recs := e.mgr("create_sandbox", "--workspace-bind-root", root, "--image", "docker-archive:"+arch, "--count", "2")["sandboxes"].([]any)
	for i, r := range recs {
		e.mgr("destroy_sandbox", "--sandbox-id", r.(map[string]any)["id"].(string))
		if got, want := len(e.imageEntries()), 1-i; got != want {
			t.Errorf("after destroying %d of 2 sandboxes: %d cache entries, want %d", i+1, got, want)
		}
	}

	// A create that fails after the image was unpacked (a FIFO in the
	// workspace) releases its reference: nothing is left.
	bad := filepath.Join(t.TempDir(), "ws")
	os.MkdirAll(bad, 0o755)
	if err := syscall.Mkfifo(filepath.Join(bad, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	e.fail(1, "invalid_request", "sandbox-manager-cli", "create_sandbox", "--workspace-bind-root", bad, "--image", "docker-archive:"+arch)
	if got := e.imageEntries(); len(got) != 0 || len(sandboxDirs(t, e)) != 0 {
		t.Errorf("a rolled-back create left %v and sandboxes %v", got, sandboxDirs(t, e))
	}
}

func TestDockerEngineUnavailable(t *testing.T) {
	e := newEnv(t)
	for _, bad := range []string{"images:\n  docker_host: http://127.0.0.1:2375\n", "images:\n  docker_host: unix://relative.sock\n",
		"images:\n  cache_max_bytes: -1\n", "images:\n  pull: always\n"} {
		writeConfig(t, e, bad)
		cmd := exec.Command(bin("sandbox-supervisor"), "serve")
		cmd.Env = e.environ()
		out, err := cmd.CombinedOutput()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), "config_error") || !strings.Contains(string(out), "images.") {
			t.Errorf("config %q accepted: %v %s", bad, err, out)
		}
	}
	writeConfig(t, e, "images:\n  docker_host: unix:///nonexistent/docker.sock\n")
	e.start()
	root := e.project(map[string]string{"a": "a\n"})
	body := e.fail(1, "operation_failed", "sandbox-manager-cli", "create_sandbox", "--workspace-bind-root", root, "--image", busyboxImage)
	if d := body["details"].(map[string]any); d["docker"] != "unavailable" || !strings.Contains(body["message"].(string), "/nonexistent/docker.sock") {
		t.Errorf("unreachable engine: %v", body)
	}
	imgs := e.mgr("list_docker_images")
	if imgs["docker"] != "unavailable" || len(imgs["images"].([]any)) != 0 || imgs["error"] == "" {
		t.Errorf("list_docker_images without an engine: %v", imgs)
	}
	if h := e.ok("sandbox-observability-cli", "health"); h["docker"].(map[string]any)["available"] != false {
		t.Errorf("health docker: %v", h["docker"])
	}
	if l := e.mgr("list_sandboxes")["sandboxes"].([]any); len(l) != 0 || len(sandboxDirs(t, e)) != 0 || len(e.imageEntries()) != 0 {
		t.Errorf("a refused create left something: %v", l)
	}
}

func toJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// An image sandbox survives a supervisor restart: its cache entry stays
// referenced (even with cache_max_bytes 0), an explicit session comes back
// with its image changes, and commands still get the image's Env.
func TestDockerRestart(t *testing.T) {
	e := newEnv(t)
	writeConfig(t, e, "images:\n  cache_max_bytes: 0\n")
	e.start()
	arch := filepath.Join(t.TempDir(), "img.tar")
	archive(t, arch, busyboxLayer(t))
	id := e.createSandbox(e.project(map[string]string{"a": "a\n"}), "--image", "docker-archive:"+arch)
	ws := e.rt(id, "create_workspace_session")["workspace_session_id"].(string)
	e.rt(id, "exec_command", "--yield-time-ms", "120000", "--workspace-session-id", ws, "echo kept > /etc/session-file")
	e.stop()
	e.start()
	if got := e.imageEntries(); len(got) != 1 {
		t.Fatalf("the referenced image was pruned at restart: %v", got)
	}
	r := e.rt(id, "exec_command", "--yield-time-ms", "120000", "--workspace-session-id", ws, `cat /etc/session-file; echo "env=$FROM_ARCHIVE"`)
	if out := r["output"].(string); !strings.Contains(out, "kept") || !strings.Contains(out, "env=yes") {
		t.Fatalf("restored session: %v", r)
	}
	e.mgr("destroy_sandbox", "--sandbox-id", id)
	if got := e.imageEntries(); len(got) != 0 {
		t.Errorf("destroy did not release the image: %v", got)
	}
}
