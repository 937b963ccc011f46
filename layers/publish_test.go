package layers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// ---- fixtures ----

// pubStack snapshots a workspace built by fill (paths relative to ws).
func pubStack(t *testing.T, fill func(ws string)) *Stack {
	t.Helper()
	root := tempDir(t)
	ws := filepath.Join(root, "ws")
	mkdir(t, ws, 0o755)
	fill(ws)
	s, _, err := Create(context.Background(), filepath.Join(root, "sbx", "layerstack"), ws, SnapshotOptions{})
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	return s
}

// stdStack: README.md, src/{main.go,lib/util.go,run.sh(0755)}, docs/{a,b}.md,
// link -> README.md, multi.txt (7 lines).
func stdStack(t *testing.T) *Stack {
	return pubStack(t, func(ws string) {
		writeFile(t, filepath.Join(ws, "README.md"), "hello\n", 0o644)
		writeFile(t, filepath.Join(ws, "src", "main.go"), "package main\n", 0o644)
		writeFile(t, filepath.Join(ws, "src", "lib", "util.go"), "package lib\n", 0o644)
		writeFile(t, filepath.Join(ws, "src", "run.sh"), "#!/bin/sh\necho 1\n", 0o755)
		writeFile(t, filepath.Join(ws, "docs", "a.md"), "a\n", 0o644)
		writeFile(t, filepath.Join(ws, "docs", "b.md"), "b\n", 0o644)
		writeFile(t, filepath.Join(ws, "multi.txt"), "1\n2\n3\n4\n5\n6\n7\n", 0o644)
		symlink(t, "README.md", filepath.Join(ws, "link"))
	})
}

func pwrite(p, content string) Change { return write(p, content, 0o644) }

func pdel(p string) Change { return Change{Kind: ChangeDelete, Path: p} }

func pchanges(cs ...Change) *Changeset {
	out := &Changeset{Changes: cs}
	sortChanges(out.Changes)
	return out
}

// advance publishes changes directly (another agent's work landing in head).
func advance(t *testing.T, s *Stack, cs ...Change) Manifest {
	t.Helper()
	if _, err := s.Publish(context.Background(), cs); err != nil {
		t.Fatalf("advance head: %v", err)
	}
	return mustHead(t, s)
}

func pubOK(t *testing.T, s *Stack, base Manifest, cs *Changeset, opt PublishOptions) (*Plan, PublishResult) {
	t.Helper()
	plan, res, err := s.PublishChangeset(context.Background(), base, cs, opt)
	if err != nil {
		t.Fatalf("PublishChangeset: %v", err)
	}
	return plan, res
}

func pubReject(t *testing.T, s *Stack, base Manifest, cs *Changeset, opt PublishOptions) (*Plan, *Rejection) {
	t.Helper()
	before := mustHead(t, s)
	plan, res, err := s.PublishChangeset(context.Background(), base, cs, opt)
	var rej *Rejection
	if !errors.As(err, &rej) {
		t.Fatalf("PublishChangeset: want *Rejection, got %v (res %+v)", err, res)
	}
	if plan == nil || plan.Rejection != rej || plan.WouldCommit {
		t.Fatalf("rejected plan %+v", plan)
	}
	if res.NoOp || res.LayerID != "" || res.Revision != before.Revision() {
		t.Errorf("rejected result %+v", res)
	}
	assertUnchanged(t, s, before)
	return plan, rej
}

func planPath(t *testing.T, plan *Plan, p string) PlanPath {
	t.Helper()
	for _, pp := range plan.all {
		if pp.Path == p {
			return pp
		}
	}
	t.Fatalf("path %q not in plan %+v", p, plan.all)
	return PlanPath{}
}

func wantOutcome(t *testing.T, plan *Plan, p, outcome, reason string) PlanPath {
	t.Helper()
	pp := planPath(t, plan, p)
	if pp.Outcome != outcome || pp.ConflictReason != reason {
		t.Errorf("%s: outcome %q reason %q, want %q %q", p, pp.Outcome, pp.ConflictReason, outcome, reason)
	}
	return pp
}

// tree describes the head view: "dir 755", "file 644 <content>", "symlink <target>".
func tree(t *testing.T, s *Stack) map[string]string {
	t.Helper()
	v := s.View(mustHead(t, s))
	out := map[string]string{}
	var walk func(string)
	walk = func(rel string) {
		es, err := v.ReadDir(rel)
		if err != nil {
			t.Fatalf("ReadDir(%q): %v", rel, err)
		}
		for _, e := range es {
			switch e.Kind {
			case KindDir:
				out[e.Path] = fmt.Sprintf("dir %o", e.Mode)
				walk(e.Path)
			case KindFile:
				out[e.Path] = fmt.Sprintf("file %o %s", e.Mode, readString(t, v, e.Path))
			case KindSymlink:
				out[e.Path] = "symlink " + e.Target
			default:
				out[e.Path] = "other"
			}
		}
	}
	walk("")
	return out
}

func wantFile(t *testing.T, s *Stack, p, content string, mode fs.FileMode) {
	t.Helper()
	want := fmt.Sprintf("file %o %s", mode, content)
	if got := tree(t, s)[p]; got != want {
		t.Errorf("%s: %q, want %q", p, got, want)
	}
}

func wantAbsent(t *testing.T, s *Stack, p string) {
	t.Helper()
	if got, ok := tree(t, s)[p]; ok {
		t.Errorf("%s: %q, want absent", p, got)
	}
}

