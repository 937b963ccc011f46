package nsholder

// Subordinate-ID mapping (§5.4 Identity, sandbox.id_mapping "subid").
//
// "single" (the default) is Go's own UidMappings/GidMappings: the holder
// is started as root of a user namespace that maps only 0 → the caller's
// uid and gid, with setgroups denied. "subid" also maps 1…count to the
// caller's first /etc/subuid and /etc/subgid range, which only the setuid
// helpers newuidmap and newgidmap (package uidmap) may write. The
// handshake:
//
//  1. Start resolves newuidmap/newgidmap on PATH and the caller's ranges
//     (matched by user name or numeric uid, first range, as shadow-utils
//     does) before anything is spawned.
//  2. It starts `self nsholder serve` with CLONE_NEWUSER and the other
//     namespace flags but no mappings, the read end of a pipe as fd 4 and
//     ESBX_NSHOLDER_SYNC_FD=4 in its environment.
//  3. The holder, first thing in serve, blocks reading fd 4. Its first
//     execve ran while it was unmapped, so it holds no capability yet.
//  4. Start runs `newuidmap PID 0 UID 1 1 START COUNT` and the same with
//     newgidmap, then writes "mapped" to the pipe and closes it. On any
//     failure it kills the child instead (which sees EOF).
//  5. The holder re-execs /proc/self/exe with the same arguments and
//     ESBX_NSHOLDER_MAPPED=1: capabilities are computed at execve, and now
//     its uid is 0 of the mapped namespace, so it gets the full set. The
//     capability gain resets the parent-death signal, which it sets again.
//     It then proceeds exactly as a single-mapped holder (fd 3 survives the
//     exec). A failure of this step is reported as the reply to the setup
//     request, at stage id_mapping.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"os/user"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Values of Config.IDMapping ("" is IDMappingSingle).
const (
	IDMappingSingle = "single"
	IDMappingSubID  = "subid"
)

// stageIDMapping is the SetupError stage of every subid mapping failure.
const stageIDMapping = "id_mapping"

const (
	envSyncFD   = "ESBX_NSHOLDER_SYNC_FD" // holder: wait on this fd for "mapped", then re-exec
	envMapped   = "ESBX_NSHOLDER_MAPPED"  // holder: this is the re-exec inside the mapped namespace
	syncFD      = 4                       // the sync pipe in the holder (after the control channel, fd 3)
	syncMessage = "mapped"
)

// startOptions are Start's host lookups, replaceable by tests.
type startOptions struct {
	subuidFile, subgidFile string
}

var defaultStartOptions = startOptions{subuidFile: "/etc/subuid", subgidFile: "/etc/subgid"}

// subIDRange is one subordinate ID range: count IDs from start.
type subIDRange struct{ start, count uint32 }

// subIDPlan is what the parent needs to map a subid holder.
type subIDPlan struct {
	newuidmap, newgidmap string
	uid, gid             int
	uids, gids           subIDRange
}

func idMappingError(format string, a ...any) *SetupError {
	return &SetupError{Stage: stageIDMapping, Err: fmt.Sprintf(format, a...)}
}

// planSubID finds the helpers and the caller's ranges. Errors are
// *SetupError at stage id_mapping.
func planSubID(opts startOptions) (*subIDPlan, error) {
	p := &subIDPlan{uid: os.Geteuid(), gid: os.Getegid()}
	for _, h := range []struct {
		name string
		dst  *string
	}{{"newuidmap", &p.newuidmap}, {"newgidmap", &p.newgidmap}} {
		path, err := exec.LookPath(h.name)
		if err != nil {
			return nil, idMappingError("%s not found on PATH: install the uidmap package", h.name)
		}
		*h.dst = path
	}
	name := strconv.Itoa(p.uid)
	if u, err := user.LookupId(name); err == nil && u.Username != "" {
		name = u.Username
	}
	var err error
	if p.uids, err = readSubIDRange(opts.subuidFile, name, p.uid); err != nil {
		return nil, err
	}
	if p.gids, err = readSubIDRange(opts.subgidFile, name, p.uid); err != nil {
		return nil, err
	}
	return p, nil
}

