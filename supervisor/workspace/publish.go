package workspace

import (
	"context"
	"encoding/json"
	"io/fs"
	"path/filepath"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
	"github.com/ephemeral-ai-lab/sandbox/layers"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/config"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/sandbox"
)

// Publish's objects (§3.5, §9): the resolutions argument, the publish and
// rejection objects of results and command outputs.

// ParseResolutions validates publish_workspace_session's resolutions:
// objects {path, strategy} with paths normalized per §7.2 and unique.
// Whether each names a plan path is the planner's check.
func ParseResolutions(raw []any) (map[string]layers.Strategy, error) {
	out := map[string]layers.Strategy{}
	for i, r := range raw {
		m, ok := r.(map[string]any)
		if !ok {
			return nil, catalog.Errorf(catalog.InvalidRequest, "resolutions[%d] must be an object {path, strategy}", i)
		}
		for k := range m {
			if k != "path" && k != "strategy" {
				return nil, catalog.Errorf(catalog.InvalidRequest, "resolutions[%d] has an unknown field: %s", i, k)
			}
		}
		ps, ok1 := m["path"].(string)
		st, ok2 := m["strategy"].(string)
		if !ok1 || !ok2 {
			return nil, catalog.Errorf(catalog.InvalidRequest, "resolutions[%d].path and strategy must be strings", i)
		}
		p, perr := catalog.WorkspacePath(ps, false)
		if perr != nil {
			return nil, perr
		}
		if !layers.Strategy(st).Valid() {
			return nil, catalog.Errorf(catalog.InvalidRequest, "resolutions[%d].strategy must be one of merge, ours, theirs, reject", i)
		}
		if _, dup := out[p]; dup {
			return nil, catalog.Errorf(catalog.InvalidRequest, "resolutions name %s twice", p).With("path", p)
		}
		out[p] = layers.Strategy(st)
	}
	return out, nil
}

// PublishObjectDry is a dry run's publish object: the head revision the plan
// was computed against (§9.6).
func PublishObjectDry(plan *layers.Plan, res layers.PublishResult) map[string]any {
	return map[string]any{"no_op": res.NoOp, "revision": plan.HeadRevision,
		"route_summary": plan.RouteSummary, "outcome_summary": plan.OutcomeSummary,
		"summary": PublishSummary(plan.OutcomeSummary, !plan.WouldCommit, true, plan.Rejection != nil)}
}

// PublishObject is the publish object of results and command outputs.
func PublishObject(plan *layers.Plan, res layers.PublishResult, withResolved bool) map[string]any {
	var lid any
	if !res.NoOp && res.LayerID != "" {
		lid = res.LayerID
	}
	out := map[string]any{"no_op": res.NoOp, "revision": res.Revision, "layer_id": lid}
	if plan != nil {
		out["route_summary"], out["outcome_summary"] = plan.RouteSummary, plan.OutcomeSummary
		out["summary"] = PublishSummary(plan.OutcomeSummary, res.NoOp, false, false)
		if withResolved {
			out["resolved_paths"] = plan.ResolvedPaths()
		}
		if len(plan.GitRefs) > 0 {
			out["git_refs"] = plan.GitRefs
		}
	}
	return out
}

// PublishSummary counts a publish by what happened to the session's
// changes, beside the contract's outcome_summary, whose counts name the
// resolution case: a clean publish has everything under unchanged_head
// ("head had not changed the path") and applied:0, which reads as a
// failure to a person or an agent. git_private_paths and
// git_protected_paths count what stays in the session by rule. result is published, no_op, or for a dry
// run would_publish, would_reject or no_op.
func PublishSummary(o layers.OutcomeSummary, noOp, dryRun, rejected bool) map[string]any {
	published := o.UnchangedHead + o.Applied + o.Ours + o.Merged + o.GitObject
	conflicts := o.Conflict + o.Protected
	result := "published"
	switch {
	case dryRun && (conflicts > 0 || rejected):
		result = "would_reject"
	case noOp:
		result = "no_op"
	case dryRun:
		result = "would_publish"
	}
	return map[string]any{
		"result":          result,
		"changed_paths":   published + o.Theirs + conflicts + o.GitPrivate + o.GitProtected + o.GitRef,
		"published_paths": published,
		"merged_paths":    o.Merged,
		"kept_head_paths": o.Theirs,
		"conflict_paths":  conflicts,
		// Paths inside the git directory that never leave a session
		// (contract A8): its private state and what can run programs.
		"git_private_paths":   o.GitPrivate,
		"git_protected_paths": o.GitProtected,
	}
}

// RejectionBody is the publish_rejection object as a map, so the recovery
// artifact can be added to it.
func RejectionBody(r *layers.Rejection) map[string]any {
	var m map[string]any
	b, _ := json.Marshal(r)
	_ = json.Unmarshal(b, &m)
	return m
}

// CountEntries counts the entries below dir, a tree a session controls.
func CountEntries(ctx context.Context, dir string) int {
	n := 0
	_ = WalkUpperTree(ctx, dir, func(string, fs.FileInfo) error { n++; return nil })
	return n
}

// GitOptions is the git route's configuration of a session's publish or
// sync (contract A8): the ref mode asked for (else git.publish_refs), the
// session's agent and id, and the user as the committer (the workspace
// repository's user.name/user.email, else the login name).
func GitOptions(ctx context.Context, cfg *config.Config, sb *Sandbox, ss *Session, mode layers.GitRefMode) layers.GitOptions {
	if mode == "" {
		mode = layers.GitRefMode(cfg.Git.PublishRefs)
	}
	agent := ""
	if ss.Rec.Agent != nil {
		agent = *ss.Rec.Agent
	}
	repo := &sandbox.GitRepo{Ctx: ctx, GitDir: filepath.Join(sb.Rec.WorkspaceRoot, ".git")}
	c := repo.Committer()
	return layers.GitOptions{RefMode: mode, Agent: agent, Session: ss.ID(), Committer: layers.GitIdent{Name: c.Name, Email: c.Email}}
}

// PublishOptions are the configured limits of a publish (§9, §13), with
// the compiled protected paths.
func PublishOptions(cfg *config.Config, protected *layers.Patterns) layers.PublishOptions {
	p := cfg.Runtime.Publish
	return layers.PublishOptions{
		Protected:      protected,
		MaxPlanPaths:   p.MaxPlanPaths,
		ExpansionLimit: p.ExpansionLimit,
		Merge:          layers.MergeOptions{MaxFileBytes: p.MergeMaxFileBytes, MaxEditDistance: p.MergeMaxEditDistance},
	}
}