func fpOf(t *testing.T, v *View, p string) Fingerprint {
	t.Helper()
	f, err := v.Fingerprint(p)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

var allStrategies = []Strategy{StrategyMerge, StrategyOurs, StrategyTheirs, StrategyReject}

// ---- §9.5 rows ----

func TestPublishUnchangedHead(t *testing.T) {
	s := stdStack(t)
	base := mustHead(t, s)
	advance(t, s, pwrite("README.md", "head\n"))
	plan, res := pubOK(t, s, base, pchanges(pwrite("src/main.go", "package main // s\n"), pwrite("new.txt", "n\n")), PublishOptions{})
	if res.NoOp || !plan.WouldCommit || res.LayerID == "" {
		t.Fatalf("res %+v", res)
	}
	wantOutcome(t, plan, "src/main.go", OutcomeUnchangedHead, "")
	wantOutcome(t, plan, "new.txt", OutcomeUnchangedHead, "")
	wantFile(t, s, "README.md", "head\n", 0o644)
	wantFile(t, s, "src/main.go", "package main // s\n", 0o644)
	wantFile(t, s, "new.txt", "n\n", 0o644)
	if plan.RouteSummary != (RouteSummary{SourceCount: 2}) || plan.OutcomeSummary != (OutcomeSummary{UnchangedHead: 2}) {
		t.Errorf("summaries %+v %+v", plan.RouteSummary, plan.OutcomeSummary)
	}
	if m := mustHead(t, s); res.Revision != m.Revision() || plan.NewHead.RootHash() != m.RootHash() || plan.NewHead.Version != m.Version {
		t.Errorf("revision %+v new head %+v head %+v", res.Revision, plan.NewHead, m)
	}
	if len(plan.Committed) != 2 || plan.Committed[0].Path != "new.txt" || plan.Committed[0].SessionSource != "" ||
		plan.Committed[1].Outcome != OutcomeUnchangedHead || plan.Committed[1].Merged {
		t.Errorf("committed %+v", plan.Committed)
	}
	if got := plan.ResolvedPaths(); len(got) != 0 {
		t.Errorf("resolved %+v", got)
	}
}

func TestPublishBothCreateDirectory(t *testing.T) {
	for _, st := range allStrategies {
		t.Run(string(st), func(t *testing.T) {
			s := stdStack(t)
			base := mustHead(t, s)
			advance(t, s, Change{Kind: ChangeDirectory, Path: "gen", Mode: 0o755}, pwrite("gen/h.txt", "h\n"))
			cs := pchanges(Change{Kind: ChangeDirectory, Path: "gen", Mode: 0o700}, pwrite("gen/s.txt", "s\n"))
			plan, _ := pubOK(t, s, base, cs, PublishOptions{DefaultStrategy: st})
			wantOutcome(t, plan, "gen", OutcomeMerged, "")
			wantOutcome(t, plan, "gen/s.txt", OutcomeUnchangedHead, "")
			wantFile(t, s, "gen/h.txt", "h\n", 0o644)
			wantFile(t, s, "gen/s.txt", "s\n", 0o644)
			if got := tree(t, s)["gen"]; got != "dir 755" {
				t.Errorf("gen: %s", got)
			}
		})
	}
}

func TestPublishSessionEqualsHead(t *testing.T) {
	for _, st := range allStrategies {
		t.Run(string(st), func(t *testing.T) {
			s := stdStack(t)
			base := mustHead(t, s)
			head := advance(t, s, pwrite("README.md", "same\n"), pdel("docs/a.md"), Change{Kind: ChangeSymlink, Path: "link", Target: "x"})
			cs := pchanges(pwrite("README.md", "same\n"), pdel("docs/a.md"), Change{Kind: ChangeSymlink, Path: "link", Target: "x"})
			if st == StrategyReject {
				plan, rej := pubReject(t, s, base, cs, PublishOptions{DefaultStrategy: st})
				for _, p := range []string{"README.md", "docs/a.md", "link"} {
					wantOutcome(t, plan, p, OutcomeConflict, ConflictReasonChangedOnBothSides)
				}
				if len(rej.Conflicts) != 3 || rej.Reason != RejectSourceConflict || rej.Path != "README.md" {
					t.Errorf("rejection %+v", rej)
				}
				return
			}
			plan, res := pubOK(t, s, base, cs, PublishOptions{DefaultStrategy: st})
			for _, p := range []string{"README.md", "docs/a.md", "link"} {
				wantOutcome(t, plan, p, OutcomeMerged, "")
			}
			if !res.NoOp || plan.WouldCommit || res.Revision != head.Revision() {
				t.Errorf("nothing to write must be a no-op: %+v", res)
			}
			// A mode difference is not "equal to head": the merge writes the session's mode.
			plan, res = pubOK(t, s, base, pchanges(write("README.md", "same\n", 0o600)), PublishOptions{DefaultStrategy: st})
			wantOutcome(t, plan, "README.md", OutcomeMerged, "")
			if res.NoOp {
				t.Errorf("mode change lost")
			}
			wantFile(t, s, "README.md", "same\n", 0o600)
		})
	}
}

func TestPublishThreeWayMerge(t *testing.T) {
	s := stdStack(t)
	base := mustHead(t, s)
	advance(t, s, pwrite("multi.txt", "1 head\n2\n3\n4\n5\n6\n7\n"))
	plan, res := pubOK(t, s, base, pchanges(pwrite("multi.txt", "1\n2\n3\n4\n5\n6\n7 session\n")), PublishOptions{})
	wantOutcome(t, plan, "multi.txt", OutcomeMerged, "")
	wantFile(t, s, "multi.txt", "1 head\n2\n3\n4\n5\n6\n7 session\n", 0o644)
	if res.NoOp || len(plan.Committed) != 1 || !plan.Committed[0].Merged || plan.Committed[0].SessionSource != "" {
		t.Errorf("res %+v committed %+v", res, plan.Committed)
	}
	if rp := plan.ResolvedPaths(); len(rp) != 1 || rp[0] != (ResolvedPath{Path: "multi.txt", Outcome: OutcomeMerged, Strategy: StrategyMerge}) {
		t.Errorf("resolved %+v", rp)
	}
	// The previous head is readable for attribution.
	if got := readString(t, s.View(plan.HeadManifest), "multi.txt"); got != "1 head\n2\n3\n4\n5\n6\n7\n" {
		t.Errorf("previous head %q", got)
	}
	if got := readString(t, s.View(plan.NewHead), "multi.txt"); got != "1 head\n2\n3\n4\n5\n6\n7 session\n" {
		t.Errorf("new head %q", got)
	}
}

func TestPublishBothAddedFile(t *testing.T) {
	s := stdStack(t)
	base := mustHead(t, s)
	advance(t, s, pwrite("new.txt", "x\n"))
	// Identical additions: equal to head.
	plan, res := pubOK(t, s, base, pchanges(pwrite("new.txt", "x\n")), PublishOptions{})
	wantOutcome(t, plan, "new.txt", OutcomeMerged, "")
	if !res.NoOp {
		t.Errorf("res %+v", res)
	}
	// Different additions conflict (empty base).
	plan, _ = pubReject(t, s, base, pchanges(pwrite("new.txt", "y\n")), PublishOptions{})
	wantOutcome(t, plan, "new.txt", OutcomeConflict, ConflictReasonTextOverlap)
}

func TestPublishStrategies(t *testing.T) {
	headV := "1\n2 head\n3\n"
	sessV := "1\n2 session\n3\n"
	for _, st := range allStrategies {
		t.Run(string(st), func(t *testing.T) {
			s := pubStack(t, func(ws string) { writeFile(t, filepath.Join(ws, "f.txt"), "1\n2\n3\n", 0o644) })
			base := mustHead(t, s)
			advance(t, s, pwrite("f.txt", headV), pwrite("g.txt", "1 head\n"))
			// g.txt merges cleanly (head added, session unchanged elsewhere).
			cs := pchanges(pwrite("f.txt", sessV), pwrite("h.txt", "new\n"))
			opt := PublishOptions{DefaultStrategy: st}
			switch st {
			case StrategyMerge, StrategyReject:
				plan, rej := pubReject(t, s, base, cs, opt)
				reason := ConflictReasonTextOverlap
				if st == StrategyReject {
					reason = ConflictReasonChangedOnBothSides
				}
				pp := wantOutcome(t, plan, "f.txt", OutcomeConflict, reason)
				if st == StrategyMerge && len(pp.Hunks) == 0 {
					t.Errorf("no hunks: %+v", pp)
				}
				wantOutcome(t, plan, "h.txt", OutcomeUnchangedHead, "")
				if rej.SourceConflict == nil || rej.SourceConflict.Path != "f.txt" ||
					!rej.SourceConflict.Expected.Equal(*pp.Base) || !rej.SourceConflict.Actual.Equal(*pp.Head) {
					t.Errorf("source conflict %+v", rej.SourceConflict)
				}
			case StrategyOurs:
				plan, _ := pubOK(t, s, base, cs, opt)
				wantOutcome(t, plan, "f.txt", OutcomeOurs, ConflictReasonTextOverlap)
				wantFile(t, s, "f.txt", sessV, 0o644)
				wantFile(t, s, "h.txt", "new\n", 0o644)
			case StrategyTheirs:
				plan, _ := pubOK(t, s, base, cs, opt)
				wantOutcome(t, plan, "f.txt", OutcomeTheirs, ConflictReasonTextOverlap)
				wantFile(t, s, "f.txt", headV, 0o644)
				wantFile(t, s, "h.txt", "new\n", 0o644)
				if rp := plan.ResolvedPaths(); len(rp) != 1 || rp[0].Outcome != OutcomeTheirs {
					t.Errorf("resolved %+v", rp)
				}
			}
		})
	}
}

func TestPublishCleanMergeUnderStrategies(t *testing.T) {
	for _, st := range []Strategy{StrategyMerge, StrategyOurs, StrategyTheirs} {
		t.Run(string(st), func(t *testing.T) {
			s := stdStack(t)
			base := mustHead(t, s)
			advance(t, s, pwrite("multi.txt", "1\n2\n3 head\n4\n5\n6\n7\n"))
			plan, _ := pubOK(t, s, base, pchanges(pwrite("multi.txt", "1\n2\n3\n4\n5 s\n6\n7\n")), PublishOptions{DefaultStrategy: st})
			wantOutcome(t, plan, "multi.txt", OutcomeMerged, "")
			wantFile(t, s, "multi.txt", "1\n2\n3 head\n4\n5 s\n6\n7\n", 0o644)
		})
	}
}

func TestPublishOtherCombinations(t *testing.T) {
	type tc struct {
		name    string
		head    []Change
		session []Change
		path    string
		reason  string
		ours    string // expected tree entry under ours ("" = absent)
		theirs  string
	}
	cases := []tc{
		{"session deletes, head modified", []Change{pwrite("README.md", "h\n")}, []Change{pdel("README.md")},
			"README.md", ConflictReasonDeleteModify, "", "file 644 h\n"},
		{"session modifies, head deleted", []Change{pdel("README.md")}, []Change{pwrite("README.md", "s\n")},
			"README.md", ConflictReasonDeleteModify, "file 644 s\n", ""},
		{"type change", []Change{{Kind: ChangeSymlink, Path: "README.md", Target: "t"}}, []Change{pwrite("README.md", "s\n")},
			"README.md", ConflictReasonTypeChange, "file 644 s\n", "symlink t"},
		{"symlink", []Change{{Kind: ChangeSymlink, Path: "link", Target: "h"}}, []Change{{Kind: ChangeSymlink, Path: "link", Target: "s"}},
			"link", ConflictReasonSymlink, "symlink s", "symlink h"},
		{"not text", []Change{pwrite("README.md", "h\x00\n")}, []Change{pwrite("README.md", "s\x00\n")},
			"README.md", ConflictReasonNotText, "file 644 s\x00\n", "file 644 h\x00\n"},
		{"mode", []Change{write("multi.txt", "1 h\n2\n3\n4\n5\n6\n7\n", 0o755)}, []Change{write("multi.txt", "1\n2\n3\n4\n5\n6\n7 s\n", 0o600)},
			"multi.txt", ConflictReasonMode, "file 600 1\n2\n3\n4\n5\n6\n7 s\n", "file 755 1 h\n2\n3\n4\n5\n6\n7\n"},
	}
	for _, c := range cases {
		for _, st := range allStrategies {
			t.Run(c.name+"/"+string(st), func(t *testing.T) {
				s := stdStack(t)
				base := mustHead(t, s)
				advance(t, s, c.head...)
				cs := pchanges(c.session...)
				opt := PublishOptions{DefaultStrategy: st}
				switch st {
				case StrategyMerge, StrategyReject:
					plan, _ := pubReject(t, s, base, cs, opt)
					reason := c.reason
					if st == StrategyReject {
						reason = ConflictReasonChangedOnBothSides
					}
					wantOutcome(t, plan, c.path, OutcomeConflict, reason)
				case StrategyOurs, StrategyTheirs:
					plan, _ := pubOK(t, s, base, cs, opt)
					want := c.ours
					outcome := OutcomeOurs
					if st == StrategyTheirs {
						want, outcome = c.theirs, OutcomeTheirs
					}
					wantOutcome(t, plan, c.path, outcome, c.reason)
					if got := tree(t, s)[c.path]; got != want {
						t.Errorf("%s: %q, want %q", c.path, got, want)
					}
				}
			})
		}
	}
}

func TestPublishTooLarge(t *testing.T) {
	s := stdStack(t)
	base := mustHead(t, s)
	advance(t, s, pwrite("multi.txt", "1 head\n2\n3\n4\n5\n6\n7\n"))
	opt := PublishOptions{Merge: MergeOptions{MaxFileBytes: 8}}
	plan, _ := pubReject(t, s, base, pchanges(pwrite("multi.txt", "1\n2\n3\n4\n5\n6\n7 s\n")), opt)
	wantOutcome(t, plan, "multi.txt", OutcomeConflict, ConflictReasonTooLarge)

	// Trivial cases hold for any size (and any bytes): head only changed the
	// mode, or the session only did.
	s = stdStack(t)
	base = mustHead(t, s)
	advance(t, s, write("multi.txt", "1\n2\n3\n4\n5\n6\n7\n", 0o755), pwrite("README.md", "head\x00\n"))
	cs := pchanges(pwrite("multi.txt", "1\n2\n3\n4\n5\n6\n7 s\n"), write("README.md", "hello\n", 0o600))
	plan, res := pubOK(t, s, base, cs, opt)
	wantOutcome(t, plan, "multi.txt", OutcomeMerged, "")
	wantOutcome(t, plan, "README.md", OutcomeMerged, "")
	wantFile(t, s, "multi.txt", "1\n2\n3\n4\n5\n6\n7 s\n", 0o755)
	wantFile(t, s, "README.md", "head\x00\n", 0o600)
	if res.NoOp || len(plan.Committed) != 2 || !plan.Committed[0].Merged || plan.Committed[1].Merged {
		t.Errorf("committed %+v", plan.Committed)
	}
}

func TestPublishExecutableBitSurvivesMerge(t *testing.T) {
	s := stdStack(t)
	base := mustHead(t, s)
	// Head only makes the file executable; the session edits its content.
	advance(t, s, write("multi.txt", "1\n2\n3\n4\n5\n6\n7\n", 0o755))
	plan, _ := pubOK(t, s, base, pchanges(pwrite("multi.txt", "1\n2\n3\n4\n5\n6\n7 s\n")), PublishOptions{})
	wantOutcome(t, plan, "multi.txt", OutcomeMerged, "")
	wantFile(t, s, "multi.txt", "1\n2\n3\n4\n5\n6\n7 s\n", 0o755)

	// The session makes run.sh non-executable-by-others while head edits it.
	s = stdStack(t)
	base = mustHead(t, s)
	advance(t, s, write("src/run.sh", "#!/bin/sh\necho 2\n", 0o755))
	plan, _ = pubOK(t, s, base, pchanges(write("src/run.sh", "#!/bin/sh\necho 1\n", 0o700)), PublishOptions{})
	wantOutcome(t, plan, "src/run.sh", OutcomeMerged, "")
	wantFile(t, s, "src/run.sh", "#!/bin/sh\necho 2\n", 0o700)
}

// ---- whole-changeset behaviour ----

func TestPublishStaleBaseDisjointEdit(t *testing.T) {
	s := stdStack(t)
	base := mustHead(t, s)
	advance(t, s, pwrite("multi.txt", "1\n2 head\n3\n4\n5\n6\n7\n"))
	advance(t, s, pwrite("docs/a.md", "a head\n"))
	plan, res := pubOK(t, s, base, pchanges(pwrite("multi.txt", "1\n2\n3\n4\n5\n6 s\n7\n"), pwrite("docs/b.md", "b s\n")), PublishOptions{})
	if plan.BaseRevision != base.Revision() || plan.HeadRevision.ManifestVersion != base.Version+2 || res.NoOp {
		t.Errorf("plan revisions %+v %+v", plan.BaseRevision, plan.HeadRevision)
	}
	wantFile(t, s, "multi.txt", "1\n2 head\n3\n4\n5\n6 s\n7\n", 0o644)
	wantFile(t, s, "docs/a.md", "a head\n", 0o644)
	wantFile(t, s, "docs/b.md", "b s\n", 0o644)
}

func TestPublishOverlapRejected(t *testing.T) {
	s := stdStack(t)
	base := mustHead(t, s)
	head := advance(t, s, pwrite("multi.txt", "1\n2\n3 head\n4\n5\n6\n7\n"))
	before := tree(t, s)
	plan, rej := pubReject(t, s, base, pchanges(pwrite("multi.txt", "1\n2\n3 s\n4\n5\n6\n7\n"), pwrite("zzz.txt", "z\n")), PublishOptions{})
	if rej.Reason != RejectSourceConflict || rej.Path != "multi.txt" || rej.ProtectedDrop != nil || rej.Message != nil {
		t.Errorf("rejection %+v", rej)
	}
	wantBase := fpOf(t, s.View(base), "multi.txt")
	wantHead := fpOf(t, s.View(head), "multi.txt")
	if sc := rej.SourceConflict; sc == nil || !sc.Expected.Equal(wantBase) || !sc.Actual.Equal(wantHead) || sc.Expected.Equal(sc.Actual) {
		t.Errorf("source_conflict %+v", sc)
	}
	if len(rej.Conflicts) != 1 || rej.Conflicts[0].ConflictReason != ConflictReasonTextOverlap || len(rej.Conflicts[0].Hunks) == 0 ||
		!rej.Conflicts[0].Expected.Equal(wantBase) || !rej.Conflicts[0].Actual.Equal(wantHead) || rej.Conflicts[0].Session == nil {
		t.Errorf("conflicts %+v", rej.Conflicts)
	}
	if len(plan.Conflicts) != 1 || plan.OutcomeSummary.Conflict != 1 || plan.OutcomeSummary.UnchangedHead != 1 {
		t.Errorf("plan %+v", plan)
	}
	if !reflect.DeepEqual(tree(t, s), before) {
		t.Errorf("head content changed")
	}
	if !strings.Contains(rej.Error(), "source_conflict") {
		t.Errorf("error text %q", rej.Error())
	}
}

func TestPublishDeleteModifyRejectsWhole(t *testing.T) {
	s := stdStack(t)
	base := mustHead(t, s)
	advance(t, s, pwrite("docs/a.md", "a head\n"))
	_, rej := pubReject(t, s, base, pchanges(pdel("docs/a.md"), pwrite("unrelated.txt", "u\n"), pwrite("build.log", "l\n")), PublishOptions{})
	if rej.Path != "docs/a.md" || rej.Conflicts[0].ConflictReason != ConflictReasonDeleteModify {
		t.Errorf("rejection %+v", rej)
	}
	wantAbsent(t, s, "unrelated.txt")
	wantFile(t, s, "docs/a.md", "a head\n", 0o644)
}

func TestPublishProtectedPaths(t *testing.T) {
	s := stdStack(t)
	base := mustHead(t, s)
	advance(t, s, pwrite("multi.txt", "1\n2\n3 head\n4\n5\n6\n7\n"))
	opt := PublishOptions{Protected: CompilePatterns([]string{"secrets/", "*.pem"}), DefaultStrategy: StrategyOurs,
		Resolutions: map[string]Strategy{"secrets/key": StrategyTheirs}}
	cs := pchanges(pwrite("secrets/key", "k\n"), pwrite("a/.wh.x", "w\n"), pwrite("certs/c.pem", "c\n"),
		pwrite("fine.txt", "f\n"), pwrite("multi.txt", "1\n2\n3 s\n4\n5\n6\n7\n"))
	plan, rej := pubReject(t, s, base, cs, opt)
	for _, p := range []string{"secrets/key", "a/.wh.x", "certs/c.pem"} {
		wantOutcome(t, plan, p, OutcomeProtected, "")
	}
	wantOutcome(t, plan, "multi.txt", OutcomeOurs, ConflictReasonTextOverlap)
	if rej.Reason != RejectProtectedPath || rej.Path != "a/.wh.x" || rej.SourceConflict != nil || len(rej.Conflicts) != 3 {
		t.Errorf("rejection %+v", rej)
	}
	for _, c := range rej.Conflicts {
		if c.Reason != RejectProtectedPath {
			t.Errorf("conflict %+v", c)
		}
	}
	if plan.OutcomeSummary.Protected != 3 || plan.RouteSummary.SourceCount != 2 {
		t.Errorf("summaries %+v %+v", plan.OutcomeSummary, plan.RouteSummary)
	}
	wantAbsent(t, s, "fine.txt")
	// A protected path below a protected directory pattern, as a deletion.
	s2 := pubStack(t, func(ws string) { writeFile(t, filepath.Join(ws, "secrets", "k"), "k\n", 0o644) })
	_, rej = pubReject(t, s2, mustHead(t, s2), pchanges(pdel("secrets")), PublishOptions{Protected: CompilePatterns([]string{"secrets/"})})
	if rej.Path != "secrets" || rej.Reason != RejectProtectedPath {
		t.Errorf("rejection %+v", rej)
	}
}

func TestPublishProtectedDrops(t *testing.T) {
	s := stdStack(t)
	base := mustHead(t, s)
	fifo := Drop{Path: "run/fifo", Reason: DropUnsupportedSpecialFile}
	bad := Drop{Path: InvalidLayerPathPrefix + "ff", Reason: DropInvalidLayerPath}
	cs := pchanges(pwrite("ok.txt", "ok\n"))
	cs.Drops = []Drop{bad, fifo}

	plan, rej := pubReject(t, s, base, cs, PublishOptions{})
	if rej.Reason != RejectProtectedPath || rej.Path != bad.Path || rej.ProtectedDrop == nil || *rej.ProtectedDrop != ProtectedDrop(bad) ||
		len(rej.Conflicts) != 2 || rej.Conflicts[1].ProtectedDrop == nil || rej.Conflicts[1].ProtectedDrop.Reason != DropUnsupportedSpecialFile {
		t.Errorf("rejection %+v", rej)
	}
	wantOutcome(t, plan, fifo.Path, OutcomeProtected, "")
	if plan.RouteSummary.SourceCount != 1 {
		t.Errorf("route summary %+v", plan.RouteSummary)
	}

	// Implicit: the FIFO is dropped silently, the invalid name still rejects.
	_, rej = pubReject(t, s, base, cs, PublishOptions{Implicit: true, Resolutions: map[string]Strategy{bad.Path: StrategyTheirs}})
	if len(rej.Conflicts) != 1 || rej.Path != bad.Path {
		t.Errorf("implicit rejection %+v", rej)
	}
	// theirs drops exactly the named entries.
	_, rej = pubReject(t, s, base, cs, PublishOptions{Resolutions: map[string]Strategy{bad.Path: StrategyTheirs}})
	if len(rej.Conflicts) != 1 || rej.Path != fifo.Path {
		t.Errorf("rejection %+v", rej)
	}
	plan, res := pubOK(t, s, base, cs, PublishOptions{Resolutions: map[string]Strategy{bad.Path: StrategyTheirs, fifo.Path: StrategyTheirs}})
	wantOutcome(t, plan, fifo.Path, OutcomeTheirs, "")
	if res.NoOp || len(plan.ResolvedPaths()) != 2 {
		t.Errorf("res %+v resolved %+v", res, plan.ResolvedPaths())
	}
	wantFile(t, s, "ok.txt", "ok\n", 0o644)

	// Implicit with only the FIFO: it is dropped and the rest lands.
	s = stdStack(t)
	cs.Drops = []Drop{fifo}
	plan, _ = pubOK(t, s, mustHead(t, s), cs, PublishOptions{Implicit: true})
	if len(plan.all) != 1 {
		t.Errorf("plan %+v", plan.all)
	}
	wantFile(t, s, "ok.txt", "ok\n", 0o644)
}

func TestPublishIgnoredLastWriterWins(t *testing.T) {
	s := pubStack(t, func(ws string) {
		writeFile(t, filepath.Join(ws, ".gitignore"), "*.log\nbuild/\n", 0o644)
		writeFile(t, filepath.Join(ws, "app.log"), "base\n", 0o644)
		writeFile(t, filepath.Join(ws, "build", "out.o"), "o\n", 0o644)
		writeFile(t, filepath.Join(ws, "src.c"), "c\n", 0o644)
	})
	base := mustHead(t, s)
	advance(t, s, pwrite("app.log", "head\n"), pdel("build/out.o"), pwrite(".gitignore", "\n"))
	// The session's own .gitignore change does not affect its routing; the
	// base's .gitignore routes, not head's.
	cs := pchanges(pwrite("app.log", "session\n"), pwrite("build/out.o", "o2\n"), pwrite("new.log", "n\n"),
		pwrite(".gitignore", "*.log\nbuild/\nsrc.c\n"), pwrite("src.c", "c2\n"))
	for _, st := range allStrategies {
		plan, _, err := s.PublishChangeset(context.Background(), base, cs, PublishOptions{DefaultStrategy: st, DryRun: true})
		if err != nil {
			t.Fatalf("%s: %v", st, err)
		}
		if pp := planPath(t, plan, ".gitignore"); pp.Route != RouteSource {
			t.Errorf(".gitignore route %s", pp.Route)
		}
		for _, p := range []string{"app.log", "build/out.o", "new.log"} {
			if pp := wantOutcome(t, plan, p, OutcomeApplied, ""); pp.Route != RouteIgnored {
				t.Errorf("%s route %s", p, pp.Route)
			}
		}
		wantOutcome(t, plan, "src.c", OutcomeUnchangedHead, "")
	}
	cs = pchanges(pwrite("app.log", "session\n"), pwrite("build/out.o", "o2\n"), pwrite("src.c", "c2\n"))
	plan, _ := pubOK(t, s, base, cs, PublishOptions{DefaultStrategy: StrategyReject})
	if plan.RouteSummary != (RouteSummary{SourceCount: 1, IgnoredCount: 2}) || plan.OutcomeSummary.Applied != 2 {
		t.Errorf("summaries %+v %+v", plan.RouteSummary, plan.OutcomeSummary)
	}
	wantFile(t, s, "app.log", "session\n", 0o644)
	wantFile(t, s, "build/out.o", "o2\n", 0o644)
	wantFile(t, s, "src.c", "c2\n", 0o644)
}

// ---- structural check ----

func TestPublishStructuralHeadDeletedDir(t *testing.T) {
	for _, st := range allStrategies {
		t.Run(string(st), func(t *testing.T) {
			s := stdStack(t)
			base := mustHead(t, s)
			advance(t, s, pdel("docs"))
			cs := pchanges(pwrite("docs/c.md", "c\n"), pwrite("top.txt", "t\n"))
			cs.Carriers = []Change{{Kind: ChangeDirectory, Path: "docs", Mode: 0o755}}
			opt := PublishOptions{DefaultStrategy: st}
			switch st {
			case StrategyMerge, StrategyReject:
				plan, _ := pubReject(t, s, base, cs, opt)
				reason := ConflictReasonDirectoryStructure
				if st == StrategyReject {
					reason = ConflictReasonChangedOnBothSides
				}
				wantOutcome(t, plan, "docs/c.md", OutcomeConflict, reason)
				wantAbsent(t, s, "docs")
			case StrategyOurs:
				plan, _ := pubOK(t, s, base, cs, opt)
				wantOutcome(t, plan, "docs/c.md", OutcomeOurs, ConflictReasonDirectoryStructure)
				got := tree(t, s)
				if got["docs"] != "dir 755" || got["docs/c.md"] != "file 644 c\n" || got["docs/a.md"] != "" {
					t.Errorf("tree %v", got)
				}
			case StrategyTheirs:
				plan, _ := pubOK(t, s, base, cs, opt)
				wantOutcome(t, plan, "docs/c.md", OutcomeTheirs, ConflictReasonDirectoryStructure)
				wantAbsent(t, s, "docs")
				wantFile(t, s, "top.txt", "t\n", 0o644)
			}
		})
	}
}

func TestPublishStructuralOpaqueReplace(t *testing.T) {
	for _, st := range allStrategies {
		t.Run(string(st), func(t *testing.T) {
			s := stdStack(t)
			base := mustHead(t, s)
			advance(t, s, pwrite("docs/head.md", "h\n"))
			cs := pchanges(Change{Kind: ChangeOpaqueDir, Path: "docs", Mode: 0o755}, pwrite("docs/new.md", "n\n"),
				Change{Kind: ChangeDirectory, Path: "docs/sub", Mode: 0o755}, pwrite("docs/sub/x.md", "x\n"))
			opt := PublishOptions{DefaultStrategy: st}
			switch st {
			case StrategyMerge, StrategyReject:
				plan, rej := pubReject(t, s, base, cs, opt)
				reason := ConflictReasonDirectoryStructure
				if st == StrategyReject {
					reason = ConflictReasonChangedOnBothSides
				}
				wantOutcome(t, plan, "docs", OutcomeConflict, reason)
				wantOutcome(t, plan, "docs/new.md", OutcomeUnchangedHead, "")
				if rej.Path != "docs" || len(rej.Conflicts) != 1 {
					t.Errorf("rejection %+v", rej)
				}
			case StrategyOurs:
				plan, _ := pubOK(t, s, base, cs, opt)
				wantOutcome(t, plan, "docs", OutcomeOurs, ConflictReasonDirectoryStructure)
				got := tree(t, s)
				want := map[string]string{"docs": "dir 755", "docs/new.md": "file 644 n\n", "docs/sub": "dir 755", "docs/sub/x.md": "file 644 x\n"}
				for k, v := range got {
					if strings.HasPrefix(k, "docs") && want[k] != v {
						t.Errorf("%s: %q, want %q", k, v, want[k])
					}
				}
				if len(want) != 4 || got["docs/new.md"] == "" {
					t.Errorf("tree %v", got)
				}
			case StrategyTheirs:
				plan, res := pubOK(t, s, base, cs, opt)
				for _, p := range []string{"docs", "docs/new.md", "docs/sub", "docs/sub/x.md"} {
					wantOutcome(t, plan, p, OutcomeTheirs, map[string]string{"docs": ConflictReasonDirectoryStructure}[p])
				}
				if !res.NoOp {
					t.Errorf("everything dropped must be a no-op: %+v", res)
				}
				wantFile(t, s, "docs/head.md", "h\n", 0o644)
				wantFile(t, s, "docs/a.md", "a\n", 0o644)
				wantAbsent(t, s, "docs/new.md")
			}
		})
	}
}

func TestPublishStructuralCleanWhenHeadUntouched(t *testing.T) {
	s := stdStack(t)
	base := mustHead(t, s)
	advance(t, s, pwrite("README.md", "h\n"))
	cs := pchanges(Change{Kind: ChangeOpaqueDir, Path: "docs", Mode: 0o755}, pwrite("docs/new.md", "n\n"), pdel("src/lib"))
	plan, _ := pubOK(t, s, base, cs, PublishOptions{})
	wantOutcome(t, plan, "docs", OutcomeUnchangedHead, "")
	wantOutcome(t, plan, "src/lib", OutcomeUnchangedHead, "")
	got := tree(t, s)
	if got["docs/a.md"] != "" || got["docs/new.md"] != "file 644 n\n" || got["src/lib"] != "" || got["README.md"] != "file 644 h\n" {
		t.Errorf("tree %v", got)
	}
}

func TestPublishOursOpaqueKeepsMergedChild(t *testing.T) {
	s := stdStack(t)
	base := mustHead(t, s)
	advance(t, s, pwrite("docs/head.md", "h\n"), pwrite("docs/both.md", "same\n"))
	cs := pchanges(Change{Kind: ChangeOpaqueDir, Path: "docs", Mode: 0o755}, pwrite("docs/both.md", "same\n"))
	plan, _ := pubOK(t, s, base, cs, PublishOptions{Resolutions: map[string]Strategy{"docs": StrategyOurs}})
	wantOutcome(t, plan, "docs", OutcomeOurs, ConflictReasonDirectoryStructure)
	wantOutcome(t, plan, "docs/both.md", OutcomeMerged, "")
	wantFile(t, s, "docs/both.md", "same\n", 0o644)
	wantAbsent(t, s, "docs/head.md")
}

// ---- opaque expansion ----

func TestPublishOpaqueExpansion(t *testing.T) {
	mk := func(t *testing.T) *Stack {
		return pubStack(t, func(ws string) {
			writeFile(t, filepath.Join(ws, ".gitignore"), "*.o\ncache/\n", 0o644)
			writeFile(t, filepath.Join(ws, "d", "a.c"), "a\n", 0o644)
			writeFile(t, filepath.Join(ws, "d", "a.o"), "o\n", 0o644)
			writeFile(t, filepath.Join(ws, "objs", "x.o"), "o\n", 0o644)
			writeFile(t, filepath.Join(ws, "cache", "k"), "k\n", 0o644)
			writeFile(t, filepath.Join(ws, "keys", "id.pem"), "p\n", 0o644)
			writeFile(t, filepath.Join(ws, "big", "1"), "1\n", 0o644)
			writeFile(t, filepath.Join(ws, "big", "2"), "2\n", 0o644)
			writeFile(t, filepath.Join(ws, "big", "3"), "3\n", 0o644)
		})
	}
	opq := func(p string) Change { return Change{Kind: ChangeOpaqueDir, Path: p, Mode: 0o755} }
	prot := CompilePatterns([]string{"*.pem"})

	s := mk(t)
	base := mustHead(t, s)
	_, rej := pubReject(t, s, base, pchanges(opq("d")), PublishOptions{})
	if rej.Reason != RejectOpaqueDirMixedRoutes || rej.Path != "d" || rej.Message == nil {
		t.Errorf("mixed: %+v", rej)
	}
	_, rej = pubReject(t, s, base, pchanges(opq("keys")), PublishOptions{Protected: prot})
	if rej.Reason != RejectOpaqueDirProtectedDescendant || rej.Path != "keys" || !strings.Contains(*rej.Message, "keys/id.pem") {
		t.Errorf("protected descendant: %+v", rej)
	}
	plan, rej := pubReject(t, s, base, pchanges(opq("big"), pwrite("z.txt", "z\n")), PublishOptions{ExpansionLimit: 2})
	if rej.Reason != RejectOpaqueDirExpansionLimit || rej.Path != "big" {
		t.Errorf("limit: %+v", rej)
	}
	wantOutcome(t, plan, "big", OutcomeConflict, "")
	// Check order: protected paths before opaque rejections before source conflicts.
	advance(t, s, pwrite("cache/k", "head\n"), pwrite("d/a.c", "head\n"))
	_, rej = pubReject(t, s, base, pchanges(opq("d"), pwrite("keys/id.pem", "x\n"), pwrite("d/a.c", "s\n")), PublishOptions{Protected: prot})
	if rej.Reason != RejectProtectedPath || rej.Path != "keys/id.pem" || len(rej.Conflicts) != 3 ||
		rej.Conflicts[0].Path != "d" || rej.Conflicts[1].Path != "d/a.c" || rej.Conflicts[1].Reason != RejectSourceConflict {
		t.Errorf("order: %+v", rej)
	}
	_, rej = pubReject(t, s, base, pchanges(opq("d"), pwrite("d/a.c", "s\n")), PublishOptions{})
	if rej.Reason != RejectOpaqueDirMixedRoutes || rej.SourceConflict != nil {
		t.Errorf("order: %+v", rej)
	}

	// All ignored → ignored route (applied, even though head changed inside).
	plan, _ = pubOK(t, s, base, pchanges(opq("cache"), opq("objs"), pwrite("objs/y.o", "y\n")), PublishOptions{DefaultStrategy: StrategyReject})
	for _, p := range []string{"cache", "objs", "objs/y.o"} {
		if pp := wantOutcome(t, plan, p, OutcomeApplied, ""); pp.Route != RouteIgnored {
			t.Errorf("%s: route %s", p, pp.Route)
		}
	}
	got := tree(t, s)
	if got["cache"] != "dir 755" || got["cache/k"] != "" || got["objs/x.o"] != "" || got["objs/y.o"] != "file 644 y\n" {
		t.Errorf("tree %v", got)
	}
}

// ---- resolutions ----

func TestPublishResolutionsExactPaths(t *testing.T) {
	s := stdStack(t)
	base := mustHead(t, s)
	advance(t, s, pwrite("README.md", "h\n"), pwrite("docs/a.md", "a h\n"), pwrite("docs/b.md", "b h\n"))
	cs := pchanges(pwrite("README.md", "s\n"), pwrite("docs/a.md", "a s\n"), pwrite("docs/b.md", "b s\n"))
	plan, rej := pubReject(t, s, base, cs, PublishOptions{Resolutions: map[string]Strategy{"README.md": StrategyOurs, "docs/a.md": StrategyTheirs}})
	wantOutcome(t, plan, "README.md", OutcomeOurs, ConflictReasonTextOverlap)
	wantOutcome(t, plan, "docs/a.md", OutcomeTheirs, ConflictReasonTextOverlap)
	wantOutcome(t, plan, "docs/b.md", OutcomeConflict, ConflictReasonTextOverlap)
	if len(rej.Conflicts) != 1 || rej.Path != "docs/b.md" {
		t.Errorf("rejection %+v", rej)
	}
}

func TestPublishResolutionsExactPathsCommit(t *testing.T) {
	s := stdStack(t)
	base := mustHead(t, s)
	advance(t, s, pwrite("README.md", "h\n"), pwrite("docs/a.md", "a h\n"), pwrite("multi.txt", "1 h\n2\n3\n4\n5\n6\n7\n"))
	cs := pchanges(pwrite("README.md", "s\n"), pwrite("docs/a.md", "a s\n"), pwrite("multi.txt", "1\n2\n3\n4\n5\n6\n7 s\n"))
	plan, res := pubOK(t, s, base, cs, PublishOptions{DefaultStrategy: StrategyMerge,
		Resolutions: map[string]Strategy{"README.md": StrategyOurs, "docs/a.md": StrategyTheirs}})
	wantFile(t, s, "README.md", "s\n", 0o644)
	wantFile(t, s, "docs/a.md", "a h\n", 0o644)
	wantFile(t, s, "multi.txt", "1 h\n2\n3\n4\n5\n6\n7 s\n", 0o644)
	want := []ResolvedPath{{"README.md", OutcomeOurs, StrategyOurs}, {"docs/a.md", OutcomeTheirs, StrategyTheirs}, {"multi.txt", OutcomeMerged, StrategyMerge}}
	if got := plan.ResolvedPaths(); !reflect.DeepEqual(got, want) || res.NoOp {
		t.Errorf("resolved %+v", got)
	}
	if len(plan.Committed) != 2 || plan.Committed[0].Path != "README.md" || plan.Committed[0].Outcome != OutcomeOurs ||
		plan.Committed[1].Path != "multi.txt" || !plan.Committed[1].Merged {
		t.Errorf("committed %+v", plan.Committed)
	}
}

func TestPublishResolutionErrors(t *testing.T) {
	s := stdStack(t)
	base := mustHead(t, s)
	before := mustHead(t, s)
	cs := pchanges(pwrite("README.md", "s\n"))
	cs.Carriers = []Change{{Kind: ChangeDirectory, Path: "src", Mode: 0o755}}
	for _, opt := range []PublishOptions{
		{Resolutions: map[string]Strategy{"nope.txt": StrategyOurs}},
		{Resolutions: map[string]Strategy{"src": StrategyOurs}}, // a carrier is not a plan path
		{Resolutions: map[string]Strategy{"README.md": StrategyOurs, "x": StrategyOurs}, DryRun: true},
	} {
		plan, _, err := s.PublishChangeset(context.Background(), base, cs, opt)
		var re *ResolutionError
		if !errors.As(err, &re) || !re.Unknown || plan != nil {
			t.Errorf("%+v: %v", opt.Resolutions, err)
		}
	}
	for _, opt := range []PublishOptions{{DefaultStrategy: "mine"}, {Resolutions: map[string]Strategy{"README.md": "x"}}} {
		_, _, err := s.PublishChangeset(context.Background(), base, cs, opt)
		var re *ResolutionError
		if !errors.As(err, &re) || re.Unknown {
			t.Errorf("%+v: %v", opt, err)
		}
	}
	assertUnchanged(t, s, before)
}

// ---- dry run ----

func TestPublishDryRunPredicts(t *testing.T) {
	type scenario struct {
		name string
		cs   func() *Changeset
		opt  PublishOptions
	}
	for _, sc := range []scenario{
		{"commit", func() *Changeset {
			return pchanges(pwrite("multi.txt", "1\n2\n3\n4\n5\n6\n7 s\n"), pwrite("new.txt", "n\n"), pwrite("README.md", "s\n"), pdel("docs"))
		}, PublishOptions{Resolutions: map[string]Strategy{"README.md": StrategyTheirs, "docs": StrategyOurs}}},
		{"reject", func() *Changeset {
			return pchanges(pwrite("README.md", "s\n"), pwrite("new.txt", "n\n"))
		}, PublishOptions{}},
		{"noop", func() *Changeset { return pchanges(pwrite("README.md", "h\n")) }, PublishOptions{}},
	} {
		t.Run(sc.name, func(t *testing.T) {
			s := stdStack(t)
			base := mustHead(t, s)
			advance(t, s, pwrite("README.md", "h\n"), pwrite("multi.txt", "1 h\n2\n3\n4\n5\n6\n7\n"), pwrite("docs/c.md", "c\n"))
			head := mustHead(t, s)
			before := tree(t, s)
			opt := sc.opt
			opt.DryRun = true
			dplan, dres, err := s.PublishChangeset(context.Background(), base, sc.cs(), opt)
			if err != nil {
				t.Fatalf("dry run: %v", err)
			}
			assertUnchanged(t, s, head)
			if !reflect.DeepEqual(tree(t, s), before) || len(s.Leases()) != 0 {
				t.Fatalf("dry run changed something")
			}
			if dres.Revision != head.Revision() || dplan.HeadRevision != head.Revision() {
				t.Errorf("dry-run revision %+v", dres)
			}
			opt.DryRun = false
			rplan, rres, err := s.PublishChangeset(context.Background(), base, sc.cs(), opt)
			var rej *Rejection
			if err != nil && !errors.As(err, &rej) {
				t.Fatal(err)
			}
			dj, _ := json.Marshal(dplan)
			rj, _ := json.Marshal(rplan)
			if string(dj) != string(rj) || dplan.OutcomeSummary != rplan.OutcomeSummary || dplan.RouteSummary != rplan.RouteSummary {
				t.Errorf("dry-run plan differs:\n%s\n%s", dj, rj)
			}
			if !reflect.DeepEqual(dplan.ResolvedPaths(), rplan.ResolvedPaths()) {
				t.Errorf("resolved paths differ")
			}
			committed := err == nil && !rres.NoOp
			if dplan.WouldCommit != committed || rplan.WouldCommit != committed || dres.NoOp != rres.NoOp {
				t.Errorf("would_commit %v / committed %v (noop %v %v)", dplan.WouldCommit, committed, dres.NoOp, rres.NoOp)
			}
			if (dplan.Rejection == nil) != (rej == nil) {
				t.Errorf("rejection %+v vs %v", dplan.Rejection, err)
			} else if rej != nil {
				dj, _ := json.Marshal(dplan.Rejection)
				rj, _ := json.Marshal(rej)
				if string(dj) != string(rj) {
					t.Errorf("rejections differ:\n%s\n%s", dj, rj)
				}
			}
			if want := map[string]bool{"commit": true}[sc.name]; committed != want {
				t.Errorf("committed %v", committed)
			}
		})
	}
}

// ---- no-ops, truncation, JSON, concurrency ----

func TestPublishNoOps(t *testing.T) {
	s := stdStack(t)
	base := mustHead(t, s)
	for _, cs := range []*Changeset{nil, {}, {Carriers: []Change{{Kind: ChangeDirectory, Path: "src", Mode: 0o755}}}} {
		plan, res := pubOK(t, s, base, cs, PublishOptions{})
		if !res.NoOp || res.Revision != base.Revision() || plan.WouldCommit || len(plan.Paths) != 0 {
			t.Errorf("empty: %+v %+v", res, plan)
		}
		dplan, dres, err := s.PublishChangeset(context.Background(), base, cs, PublishOptions{DryRun: true})
		if err != nil || !dres.NoOp || dplan.WouldCommit {
			t.Errorf("empty dry run: %v %+v", err, dres)
		}
	}
	assertUnchanged(t, s, base)

	// Identical to the head layer.
	cs := pchanges(pwrite("README.md", "v2\n"), write("src/run.sh", "#!/bin/sh\necho 2\n", 0o755), Change{Kind: ChangeDirectory, Path: "newdir", Mode: 0o700})
	cs.Carriers = []Change{{Kind: ChangeDirectory, Path: "src", Mode: 0o755}}
	_, res := pubOK(t, s, base, cs, PublishOptions{})
	if res.NoOp {
		t.Fatal("first publish was a no-op")
	}
	head := mustHead(t, s)
	dplan, dres, err := s.PublishChangeset(context.Background(), head, cs, PublishOptions{DryRun: true})
	if err != nil || !dres.NoOp || dplan.WouldCommit {
		t.Errorf("dry run of identical: %v %+v", err, dres)
	}
	plan, res := pubOK(t, s, head, cs, PublishOptions{})
	if !res.NoOp || res.Revision != head.Revision() || plan.WouldCommit {
		t.Errorf("identical: %+v", res)
	}
	// Same with a stale base: every path merges as equal to head.
	plan, res = pubOK(t, s, base, cs, PublishOptions{})
	if !res.NoOp || plan.OutcomeSummary.Merged != 3 {
		t.Errorf("identical from stale base: %+v %+v", res, plan.OutcomeSummary)
	}
	assertUnchanged(t, s, head)
	// A mode-only difference is not a no-op.
	cs2 := pchanges(pwrite("README.md", "v2\n"), write("src/run.sh", "#!/bin/sh\necho 2\n", 0o700), Change{Kind: ChangeDirectory, Path: "newdir", Mode: 0o700})
	if _, res := pubOK(t, s, head, cs2, PublishOptions{}); res.NoOp {
		t.Errorf("mode-only change lost")
	}
	wantFile(t, s, "src/run.sh", "#!/bin/sh\necho 2\n", 0o700)
}

func TestPublishPlanTruncation(t *testing.T) {
	s := stdStack(t)
	base := mustHead(t, s)
	advance(t, s, pwrite("f4", "h\n"))
	var cs []Change
	for i := range 6 {
		cs = append(cs, pwrite(fmt.Sprintf("f%d", i), "s\n"))
	}
	opt := PublishOptions{MaxPlanPaths: 3, Resolutions: map[string]Strategy{"f5": StrategyOurs}, DryRun: true}
	plan, _, err := s.PublishChangeset(context.Background(), base, pchanges(cs...), opt)
	if err != nil {
		t.Fatal(err)
	}
	if !plan.Truncated || len(plan.Paths) != 3 || plan.Paths[2].Path != "f2" || len(plan.all) != 6 ||
		plan.RouteSummary.SourceCount != 6 || plan.OutcomeSummary.UnchangedHead != 5 || plan.OutcomeSummary.Conflict != 1 {
		t.Errorf("plan %+v", plan)
	}
	if len(plan.Conflicts) != 1 || plan.Conflicts[0].Path != "f4" || plan.Rejection == nil || plan.Rejection.Path != "f4" {
		t.Errorf("conflicts %+v", plan.Conflicts)
	}
}

func TestPublishJSONShapes(t *testing.T) {
	s := stdStack(t)
	base := mustHead(t, s)
	advance(t, s, pwrite("README.md", "h\n"))
	plan, rej := pubReject(t, s, base, pchanges(pwrite("README.md", "s\n"), pdel("docs/a.md")), PublishOptions{})
	var pm map[string]any
	b, _ := json.Marshal(plan)
	if err := json.Unmarshal(b, &pm); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"base_revision", "head_revision", "default_strategy", "truncated", "paths", "conflicts"} {
		if _, ok := pm[k]; !ok {
			t.Errorf("plan lacks %s: %s", k, b)
		}
	}
	if len(pm) != 6 {
		t.Errorf("plan keys %s", b)
	}
	p0 := pm["paths"].([]any)[0].(map[string]any)
	for _, k := range []string{"path", "change", "route", "strategy", "outcome", "conflict_reason", "base", "head", "session", "hunks"} {
		if _, ok := p0[k]; !ok {
			t.Errorf("path lacks %s: %v", k, p0)
		}
	}
	if fp := p0["session"].(map[string]any); fp["kind"] != "file" || fp["executable"] != false {
		t.Errorf("session fingerprint %v", fp)
	}
	p1 := pm["paths"].([]any)[1].(map[string]any)
	if _, ok := p1["conflict_reason"]; ok {
		t.Errorf("conflict_reason on a clean path: %v", p1)
	}
	if _, ok := p1["hunks"]; ok {
		t.Errorf("hunks on a clean path: %v", p1)
	}
	b, _ = json.Marshal(rej)
	var rm map[string]any
	if err := json.Unmarshal(b, &rm); err != nil {
		t.Fatal(err)
	}
	if rm["protected_drop"] != nil || rm["message"] != nil || rm["source_conflict"] == nil || rm["path"] != "README.md" || rm["reason"] != "source_conflict" {
		t.Errorf("rejection %s", b)
	}
	for _, k := range []string{"path", "reason", "source_conflict", "protected_drop", "message", "conflicts"} {
		if _, ok := rm[k]; !ok {
			t.Errorf("rejection lacks %s: %s", k, b)
		}
	}
	c0 := rm["conflicts"].([]any)[0].(map[string]any)
	for _, k := range []string{"path", "reason", "strategy", "conflict_reason", "expected", "actual", "session", "hunks"} {
		if _, ok := c0[k]; !ok {
			t.Errorf("conflict lacks %s: %v", k, c0)
		}
	}
	b, _ = json.Marshal(plan.OutcomeSummary)
	if string(b) != `{"unchanged_head":1,"applied":0,"merged":0,"ours":0,"theirs":0,"conflict":1,"protected":0,"git_private":0,"git_protected":0,"git_object":0,"git_ref":0}` {
		t.Errorf("outcome summary %s", b)
	}
	b, _ = json.Marshal(plan.RouteSummary)
	if string(b) != `{"source_count":2,"ignored_count":0}` {
		t.Errorf("route summary %s", b)
	}
}

