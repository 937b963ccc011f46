package fuseoverlay

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// privHelperEnv makes the test binary do one operation on a file and exit:
// "OP:CAPS:PATH" where OP is write, truncate or chown and CAPS is "drop"
// (without CAP_FSETID, as an unprivileged writer) or "keep". The caller
// must be another process than the server, and capabilities are per
// thread, so the helper locks its thread before dropping one.
const privHelperEnv = "FUSEOVERLAY_TEST_PRIV"

func privHelper(arg string) {
	op, rest, _ := strings.Cut(arg, ":")
	caps, path, _ := strings.Cut(rest, ":")
	runtime.LockOSThread()
	fail := func(err error) {
		fmt.Fprintln(os.Stderr, op, err)
		os.Exit(1)
	}
	if caps == "drop" {
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		var data [2]unix.CapUserData
		if err := unix.Capget(&hdr, &data[0]); err != nil {
			fail(err)
		}
		data[0].Effective &^= 1 << unix.CAP_FSETID
		if err := unix.Capset(&hdr, &data[0]); err != nil {
			fail(err)
		}
	}
	var err error
	switch op {
	case "write":
		var fd int
		if fd, err = unix.Open(path, unix.O_WRONLY|unix.O_CLOEXEC, 0); err == nil {
			_, err = unix.Pwrite(fd, []byte("more"), 2)
			unix.Close(fd)
		}
	case "truncate":
		err = unix.Truncate(path, 1)
	case "chown":
		err = unix.Chown(path, 0, 0)
	default:
		err = fmt.Errorf("unknown op %q", op)
	}
	if err != nil {
		fail(err)
	}
	os.Exit(0)
}

// TestKillPrivOnWrite: the server negotiates FUSE_HANDLE_KILLPRIV_V2, so
// it, not the kernel, must clear set-id bits the way a write, truncate or
// chown does on a native filesystem: S_ISUID always, S_ISGID only with
// group execute, for a caller without CAP_FSETID (a chown always). A
// rootless server lacks CAP_FSETID in the initial namespace, so its own
// write to the backing file clears them as well; killPrivs is what keeps
// this true for a server that has it.
func TestKillPrivOnWrite(t *testing.T) {
	cases := []struct {
		name, op, caps string
		mode, want     uint32
		lower          bool
	}{
		{"suid write unprivileged", "write", "drop", 0o4755, 0o755, false},
		{"sgid+xgrp write unprivileged", "write", "drop", 0o2755, 0o755, false},
		{"sgid without xgrp write unprivileged", "write", "drop", 0o2745, 0o2745, false},
		{"suid+sgid write unprivileged", "write", "drop", 0o6775, 0o775, false},
		// The kernel judges CAP_FSETID for FUSE against the initial
		// namespace (capable()), so in a session's namespace even its
		// root drops the bits; so did the kernel's own clearing before
		// the server did it.
		{"suid write with CAP_FSETID", "write", "keep", 0o4755, 0o755, false},
		{"suid lower file write unprivileged", "write", "drop", 0o4755, 0o755, true},
		{"suid truncate unprivileged", "truncate", "drop", 0o4755, 0o755, false},
		{"suid truncate with CAP_FSETID", "truncate", "keep", 0o4755, 0o755, false},
		{"suid chown", "chown", "keep", 0o4755, 0o755, false},
		{"plain write unprivileged", "write", "drop", 0o755, 0o755, false},
	}
	lower, upper := tree{}, tree{}
	for i := range cases {
		name := fmt.Sprintf("f%d", i)
		if cases[i].lower {
			lower[name] = "content"
		} else {
			upper[name] = "content"
		}
	}
	f := mountLayers(t, []tree{lower}, upper)
	for i, c := range cases {
		dir := f.upper
		if c.lower {
			dir = f.lowers[0]
		}
		must(t, os.Chmod(dir+fmt.Sprintf("/f%d", i), os.FileMode(c.mode&0o777)|unixToGoMode(c.mode)))
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := f.p(fmt.Sprintf("f%d", i))
			if got := modeOf(t, p); got != c.mode {
				t.Fatalf("mode before: %04o, want %04o", got, c.mode)
			}
			cmd := exec.Command(os.Args[0])
			cmd.Env = append(os.Environ(), privHelperEnv+"="+c.op+":"+c.caps+":"+p)
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("helper: %v %s", err, out)
			}
			if got := modeOf(t, p); got != c.want {
				t.Errorf("mode after %s: %04o, want %04o", c.op, got, c.want)
			}
			// What the mount shows is what the upper holds.
			var st unix.Stat_t
			must(t, unix.Lstat(fmt.Sprintf("%s/f%d", f.upper, i), &st))
			if got := st.Mode & 07777; got != c.want {
				t.Errorf("upper mode after %s: %04o, want %04o", c.op, got, c.want)
			}
		})
	}
}

// unixToGoMode converts set-id bits to os.FileMode's.
func unixToGoMode(m uint32) os.FileMode {
	var fm os.FileMode
	if m&unix.S_ISUID != 0 {
		fm |= os.ModeSetuid
	}
	if m&unix.S_ISGID != 0 {
		fm |= os.ModeSetgid
	}
	return fm
}
