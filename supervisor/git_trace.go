package supervisor

// The Agent Trace v0.1 notes of the git export (git.go): one record per
// commit, under refs/notes/agent-trace.

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/ephemeral-ai-lab/sandbox/layers"
)

type atRange struct {
	StartLine   int    `json:"start_line"`
	EndLine     int    `json:"end_line"`
	ContentHash string `json:"content_hash,omitempty"`
}

type atConversation struct {
	Contributor map[string]string `json:"contributor"`
	Ranges      []atRange         `json:"ranges"`
	Metadata    map[string]any    `json:"metadata"`
}

type atFile struct {
	Path          string           `json:"path"`
	Conversations []atConversation `json:"conversations"`
}

type atRecord struct {
	Version   string            `json:"version"`
	ID        string            `json:"id"`
	Timestamp string            `json:"timestamp"`
	VCS       map[string]string `json:"vcs"`
	Tool      map[string]string `json:"tool"`
	Files     []atFile          `json:"files"`
	Metadata  map[string]any    `json:"metadata"`
}

func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}

// contributorType maps an owner to Agent Trace's contributor types: lines
// of sessions are the agents', original lines the user's.
func contributorType(owner string) string {
	switch {
	case strings.HasPrefix(owner, "workspace_session:"):
		return "ai"
	case owner == ownerOriginal:
		return "human"
	}
	return "unknown"
}

// traceFile groups a file's blame ranges into one conversation per owner
// key (owner, command, agent, layer), in order of first appearance.
func traceFile(p string, owners []lineOwner, lines []string, wholesale bool) atFile {
	f := atFile{Path: p, Conversations: []atConversation{}}
	at := map[blameKey]int{}
	for _, rg := range tileRanges(owners, wholesale) {
		k := rg.Key()
		i, ok := at[k]
		if !ok {
			i = len(f.Conversations)
			at[k] = i
			meta := map[string]any{"owner": rg.Owner}
			if rg.HasMeta() {
				meta["workspace_session_id"], meta["command_session_id"], meta["agent"], meta["layer_id"] =
					nullable(strings.TrimPrefix(rg.Owner, "workspace_session:")), nullable(rg.CommandSessionID), nullable(rg.Agent), nullable(rg.LayerID)
				if !strings.HasPrefix(rg.Owner, "workspace_session:") {
					meta["workspace_session_id"] = nil
				}
			}
			f.Conversations = append(f.Conversations, atConversation{Contributor: map[string]string{"type": contributorType(rg.Owner)}, Metadata: meta})
		}
		r := atRange{StartLine: rg.StartLine, EndLine: rg.StartLine + rg.LineCount - 1}
		if lines != nil && r.EndLine <= len(lines) {
			r.ContentHash = contentDigest([]byte(strings.Join(lines[r.StartLine-1:r.EndLine], "\n")))
		}
		f.Conversations[i].Ranges = append(f.Conversations[i].Ranges, r)
	}
	return f
}

func newTraceRecord(revision, ts string, meta map[string]any) atRecord {
	return atRecord{Version: "0.1.0", ID: newUUID(), Timestamp: ts, VCS: map[string]string{"type": "git", "revision": revision},
		Tool: map[string]string{"name": "ephemeral-sandbox"}, Files: []atFile{}, Metadata: meta}
}

// traceRecord builds the Agent Trace note of an exported commit: the line
// owners of each given regular file in the view of m.
func (s *Supervisor) traceRecord(ctx context.Context, sb *sandbox, commit, ts string, meta map[string]any, paths []string, m layers.Manifest) []byte {
	rec := newTraceRecord(commit, ts, meta)
	v := sb.Stack.View(m)
	for _, p := range paths {
		owners, content, text, wholesale, err := s.glue.viewOwners(ctx, sb, v, m.Version, p)
		if err != nil {
			continue // not a regular file at that layer
		}
		var lines []string
		if text {
			lines = textLines(content)
		}
		rec.Files = append(rec.Files, traceFile(p, owners, lines, wholesale))
	}
	b, _ := json.MarshalIndent(rec, "", "  ")
	return append(b, '\n')
}

// gitHeadRevision is the revision file_blame's Agent Trace record names:
// the sandbox's recorded HEAD ("" when none).
func gitHeadRevision(sb *sandbox) string {
	sb.Mu.Lock()
	defer sb.Mu.Unlock()
	if sb.Rec.Git != nil && sb.Rec.Git.Head != nil {
		return *sb.Rec.Git.Head
	}
	return ""
}