func TestPublishInvalidBase(t *testing.T) {
	s := stdStack(t)
	base := mustHead(t, s)
	bad := cloneManifest(base)
	bad.Layers = append([]LayerRef{{LayerID: "L000009-deadbeef", Path: "layers/L000009-deadbeef"}}, bad.Layers...)
	plan, rej := pubReject(t, s, bad, pchanges(pwrite("a", "a\n")), PublishOptions{})
	if rej.Reason != RejectInvalidBaseRevision || rej.Message == nil || rej.Path != "" || len(rej.Conflicts) != 0 || plan.Rejection != rej {
		t.Errorf("rejection %+v", rej)
	}
}

func TestPublishConcurrentDisjoint(t *testing.T) {
	s := stdStack(t)
	base := mustHead(t, s)
	const n = 6
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cs := pchanges(pwrite(fmt.Sprintf("src/agent%d.go", i), fmt.Sprintf("package a%d\n", i)),
				pwrite(fmt.Sprintf("docs/n%d.md", i), "n\n"))
			cs.Carriers = []Change{{Kind: ChangeDirectory, Path: "docs", Mode: 0o755}, {Kind: ChangeDirectory, Path: "src", Mode: 0o755}}
			_, res, err := s.PublishChangeset(context.Background(), base, cs, PublishOptions{})
			if err == nil && res.NoOp {
				err = errors.New("no-op")
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("agent %d: %v", i, err)
		}
	}
	m := mustHead(t, s)
	if m.Version != base.Version+n || len(m.Layers) != len(base.Layers)+n {
		t.Errorf("head %+v", m)
	}
	got := tree(t, s)
	for i := range n {
		if got[fmt.Sprintf("src/agent%d.go", i)] != fmt.Sprintf("file 644 package a%d\n", i) || got[fmt.Sprintf("docs/n%d.md", i)] == "" {
			t.Errorf("agent %d's files missing: %v", i, got)
		}
	}
}

