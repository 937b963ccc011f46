package nsholder

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// imageRootfs is a minimal image: static busybox as /bin/sh, a marker
// /etc/os-release, and entries that point out of the image (an absolute
// /etc/hosts symlink and a /tmp symlink), which must never be followed.
func imageRootfs(t *testing.T, victimFile, victimDir string) string {
	t.Helper()
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		if os.Getenv("ESBX_REQUIRE_ALL") == "1" {
			t.Fatalf("required capability missing: /bin/busybox (busybox-static): %v", err)
		}
		t.Skipf("no /bin/busybox (busybox-static): %v", err)
	}
	r := filepath.Join(t.TempDir(), "rootfs")
	for _, d := range []string{"bin", "etc"} {
		must(t, os.MkdirAll(filepath.Join(r, d), 0o755))
	}
	must(t, os.WriteFile(filepath.Join(r, "bin", "busybox"), bb, 0o755))
	for _, c := range []string{"sh", "cat", "echo", "ls", "grep", "hostname", "test"} {
		must(t, os.Symlink("busybox", filepath.Join(r, "bin", c)))
	}
	must(t, os.WriteFile(filepath.Join(r, "etc", "os-release"), []byte("ID=image\n"), 0o644))
	must(t, os.Symlink(victimFile, filepath.Join(r, "etc", "hosts")))
	must(t, os.Symlink(victimDir, filepath.Join(r, "tmp")))
	return r
}

// TestImageRoot runs an image session's command through the C exec shim
// and through the Go one (Config.Shim ""), which, the holder's binary
// being dynamically linked, starts through the host's loader and libraries
// opened before the pivot (Config.Loader): the image has neither.
func TestImageRoot(t *testing.T) {
	for _, shimKind := range []string{"c", "go"} {
		t.Run(shimKind, func(t *testing.T) { testImageRoot(t, shimKind) })
	}
}

func testImageRoot(t *testing.T, shimKind string) {
	f := newFixture(t)
	victimDir := filepath.Join(f.dir, "victim-dir")
	victimFile := filepath.Join(f.dir, "victim-file")
	must(t, os.MkdirAll(victimDir, 0o755))
	must(t, os.WriteFile(victimFile, []byte("host file\n"), 0o644))
	rootfs := imageRootfs(t, victimFile, victimDir)

	cfg := f.config("ws-image")
	cfg.HostPaths = nil
	cfg.Shim = testShim // static C
	if shimKind == "go" {
		l, err := GoShimLoader(testSelf)
		if err != nil {
			t.Fatal(err)
		}
		if l == nil {
			t.Logf("%s is static: it starts in the image without a loader", testSelf)
		}
		cfg.Shim, cfg.Loader = "", l
	}
	cfg.Image = &ImageRoot{Rootfs: rootfs, Files: map[string]string{"/etc/hosts": "127.0.1.1\tws-image\n", "/etc/hostname": "ws-image\n"}}
	s := startSession(t, cfg)
	out, code := s.run(`cat /etc/os-release /etc/hosts /etc/hostname; echo tmp-write > /tmp/x; echo changed > /etc/os-release; ` +
		`cat /etc/os-release; cat /workspace/hello.txt; test -e /usr && echo HOST-USR-VISIBLE; grep -c ' / overlay ' /proc/self/mounts; ` +
		`grep CapEff /proc/self/status; ls -l /proc/self/fd/`)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, out)
	}
	for _, want := range []string{"ID=image", "127.0.1.1\tws-image", "ws-image", "changed", "hello from lower", "CapEff:\t00000000880024ff"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	for _, leak := range []string{"ld-linux", "libc", "sandbox-supervisor", "sandbox-exec-shim"} {
		if strings.Contains(out, leak) {
			t.Errorf("the command inherited a descriptor of %s:\n%s", leak, out)
		}
	}
	if strings.Contains(out, "HOST-USR-VISIBLE") {
		t.Errorf("the host's /usr is visible in an image root:\n%s", out)
	}
	if b, _ := os.ReadFile(victimFile); string(b) != "host file\n" {
		t.Errorf("a provided file was written through the image's symlink to the host: %q", b)
	}
	if ents, _ := os.ReadDir(victimDir); len(ents) != 0 {
		t.Errorf("/tmp followed the image's symlink to the host: %v", ents)
	}
	if b, _ := os.ReadFile(filepath.Join(rootfs, "etc", "os-release")); string(b) != "ID=image\n" {
		t.Errorf("the session changed the image rootfs: %q", b)
	}
	if b, err := os.ReadFile(filepath.Join(f.scratch, ".image", "upper", "etc", "os-release")); err != nil || string(b) != "changed\n" {
		t.Errorf("the change is not in the session's image upper: %q %v", b, err)
	}
}