// readSubIDRange returns the first range of the owner name, or of the
// numeric uid, in a subuid/subgid file ("owner:start:count" lines, as
// shadow-utils reads them: malformed lines and empty ranges are skipped).
func readSubIDRange(file, name string, uid int) (subIDRange, error) {
	b, err := os.ReadFile(file)
	if errors.Is(err, fs.ErrNotExist) {
		return subIDRange{}, idMappingError("no range for user %s in %s (the file does not exist)", name, file)
	}
	if err != nil {
		return subIDRange{}, idMappingError("read %s: %v", file, err)
	}
	numeric := strconv.Itoa(uid)
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Split(line, ":")
		if len(f) != 3 || (f[0] != name && f[0] != numeric) {
			continue
		}
		start, err1 := strconv.ParseUint(f[1], 10, 32)
		count, err2 := strconv.ParseUint(f[2], 10, 32)
		if err1 != nil || err2 != nil || count == 0 || start+count-1 > 0xfffffffe {
			continue
		}
		return subIDRange{start: uint32(start), count: uint32(count)}, nil
	}
	return subIDRange{}, idMappingError("no range for user %s in %s", name, file)
}

// subIDAttr turns NamespaceAttr's SysProcAttr into one without mappings:
// the parent writes them with newuidmap/newgidmap once the child exists.
func subIDAttr(a *syscall.SysProcAttr) {
	a.UidMappings, a.GidMappings = nil, nil
	a.GidMappingsEnableSetgroups = false
}

// apply maps the user namespace of pid: 0 → the caller, 1… → the range.
func (p *subIDPlan) apply(ctx context.Context, pid int) error {
	run := func(helper string, id int, r subIDRange) error {
		args := []string{strconv.Itoa(pid), "0", strconv.Itoa(id), "1", "1",
			strconv.FormatUint(uint64(r.start), 10), strconv.FormatUint(uint64(r.count), 10)}
		cmd := exec.CommandContext(ctx, helper, args...)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			msg := fmt.Sprintf("%s %s: %v", helper, strings.Join(args, " "), err)
			if s := strings.TrimSpace(out.String()); s != "" {
				msg += ": " + s
			}
			return idMappingError("%s", msg)
		}
		return nil
	}
	if err := run(p.newuidmap, p.uid, p.uids); err != nil {
		return err
	}
	return run(p.newgidmap, p.gid, p.gids)
}

// awaitIDMapping is the holder's side of the handshake, run before
// anything else in serve. In a single-mapped holder it does nothing. A
// waiting holder re-execs itself once mapped (and does not return); the
// re-exec'd holder re-arms its parent-death signal and makes sure it is
// root. A returned error is reported as the reply to the setup request.
func awaitIDMapping() error {
	if os.Getenv(envMapped) != "" {
		os.Unsetenv(envMapped)
		// The capabilities gained at execve cleared the parent-death signal.
		if err := unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(unix.SIGKILL), 0, 0, 0); err != nil {
			return atStage(stageIDMapping, "PR_SET_PDEATHSIG: %w", err)
		}
		if os.Getuid() != 0 || os.Geteuid() != 0 || os.Getgid() != 0 || os.Getegid() != 0 {
			if err := unix.Setresgid(0, 0, 0); err != nil {
				return atStage(stageIDMapping, "not gid 0 in the mapped namespace and setresgid(0): %w", err)
			}
			if err := unix.Setresuid(0, 0, 0); err != nil {
				return atStage(stageIDMapping, "not uid 0 in the mapped namespace and setresuid(0): %w", err)
			}
		}
		return nil
	}
	v := os.Getenv(envSyncFD)
	if v == "" {
		return nil
	}
	os.Unsetenv(envSyncFD)
	fd, err := strconv.Atoi(v)
	if err != nil || fd != syncFD {
		return atStage(stageIDMapping, "bad %s=%q", envSyncFD, v)
	}
	f := os.NewFile(uintptr(fd), "idmap-sync")
	buf := make([]byte, len(syncMessage))
	_, err = io.ReadFull(f, buf)
	f.Close()
	if err != nil || string(buf) != syncMessage {
		// The parent kills us when mapping fails; EOF alone means it is gone.
		return atStage(stageIDMapping, "no mapping from the supervisor (%v)", err)
	}
	env := append(os.Environ(), envMapped+"=1")
	err = unix.Exec("/proc/self/exe", os.Args, env)
	return atStage(stageIDMapping, "re-exec in the mapped namespace: %w", err)
}

// SubIDRange is the first subordinate range that Start would map for the
// owner name (or the numeric uid) in a subuid/subgid file; doctor reports it.
func SubIDRange(file, name string, uid int) (start, count uint32, err error) {
	r, err := readSubIDRange(file, name, uid)
	return r.start, r.count, err
}