// ---- from a kernel-format upper dir ----

func TestPublishCapturedUpper(t *testing.T) {
	requireOverlayFormat(t)
	s := stdStack(t)
	base := mustHead(t, s)
	advance(t, s, pwrite("multi.txt", "1 h\n2\n3\n4\n5\n6\n7\n"), pwrite("src/lib/head.go", "package lib\n"))
	upper := filepath.Join(tempDir(t), "upper")
	writeFile(t, filepath.Join(upper, "multi.txt"), "1\n2\n3\n4\n5\n6\n7 s\n", 0o644)
	writeFile(t, filepath.Join(upper, "src", "new.go"), "package main\n", 0o644)
	chardev00(t, filepath.Join(upper, "README.md"))
	mkdir(t, filepath.Join(upper, "docs"), 0o755)
	setx(t, filepath.Join(upper, "docs"), "user.overlay.opaque", "y")
	writeFile(t, filepath.Join(upper, "docs", "only.md"), "o\n", 0o644)
	mkdir(t, filepath.Join(upper, "src", "lib"), 0o755)
	chardev00(t, filepath.Join(upper, "src", "lib", "util.go"))
	if err := unix.Mkfifo(filepath.Join(upper, "pipe"), 0o644); err != nil {
		t.Fatal(err)
	}
	cs, err := Capture(context.Background(), upper, s.View(base))
	if err != nil {
		t.Fatal(err)
	}
	if len(cs.Carriers) != 2 || len(cs.Drops) != 1 {
		t.Fatalf("capture %+v", cs)
	}
	_, rej := pubReject(t, s, base, cs, PublishOptions{})
	if rej.ProtectedDrop == nil || rej.Path != "pipe" {
		t.Errorf("rejection %+v", rej)
	}
	plan, res := pubOK(t, s, base, cs, PublishOptions{Implicit: true})
	if res.NoOp || plan.RouteSummary.SourceCount != 6 || plan.OutcomeSummary.Merged != 1 || plan.OutcomeSummary.UnchangedHead != 5 {
		t.Errorf("plan %+v %+v", plan.RouteSummary, plan.OutcomeSummary)
	}
	got := tree(t, s)
	want := map[string]string{
		"docs": "dir 755", "docs/only.md": "file 644 o\n", "link": "symlink README.md",
		"multi.txt": "file 644 1 h\n2\n3\n4\n5\n6\n7 s\n", "src": "dir 755", "src/lib": "dir 755",
		"src/lib/head.go": "file 644 package lib\n", "src/main.go": "file 644 package main\n",
		"src/new.go": "file 644 package main\n", "src/run.sh": "file 755 #!/bin/sh\necho 1\n",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("tree\n got %v\nwant %v", got, want)
	}
	if _, err := os.Stat(upper); err != nil {
		t.Errorf("upper dir touched: %v", err)
	}
}

