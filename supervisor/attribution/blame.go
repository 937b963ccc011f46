package attribution

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/ephemeral-ai-lab/sandbox/layers"
)

// Line attribution (§11). A file's lines are the module's one line rule
// (layers.SplitLines): each ends after "\r\n", "\n" or a lone "\r", so they
// are the lines file_read numbers. Lines are compared with their
// terminators, as the publish merge compares them: a line whose ending
// changed is the changer's (see layers/linediff.go for why).

// Owners that carry no metadata.
const (
	OwnerOriginal = "original"
	OwnerUnknown  = "unknown"
)

// TextMax is the largest file with line attribution (§11.3); larger or
// non-text files are attributed wholesale.
const TextMax = 8 << 20

// LineOwner is the attribution of one line. Empty strings are JSON nulls.
type LineOwner struct {
	Owner            string
	CommandSessionID string
	Agent            string
	LayerID          string
	TS               string
	Approximate      bool
}

// HasMeta reports whether the owner's ranges carry command_session_id,
// agent, layer_id and ts (original and unknown carry none).
func (o LineOwner) HasMeta() bool { return o.Owner != OwnerOriginal && o.Owner != OwnerUnknown }

// BlameKey is what file_blame coalesces on (§11.2).
type BlameKey struct{ owner, cmd, agent, layer string }

func (o LineOwner) Key() BlameKey { return BlameKey{o.Owner, o.CommandSessionID, o.Agent, o.LayerID} }

// SessionOwner is the owner of lines a session wrote.
func SessionOwner(id string, agent *string) LineOwner {
	o := LineOwner{Owner: "workspace_session:" + id}
	if agent != nil {
		o.Agent = *agent
	}
	return o
}

// OperationOwner is the owner of lines a sessionless write wrote.
func OperationOwner(requestID string) LineOwner { return LineOwner{Owner: "operation:" + requestID} }

func RepeatOwner(o LineOwner, n int) []LineOwner {
	out := make([]LineOwner, n)
	for i := range out {
		out[i] = o
	}
	return out
}

// OwnerRange is one range of a record (owner_ranges) or of a blame result.
type OwnerRange struct {
	StartLine int
	LineCount int
	LineOwner
	Wholesale bool // blame results only
}

func Nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func (r OwnerRange) MarshalJSON() ([]byte, error) {
	type bare struct {
		StartLine   int    `json:"start_line"`
		LineCount   int    `json:"line_count"`
		Owner       string `json:"owner"`
		Approximate bool   `json:"approximate,omitempty"`
		Wholesale   bool   `json:"wholesale,omitempty"`
	}
	type meta struct {
		StartLine        int     `json:"start_line"`
		LineCount        int     `json:"line_count"`
		Owner            string  `json:"owner"`
		CommandSessionID *string `json:"command_session_id"`
		Agent            *string `json:"agent"`
		LayerID          *string `json:"layer_id"`
		TS               *string `json:"ts"`
		Approximate      bool    `json:"approximate,omitempty"`
		Wholesale        bool    `json:"wholesale,omitempty"`
	}
	if !r.HasMeta() {
		return json.Marshal(bare{r.StartLine, r.LineCount, r.Owner, r.Approximate, r.Wholesale})
	}
	return json.Marshal(meta{r.StartLine, r.LineCount, r.Owner, Nullable(r.CommandSessionID), Nullable(r.Agent),
		Nullable(r.LayerID), Nullable(r.TS), r.Approximate, r.Wholesale})
}

func (r *OwnerRange) UnmarshalJSON(b []byte) error {
	var w struct {
		StartLine        int     `json:"start_line"`
		LineCount        int     `json:"line_count"`
		Owner            string  `json:"owner"`
		CommandSessionID *string `json:"command_session_id"`
		Agent            *string `json:"agent"`
		LayerID          *string `json:"layer_id"`
		TS               *string `json:"ts"`
		Approximate      bool    `json:"approximate"`
		Wholesale        bool    `json:"wholesale"`
	}
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	*r = OwnerRange{StartLine: w.StartLine, LineCount: w.LineCount, Wholesale: w.Wholesale,
		LineOwner: LineOwner{Owner: w.Owner, CommandSessionID: Deref(w.CommandSessionID), Agent: Deref(w.Agent),
			LayerID: Deref(w.LayerID), TS: Deref(w.TS), Approximate: w.Approximate}}
	return nil
}

