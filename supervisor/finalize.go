package supervisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/ephemeral-ai-lab/sandbox/layers"
)

// rejection is a publish that commits nothing (§9.8). Its body is the
// contract's publish_rejection object.
type rejection struct {
	reason string
	body   map[string]any
}

func (r *rejection) Error() string { return "publish rejected: " + r.reason }

// publishOutcome is what a publish did.
type publishOutcome struct {
	noOp     bool
	revision layers.Revision
	layerID  string
	source   int // counted source changes
}

func (o publishOutcome) object() map[string]any {
	var lid any
	if !o.noOp {
		lid = o.layerID
	}
	return map[string]any{"no_op": o.noOp, "revision": o.revision, "layer_id": lid}
}

func newRejection(reason string, conflicts []map[string]any) *rejection {
	first := conflicts[0]
	body := map[string]any{
		"path": first["path"], "reason": reason, "source_conflict": nil, "protected_drop": nil, "message": nil,
		"conflicts": conflicts,
	}
	if pd, ok := first["protected_drop"]; ok {
		body["protected_drop"] = pd
	}
	if reason == "source_conflict" {
		body["source_conflict"] = map[string]any{"path": first["path"], "expected": first["expected"], "actual": first["actual"]}
	}
	return &rejection{reason: reason, body: body}
}

// protectedPath reports whether a publish may not write p (§9.2).
func (s *Supervisor) protectedPath(p string) bool {
	for _, seg := range strings.Split(p, "/") {
		if strings.HasPrefix(seg, ".wh.") {
			return true
		}
	}
	return matchesAny(s.cfg.Runtime.Publish.ProtectedPaths, p)
}

// publishSession captures a session's upper dir and commits it as one layer
// when nothing it changed moved in head since its base; otherwise it rejects
// listing every path that moved. (Per-path merge and strategies extend this.)
func (s *Supervisor) publishSession(ctx context.Context, sb *sandbox, ss *session) (publishOutcome, error) {
	base := layers.Manifest{SchemaVersion: layers.SchemaVersion, Layers: ss.rec.Lease.Layers}
	baseView := sb.stack.View(base)
	cs, err := layers.Capture(ctx, ss.upper(), baseView)
	if err != nil {
		return publishOutcome{}, fmt.Errorf("capture: %w", err)
	}
	var protected []map[string]any
	for _, d := range cs.Drops {
		if ss.implicit() && d.Reason == "unsupported_special_file" {
			continue // implicit finalization drops special files silently (§5.1)
		}
		protected = append(protected, map[string]any{"path": d.Path, "reason": "protected_path", "strategy": "merge",
			"protected_drop": map[string]any{"path": d.Path, "reason": d.Reason}, "hunks": []any{}})
	}
	for _, ch := range cs.Changes {
		if s.protectedPath(ch.Path) {
			protected = append(protected, map[string]any{"path": ch.Path, "reason": "protected_path", "strategy": "merge", "hunks": []any{}})
		}
	}
	if len(protected) > 0 {
		return publishOutcome{}, newRejection("protected_path", protected)
	}
	if len(cs.Changes) == 0 {
		head, err := sb.stack.Head()
		return publishOutcome{noOp: true, revision: head.Revision()}, err
	}
	res, err := sb.stack.Update(ctx, func(head *layers.View) ([]layers.Change, error) {
		if head.Manifest().RootHash() != base.RootHash() {
			var conflicts []map[string]any
			for _, ch := range cs.Changes {
				b, err := baseView.Fingerprint(ch.Path)
				if err != nil {
					return nil, err
				}
				h, err := head.Fingerprint(ch.Path)
				if err != nil {
					return nil, err
				}
				if !b.Equal(h) {
					conflicts = append(conflicts, map[string]any{"path": ch.Path, "reason": "source_conflict", "strategy": "merge",
						"conflict_reason": "changed_on_both_sides", "expected": b, "actual": h, "hunks": []any{}})
				}
			}
			if len(conflicts) > 0 {
				return nil, newRejection("source_conflict", conflicts)
			}
		}
		return append(append([]layers.Change{}, cs.Changes...), cs.Carriers...), nil
	})
	if err != nil {
		return publishOutcome{}, err
	}
	return publishOutcome{noOp: res.NoOp, revision: res.Revision, layerID: res.LayerID, source: len(cs.Changes)}, nil
}