func TestPublishOursOpaqueTheirsChild(t *testing.T) {
	s := stdStack(t)
	base := mustHead(t, s)
	advance(t, s, pwrite("docs/h.md", "h\n"), pwrite("docs/a.md", "a head\n"))
	cs := pchanges(Change{Kind: ChangeOpaqueDir, Path: "docs", Mode: 0o755}, pwrite("docs/a.md", "a s\n"), pwrite("docs/n.md", "n\n"))
	plan, _ := pubOK(t, s, base, cs, PublishOptions{Resolutions: map[string]Strategy{"docs": StrategyOurs, "docs/a.md": StrategyTheirs}})
	wantOutcome(t, plan, "docs", OutcomeOurs, ConflictReasonDirectoryStructure)
	wantOutcome(t, plan, "docs/a.md", OutcomeTheirs, ConflictReasonTextOverlap)
	got := tree(t, s)
	// head's docs/a.md stays although the opaque directory hides head below it.
	if got["docs/a.md"] != "file 644 a head\n" || got["docs/n.md"] != "file 644 n\n" || got["docs/h.md"] != "" || got["docs/b.md"] != "" {
		t.Errorf("tree %v", got)
	}
	if len(plan.Committed) != 3 || plan.Committed[1].Outcome != OutcomeTheirs || plan.Committed[1].SessionSource != "" {
		t.Errorf("committed %+v", plan.Committed)
	}
}