func Deref(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

// TileRanges coalesces per-line owners into ranges that tile lines
// 1..len(owners) exactly once, merging adjacent lines with the same
// (owner, command_session_id, agent, layer_id); a merged range reports the
// newest ts and approximate when any of its lines is.
func TileRanges(owners []LineOwner, wholesale bool) []OwnerRange {
	out := []OwnerRange{}
	for i, o := range owners {
		if n := len(out); n > 0 && out[n-1].Key() == o.Key() {
			last := &out[n-1]
			last.LineCount++
			if o.TS > last.TS {
				last.TS = o.TS
			}
			last.Approximate = last.Approximate || o.Approximate
			continue
		}
		out = append(out, OwnerRange{StartLine: i + 1, LineCount: 1, LineOwner: o, Wholesale: wholesale})
	}
	return out
}

// IsText reports whether content gets line attribution: UTF-8, no NUL,
// at most 8 MiB (§11.3).
func IsText(b []byte) bool {
	if len(b) > TextMax || !utf8.Valid(b) {
		return false
	}
	for _, c := range b {
		if c == 0 {
			return false
		}
	}
	return true
}

// TextLines returns the lines of content (layers.SplitLines) as file_read
// shows them: without their terminators, the first without a BOM.
func TextLines(b []byte) []string {
	raw := layers.SplitLines(b)
	out := make([]string, len(raw))
	for i, l := range raw {
		t := strings.TrimSuffix(strings.TrimSuffix(string(l), "\n"), "\r")
		if i == 0 {
			t = strings.TrimPrefix(t, "\ufeff")
		}
		out[i] = t
	}
	return out
}

// BlameLineCount is the number of lines blame reports: the text lines, 1 for
// a non-empty non-text file, 0 for an empty file.
func BlameLineCount(content []byte, text bool, size int64) int {
	if text {
		return len(TextLines(content))
	}
	if size == 0 {
		return 0
	}
	return 1
}

// ContentDigest is the contract's content_digest of b.
func ContentDigest(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// ReadViewFile reads a regular file of a merged view for attribution: the
// whole content when it is at most TextMax bytes (text tells whether it
// is text), else only its digest.
func ReadViewFile(v *layers.View, p string) (content []byte, digest string, text bool, err error) {
	f, e, err := v.OpenFile(p)
	if err != nil {
		return nil, "", false, err
	}
	defer f.Close()
	if e.Size > TextMax {
		h := sha256.New()
		if _, err := io.Copy(h, f); err != nil {
			return nil, "", false, fmt.Errorf("read %s: %w", p, err)
		}
		return nil, "sha256:" + hex.EncodeToString(h.Sum(nil)), false, nil
	}
	content, err = io.ReadAll(f)
	if err != nil {
		return nil, "", false, fmt.Errorf("read %s: %w", p, err)
	}
	return content, ContentDigest(content), IsText(content), nil
}

// ---------------------------------------------------------------------------
// Line diff

// lineOrigins maps each line of next to the index of the line of prev it is
// kept from, or -1 for a line next introduces: the module's one line diff
// (layers.LineOrigins), so blame and the publish merge agree on which lines
// changed.
func lineOrigins(prev, next []byte) []int { return layers.LineOrigins(prev, next) }

// NotRegularError is blame of a path that is not a regular file.
type NotRegularError struct {
	Path string
	Kind layers.EntryKind
}

func (e *NotRegularError) Error() string { return "not a regular file: " + e.Path }

// ViewOwners returns the per-line owners of the regular file p in view v
// (manifest version version) from its audit records (§11.2): the latest
// record with manifest_version ≤ version tiled, original without one,
// unknown when the record's digest does not match the content. wholesale is
// the record's flag. content is nil for a non-text file.
func (a *Audit) ViewOwners(ctx context.Context, v *layers.View, version int, p string) (owners []LineOwner, content []byte, text, wholesale bool, err error) {
	e, err := v.Lstat(p)
	if err != nil {
		return nil, nil, false, false, err
	}
	if e.Kind != layers.KindFile {
		return nil, nil, false, false, &NotRegularError{Path: p, Kind: e.Kind}
	}
	content, digest, text, err := ReadViewFile(v, p)
	if err != nil {
		return nil, nil, false, false, err
	}
	n := BlameLineCount(content, text, e.Size)
	rec, err := a.Store.LatestAudit(ctx, a.SandboxID, p, version)
	switch {
	case err != nil:
		a.Log.Warn("audit.read_failed", "sandbox", a.SandboxID, "path", p, "err", err)
		return RepeatOwner(LineOwner{Owner: OwnerUnknown}, n), content, text, false, nil
	case rec == nil:
		return RepeatOwner(LineOwner{Owner: OwnerOriginal}, n), content, text, false, nil
	case rec.ContentDigest != digest:
		return RepeatOwner(LineOwner{Owner: OwnerUnknown}, n), content, text, false, nil
	}
	return fitOwners(rec.LineOwners(), n), content, text, rec.Wholesale, nil
}

// fitOwners pads (with unknown) or cuts owners to n lines.
func fitOwners(owners []LineOwner, n int) []LineOwner {
	if len(owners) >= n {
		return owners[:n]
	}
	for len(owners) < n {
		owners = append(owners, LineOwner{Owner: OwnerUnknown})
	}
	return owners
}

// SessionBlameOwners attributes the lines of p as the session w sees it
// (§11.3): a file the session never touched (absent from its upper dir)
// keeps the base's owners; otherwise lines unchanged since the base keep
// the base's owners and the others are the session's, with the writers
// recorded by t's checkpoints. read returns the session's content (nil when
// it is too large).
func (a *Audit) SessionBlameOwners(ctx context.Context, t *Tracker, w Workspace, p string, size int64, read func() ([]byte, error)) ([]LineOwner, bool, error) {
	baseOwners, baseContent, _, baseWholesale, berr := a.ViewOwners(ctx, w.Base, w.Base.Manifest().Version, p)
	var nr *NotRegularError
	if berr != nil && !errors.Is(berr, fs.ErrNotExist) && !errors.As(berr, &nr) {
		return nil, false, berr
	}
	hasBase := berr == nil
	upperInfo, uerr := lstatUpper(w.Upper, p)
	if hasBase && errors.Is(uerr, fs.ErrNotExist) {
		return baseOwners, baseWholesale, nil // not in the upper dir: the base's file
	}
	fallbackTS := now3339()
	if uerr == nil {
		fallbackTS = RFC3339ms(upperInfo.ModTime())
	}
	owner := SessionOwner(w.ID, w.Agent)
	var content []byte
	if size <= TextMax {
		b, err := read()
		if err != nil {
			return nil, false, err
		}
		content = b
	}
	if content == nil || !IsText(content) {
		if size == 0 {
			return []LineOwner{}, false, nil
		}
		o := owner
		o.TS = fallbackTS
		return []LineOwner{o}, true, nil
	}
	origins := lineOrigins(baseContent, content)
	attr := t.attribution(w, p, content)
	out := make([]LineOwner, len(origins))
	for i, o := range origins {
		if o >= 0 && o < len(baseOwners) {
			out[i] = baseOwners[o]
			continue
		}
		lo := owner
		lo.TS = fallbackTS
		if attr != nil && !attr[i].Base {
			lo = attr[i].owner(owner)
			lo.TS = fallbackTS
			lo.CommandSessionID, lo.Approximate = attr[i].Cmd, attr[i].Approx
			if attr[i].TS != "" {
				lo.TS = attr[i].TS
			}
		}
		out[i] = lo
	}
	return out, false, nil
}

// lstatUpper describes p in the upper dir, resolved beneath it without
// following any symlink (the session controls that tree).
func lstatUpper(upper, p string) (fs.FileInfo, error) {
	root, err := layers.OpenRoot(upper)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	return root.Lstat(p)
}

// RFC3339ms formats t as the contract's timestamps.
func RFC3339ms(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z") }

func now3339() string { return RFC3339ms(time.Now()) }
