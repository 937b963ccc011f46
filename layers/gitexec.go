package layers

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// gitExec runs git for the git route of publication and sync on a scratch
// git directory whose objects are the layers' (see gitroute.go). It is the
// one place this package starts git: swap it for the module's shared
// hardened runner when there is one.
//
// Git here never reads the user's or the system's configuration and never
// runs a program a repository could name: no hooks (core.hooksPath points at
// an empty directory), no fsmonitor, no automatic gc, no pager, no prompt.
type gitExec struct {
	gitDir  string   // GIT_DIR
	objects string   // GIT_OBJECT_DIRECTORY (new objects land here)
	alts    []string // GIT_ALTERNATE_OBJECT_DIRECTORIES
	index   string   // GIT_INDEX_FILE ("" = gitDir/index)
	hooks   string   // an empty directory
}

// gitHardening are the -c options of every supervisor git command.
func gitHardening(hooks string) []string {
	return []string{"-c", "core.hooksPath=" + hooks, "-c", "core.fsmonitor=false", "-c", "gc.auto=0",
		"-c", "core.splitIndex=false", "-c", "core.untrackedCache=false", "-c", "commit.gpgSign=false",
		"-c", "core.sshCommand=false", "-c", "protocol.allow=never"}
}

func gitBaseEnv() []string {
	var out []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "GIT_") {
			continue
		}
		out = append(out, kv)
	}
	return append(out, "LC_ALL=C", "GIT_TERMINAL_PROMPT=0", "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null",
		"GIT_PAGER=cat", "GIT_OPTIONAL_LOCKS=0")
}

// run runs git with extra environment and stdin and returns its stdout.
func (g *gitExec) run(ctx context.Context, extra []string, stdin []byte, args ...string) (string, error) {
	full := append(gitHardening(g.hooks), args...)
	cmd := exec.CommandContext(ctx, "git", full...)
	env := append(gitBaseEnv(), "GIT_DIR="+g.gitDir)
	if g.objects != "" {
		env = append(env, "GIT_OBJECT_DIRECTORY="+g.objects)
	}
	if len(g.alts) > 0 {
		env = append(env, "GIT_ALTERNATE_OBJECT_DIRECTORIES="+strings.Join(g.alts, ":"))
	}
	if g.index != "" {
		env = append(env, "GIT_INDEX_FILE="+g.index)
	}
	cmd.Env = append(env, extra...)
	cmd.Dir = g.gitDir
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("git %s: %w: %s", args[0], err, strings.TrimSpace(errb.String()))
	}
	return out.String(), nil
}

func (g *gitExec) run1(ctx context.Context, extra []string, stdin []byte, args ...string) (string, error) {
	out, err := g.run(ctx, extra, stdin, args...)
	return strings.TrimSpace(out), err
}