func TestPublishStructuralHeadReplacedDirByFile(t *testing.T) {
	for _, st := range []Strategy{StrategyMerge, StrategyOurs, StrategyTheirs} {
		t.Run(string(st), func(t *testing.T) {
			s := stdStack(t)
			base := mustHead(t, s)
			advance(t, s, pwrite("docs", "now a file\n"))
			cs := pchanges(pwrite("docs/c.md", "c\n"))
			cs.Carriers = []Change{{Kind: ChangeDirectory, Path: "docs", Mode: 0o755}}
			opt := PublishOptions{DefaultStrategy: st}
			switch st {
			case StrategyMerge:
				plan, _ := pubReject(t, s, base, cs, opt)
				wantOutcome(t, plan, "docs/c.md", OutcomeConflict, ConflictReasonDirectoryStructure)
			case StrategyOurs:
				pubOK(t, s, base, cs, opt)
				if got := tree(t, s); got["docs"] != "dir 755" || got["docs/c.md"] != "file 644 c\n" || len(got) != 10 {
					t.Errorf("tree %v", got)
				}
			case StrategyTheirs:
				_, res := pubOK(t, s, base, cs, opt)
				if !res.NoOp {
					t.Errorf("res %+v", res)
				}
				wantFile(t, s, "docs", "now a file\n", 0o644)
			}
		})
	}
}

