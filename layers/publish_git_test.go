package layers

import (
	"context"
	"path/filepath"
	"testing"
)

// gitStack: a workspace with a small git directory beside its sources.
func gitStack(t *testing.T) *Stack {
	return pubStack(t, func(ws string) {
		writeFile(t, filepath.Join(ws, "src", "f1.txt"), "one\n", 0o644)
		writeFile(t, filepath.Join(ws, ".git", "HEAD"), "ref: refs/heads/main\n", 0o644)
		writeFile(t, filepath.Join(ws, ".git", "config"), "[core]\n\tbare = false\n", 0o644)
		writeFile(t, filepath.Join(ws, ".git", "index"), "DIRC base\n", 0o644)
		writeFile(t, filepath.Join(ws, ".git", "refs", "heads", "main"), "1111111111111111111111111111111111111111\n", 0o644)
	})
}

// Publication never carries a git directory's private state or anything
// that can make git run a program, and neither is a rejection (issue 27
// item 1, contract A8).
func TestPublishGitPrivateAndProtected(t *testing.T) {
	cases := []struct {
		name     string
		changes  []Change
		outcomes map[string]string
		noOp     bool
		want     map[string]string // head path → state after the publish ("" = absent)
	}{
		{
			name: "config, hooks and info stay in the session; the source change lands",
			changes: []Change{
				pwrite(".git/config", "[core]\n\tfsmonitor = touch /tmp/pwned\n"),
				write(".git/hooks/post-checkout", "#!/bin/sh\ntouch /tmp/pwned\n", 0o755),
				pwrite(".git/info/attributes", "* filter=x\n"),
				pwrite(".git/objects/info/alternates", "/home/user/other/.git/objects\n"),
				pwrite("src/f1.txt", "one\ntwo\n"),
			},
			outcomes: map[string]string{".git/config": OutcomeGitProtected, ".git/hooks/post-checkout": OutcomeGitProtected,
				".git/info/attributes": OutcomeGitProtected, ".git/objects/info/alternates": OutcomeGitProtected,
				"src/f1.txt": OutcomeUnchangedHead},
			want: map[string]string{".git/config": "file 644 [core]\n\tbare = false\n", ".git/hooks/post-checkout": "",
				".git/info/attributes": "", ".git/objects/info/alternates": "", "src/f1.txt": "file 644 one\ntwo\n"},
		},
		{
			name: "only private state changed: a no-op",
			changes: []Change{
				pwrite(".git/index", "DIRC session\n"), pwrite(".git/logs/HEAD", "x\n"), pwrite(".git/COMMIT_EDITMSG", "msg\n"),
				pwrite(".git/ORIG_HEAD", "2222222222222222222222222222222222222222\n"), pwrite(".git/index.lock", ""),
			},
			outcomes: map[string]string{".git/index": OutcomeGitPrivate, ".git/logs/HEAD": OutcomeGitPrivate,
				".git/COMMIT_EDITMSG": OutcomeGitPrivate, ".git/ORIG_HEAD": OutcomeGitPrivate, ".git/index.lock": OutcomeGitPrivate},
			noOp: true,
			want: map[string]string{".git/index": "file 644 DIRC base\n", ".git/logs/HEAD": "", ".git/COMMIT_EDITMSG": ""},
		},
		{
			name:     "deleting the git directory is not published: the head keeps its repository",
			changes:  []Change{pdel(".git"), pwrite("src/f2.txt", "two\n")},
			outcomes: map[string]string{".git": OutcomeGitProtected, "src/f2.txt": OutcomeUnchangedHead},
			want:     map[string]string{".git/HEAD": "file 644 ref: refs/heads/main\n", "src/f2.txt": "file 644 two\n"},
		},
		{
			name:     "a deleted config is not published either",
			changes:  []Change{pdel(".git/config"), pdel(".git/index")},
			outcomes: map[string]string{".git/config": OutcomeGitProtected, ".git/index": OutcomeGitPrivate},
			noOp:     true,
			want:     map[string]string{".git/config": "file 644 [core]\n\tbare = false\n", ".git/index": "file 644 DIRC base\n"},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := gitStack(t)
			base := mustHead(t, s)
			// Another agent's unrelated change moved the head meanwhile.
			advance(t, s, pwrite("other.txt", "o\n"))
			for _, st := range allStrategies {
				plan, _, err := s.PublishChangeset(context.Background(), base, pchanges(c.changes...), PublishOptions{DefaultStrategy: st, DryRun: true})
				if err != nil || plan.Rejection != nil {
					t.Fatalf("strategy %s: %v, rejected: %+v", st, err, plan.Rejection)
				}
			}
			plan, res := pubOK(t, s, base, pchanges(c.changes...), PublishOptions{})
			for p, o := range c.outcomes {
				pp := wantOutcome(t, plan, p, o, "")
				if (o == OutcomeGitPrivate || o == OutcomeGitProtected) && pp.Route != RouteGit {
					t.Errorf("%s: route %q, want %q", p, pp.Route, RouteGit)
				}
			}
			if res.NoOp != c.noOp {
				t.Errorf("no-op %v, want %v", res.NoOp, c.noOp)
			}
			got := tree(t, s)
			for p, w := range c.want {
				if got[p] != w {
					t.Errorf("head %s: %q, want %q", p, got[p], w)
				}
			}
		})
	}
}
