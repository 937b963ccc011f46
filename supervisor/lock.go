package supervisor

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
)

// lockDataDir takes the exclusive supervisor.lock flock for the process's
// lifetime (§2.1): a second supervisor on the same data directory refuses to start.
func lockDataDir(data string) (func(), error) {
	p := filepath.Join(data, "supervisor.lock")
	f, err := os.OpenFile(p, os.O_CREATE|os.O_RDWR|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, catalog.Errorf(catalog.ConfigError, "open %s: %v", p, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		return nil, catalog.Errorf(catalog.ConfigError, "another supervisor holds %s", p)
	}
	return func() { f.Close() }, nil
}

// ensureTokens creates gateway.token and ui.token on first start and checks
// existing ones (§2.2): owned by us, no group/other bits, one non-empty line.
func ensureTokens(configDir string) error {
	if err := os.MkdirAll(configDir, 0o700); err != nil {
		return catalog.Errorf(catalog.ConfigError, "create config directory %s: %v", configDir, err)
	}
	for _, name := range []string{"gateway.token", "ui.token"} {
		p := filepath.Join(configDir, name)
		if err := createToken(p); err != nil {
			return catalog.Errorf(catalog.ConfigError, "token file %s: %v", p, err)
		}
		if err := checkToken(p); err != nil {
			return catalog.Errorf(catalog.ConfigError, "token file %s: %v", p, err)
		}
	}
	return nil
}

// createToken writes a fresh token without clobbering: a temp file linked
// into place, so concurrent first starts converge on one token.
func createToken(p string) error {
	if _, err := os.Lstat(p); err == nil {
		return nil
	}
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(p), "."+filepath.Base(p)+".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.WriteString(hex.EncodeToString(b[:]) + "\n"); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	tmp.Close()
	if err := os.Link(tmp.Name(), p); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	return nil
}

func checkToken(p string) error {
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return fmt.Errorf("not a regular file")
	}
	if int(st.Uid) != os.Geteuid() {
		return fmt.Errorf("not owned by uid %d", os.Geteuid())
	}
	if st.Mode&0o077 != 0 {
		return fmt.Errorf("has group/other permission bits (fix: chmod 600 %s)", p)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return err
	}
	line, rest, _ := bytes.Cut(b, []byte("\n"))
	if len(bytes.TrimSpace(line)) == 0 || len(rest) != 0 {
		return fmt.Errorf("must be exactly one non-empty line")
	}
	return nil
}