// A session's small files are read once by the planner and staged and
// attributed from those bytes (CommittedFile.Content); a file over
// maxLoadedFile is streamed from the upper dir at each step. Either way the
// layer holds the session's bytes and its digest is the one
// ComputeLayerDigest computes from the upper files.
func TestPublishStagesSessionBytes(t *testing.T) {
	big := strings.Repeat("0123456789abcde\n", maxLoadedFile/16+1)
	files := []struct {
		path, content string
		mode          fs.FileMode
		inMemory      bool
	}{
		{"small.txt", "s\n", 0o644, true},
		{"empty", "", 0o600, true},
		{"run.sh", "#!/bin/sh\n", 0o755, true},
		{"big.txt", big, 0o644, false},
	}
	s := stdStack(t)
	base := mustHead(t, s)
	upper := filepath.Join(tempDir(t), "upper")
	mkdir(t, upper, 0o755)
	for _, f := range files {
		writeFile(t, filepath.Join(upper, f.path), f.content, f.mode)
	}
	cs, err := Capture(context.Background(), upper, s.View(base))
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	want, err := ComputeLayerDigest(cs.Changes)
	if err != nil {
		t.Fatal(err)
	}
	plan, res := pubOK(t, s, base, cs, PublishOptions{})
	if res.NoOp || res.Digest != want {
		t.Fatalf("publish %+v, want digest %s", res, want)
	}
	if stored, err := s.StoredDigest(res.LayerID); err != nil || stored != want {
		t.Errorf("stored digest %q %v, want %s", stored, err, want)
	}
	committed := map[string]CommittedFile{}
	for _, cf := range plan.Committed {
		committed[cf.Path] = cf
	}
	for _, f := range files {
		wantFile(t, s, f.path, f.content, f.mode)
		cf, ok := committed[f.path]
		if !ok || cf.SessionSource != f.path {
			t.Errorf("%s: committed %+v", f.path, cf)
			continue
		}
		switch {
		case f.inMemory && (cf.Content == nil || string(cf.Content) != f.content):
			t.Errorf("%s: Content %q, want the session's bytes", f.path, cf.Content)
		case !f.inMemory && cf.Content != nil:
			t.Errorf("%s: Content of %d bytes, want nil (streamed)", f.path, len(cf.Content))
		}
	}
}
