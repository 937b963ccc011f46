package nsholder

// Removing trees that hold subordinate IDs (issue #27 item 7).
//
// A session with sandbox.id_mapping "subid" may chown its files to IDs of
// the caller's subordinate range (`chown -R 1000:1000 d`): on the host they
// belong to START+999, and a directory of theirs with mode 0755 does not
// let the supervisor (the caller) remove what is in it. The supervisor
// cannot join a namespace (design rule 2), so RemoveMapped starts
// `self nsholder rmtree DIR` in a new user namespace mapped exactly as a
// subid holder is (0 → the caller, 1… → the first subuid/subgid range,
// through newuidmap/newgidmap and the same sync-pipe handshake, idmap.go).
// There it is root with CAP_DAC_OVERRIDE and CAP_FOWNER over every file
// whose owner is mapped, and removes the tree with os.RemoveAll, which
// goes descriptor-relative and never follows a symlink. It creates no
// other namespace and touches nothing outside DIR.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// RemoveMapped removes dir (an absolute path) from inside a user namespace
// mapped with the caller's subordinate ranges; self is the supervisor's
// binary. It fails with a *SetupError (stage id_mapping) when the host has
// no newuidmap/newgidmap or no range for the caller, and when dir is still
// there afterwards.
func RemoveMapped(ctx context.Context, self, dir string) error {
	if !filepath.IsAbs(dir) || filepath.Clean(dir) != dir || dir == "/" {
		return fmt.Errorf("remove mapped %q: not a clean absolute path", dir)
	}
	plan, err := planSubID(defaultStartOptions)
	if err != nil {
		return fmt.Errorf("remove mapped %s: %w", dir, err)
	}
	syncR, release, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("remove mapped %s: sync pipe: %w", dir, err)
	}
	defer release.Close()
	null, err := os.Open(os.DevNull)
	if err != nil {
		syncR.Close()
		return fmt.Errorf("remove mapped %s: %w", dir, err)
	}
	cmd := exec.Command(self, "nsholder", "rmtree", dir)
	// Mappings are written by newuidmap/newgidmap once the child exists.
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUSER, Pdeathsig: syscall.SIGKILL}
	cmd.ExtraFiles = []*os.File{null, syncR} // fd 3 unused, fd 4 = syncFD
	cmd.Env = []string{envSyncFD + "=" + strconv.Itoa(syncFD)}
	out := &tailBuffer{max: 4 << 10}
	cmd.Stdout, cmd.Stderr = out, out
	err = cmd.Start()
	syncR.Close()
	null.Close()
	if err != nil {
		return fmt.Errorf("remove mapped %s: start: %w", dir, err)
	}
	err = plan.apply(ctx, cmd.Process.Pid)
	if err == nil {
		if _, werr := release.Write([]byte(syncMessage)); werr != nil {
			err = fmt.Errorf("release the helper: %w", werr)
		}
	}
	release.Close()
	if err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return fmt.Errorf("remove mapped %s: %w", dir, err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case <-ctx.Done():
		_ = cmd.Process.Kill()
		<-done
		err = ctx.Err()
	}
	if err != nil {
		msg := strings.TrimSpace(out.String())
		return fmt.Errorf("remove mapped %s: %w: %s", dir, err, msg)
	}
	if _, err := os.Lstat(dir); !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove mapped %s: still present", dir)
	}
	return nil
}

// runRemoveTree is `nsholder rmtree DIR`: wait for the mapping, then
// remove DIR as root of the mapped namespace.
func runRemoveTree(dir string) int {
	if err := awaitIDMapping(); err != nil {
		fmt.Fprintln(os.Stderr, "nsholder rmtree:", err)
		return 1
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "nsholder rmtree: not root of a mapped user namespace")
		return 1
	}
	if err := os.RemoveAll(dir); err != nil {
		fmt.Fprintln(os.Stderr, "nsholder rmtree:", err)
		return 1
	}
	return 0
}