// finalizeImplicit ends an implicit session (§6.6): quiesce (the holder and
// its PID namespace die), capture, publish, destroy. It returns the fields
// the draining command reports. A rejected publish keeps the upper dir as a
// recovery artifact so no agent's work vanishes (§9.9).
func (s *Supervisor) finalizeImplicit(ctx context.Context, sb *sandbox, ss *session, drain *command) map[string]any {
	ctx, cancel := context.WithTimeout(ctx, time.Duration(s.cfg.Runtime.Workspace.FinalizeTimeoutS*float64(time.Second)))
	defer cancel()
	ss.gate.Lock()
	defer ss.gate.Unlock()
	ss.setState(sessFinalizing)
	ss.mu.Lock()
	h := ss.holder
	ss.holder = nil
	ss.mu.Unlock()
	if h != nil {
		_ = h.Close(0) // SIGKILL of the whole PID namespace: nothing writes during capture
	}
	out, err := s.publishSession(ctx, sb, ss)
	extra := map[string]any{}
	var rej *rejection
	switch {
	case err == nil:
		extra["publish"] = out.object()
	case errors.As(err, &rej):
		artifact := s.keepRecoveryArtifact(ctx, sb, ss, rej)
		body := rej.body
		if artifact != "" {
			body["recovery_artifact"] = artifact
		}
		extra["publish_rejected"], extra["publish_reject_class"], extra["publish_rejection"] = true, rej.reason, body
		s.log.Warn("workspace_session.finalize.publish_failed", "sandbox", sb.rec.ID, "workspace_session_id", ss.id(), "reject_class", rej.reason)
	default:
		s.keepRecoveryArtifact(ctx, sb, ss, &rejection{reason: "publish_error", body: map[string]any{"message": err.Error()}})
		extra["publish_rejected"], extra["publish_reject_class"] = true, "publish_error"
		extra["publish_rejection"] = map[string]any{"path": nil, "reason": "publish_error", "source_conflict": nil,
			"protected_drop": nil, "message": err.Error(), "conflicts": []any{}}
		s.log.Warn("workspace_session.finalize.publish_failed", "sandbox", sb.rec.ID, "workspace_session_id", ss.id(), "err", err)
	}
	if _, err := s.destroySession(ctx, sb, ss, 0); err != nil {
		ss.setState(sessFinalizeFailed)
		extra["finalization_failed"], extra["finalization_failure_class"], extra["finalization_attempts"] = true, "holder_finalization_destroy_failed", 1
	}
	s.bump(ctx, sb)
	return extra
}

// recoveryArtifact is one entry of the sandbox record's recovery_artifacts.
type recoveryArtifact struct {
	WorkspaceSessionID string `json:"workspace_session_id"`
	CreatedAt          string `json:"created_at"`
	Reason             string `json:"reason"`
	Bytes              int64  `json:"bytes"`
}

// keepRecoveryArtifact moves a rejected implicit session's upper dir (a
// rename, not a copy) to workspace_recovery/<id>/upper beside a manifest,
// keeping the newest runtime.workspace.max_recovery_artifacts.
func (s *Supervisor) keepRecoveryArtifact(ctx context.Context, sb *sandbox, ss *session, rej *rejection) string {
	if s.cfg.Runtime.Workspace.MaxRecoveryArtifacts == 0 {
		return ""
	}
	dir := filepath.Join(sb.dir, "workspace_recovery", ss.id())
	if err := os.MkdirAll(dir, 0o700); err != nil {
		s.log.Warn("recovery artifact", "err", err)
		return ""
	}
	bytes, entries := dirBytes(ss.upper()), countEntries(ss.upper())
	if err := os.Rename(ss.upper(), filepath.Join(dir, "upper")); err != nil {
		s.log.Warn("recovery artifact", "err", err)
		return ""
	}
	art := recoveryArtifact{WorkspaceSessionID: ss.id(), CreatedAt: nowRFC3339(), Reason: rej.reason, Bytes: bytes}
	man, _ := json.Marshal(map[string]any{"workspace_session_id": ss.id(), "created_at": art.CreatedAt, "reason": rej.reason,
		"publish_rejection": rej.body, "bytes": bytes, "entries": entries})
	_ = os.WriteFile(filepath.Join(dir, "manifest.json"), man, 0o600)
	sb.mu.Lock()
	sb.rec.RecoveryArtifacts = append(sb.rec.RecoveryArtifacts, art)
	var drop []recoveryArtifact
	for len(sb.rec.RecoveryArtifacts) > s.cfg.Runtime.Workspace.MaxRecoveryArtifacts {
		drop = append(drop, sb.rec.RecoveryArtifacts[0])
		sb.rec.RecoveryArtifacts = sb.rec.RecoveryArtifacts[1:]
	}
	rec := sb.rec
	sb.mu.Unlock()
	for _, d := range drop {
		removeTree(filepath.Join(sb.dir, "workspace_recovery", d.WorkspaceSessionID))
	}
	_ = s.store.putSandbox(ctx, &rec)
	return filepath.Join("workspace_recovery", ss.id())
}

func countEntries(dir string) int {
	n := -1
	_ = filepath.WalkDir(dir, func(string, os.DirEntry, error) error { n++; return nil })
	return max(n, 0)
}
