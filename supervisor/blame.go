package supervisor

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"time"
	"unicode/utf8"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
	"github.com/ephemeral-ai-lab/sandbox/layers"
	"github.com/ephemeral-ai-lab/sandbox/nsholder"
)

// Line attribution (§11). A file's lines are the lines file_read counts: the
// text without BOM, CRLF and lone CR read as LF, one trailing newline not
// starting another line. Lines are compared by that text, so a change of
// line endings alone keeps every line's owner.

// Owners that carry no metadata.
const (
	ownerOriginal = "original"
	ownerUnknown  = "unknown"
)

// attrTextMax is the largest file with line attribution (§11.3); larger or
// non-text files are attributed wholesale.
const attrTextMax = 8 << 20

// lineOwner is the attribution of one line. Empty strings are JSON nulls.
type lineOwner struct {
	Owner            string
	CommandSessionID string
	Agent            string
	LayerID          string
	TS               string
	Approximate      bool
}

// hasMeta reports whether the owner's ranges carry command_session_id,
// agent, layer_id and ts (original and unknown carry none).
func (o lineOwner) hasMeta() bool { return o.Owner != ownerOriginal && o.Owner != ownerUnknown }

// blameKey is what file_blame coalesces on (§11.2).
type blameKey struct{ owner, cmd, agent, layer string }

func (o lineOwner) key() blameKey { return blameKey{o.Owner, o.CommandSessionID, o.Agent, o.LayerID} }

// sessionOwner is the owner of lines a session wrote.
func sessionOwner(id string, agent *string) lineOwner {
	o := lineOwner{Owner: "workspace_session:" + id}
	if agent != nil {
		o.Agent = *agent
	}
	return o
}

// operationOwner is the owner of lines a sessionless write wrote.
func operationOwner(requestID string) lineOwner { return lineOwner{Owner: "operation:" + requestID} }

func repeatOwner(o lineOwner, n int) []lineOwner {
	out := make([]lineOwner, n)
	for i := range out {
		out[i] = o
	}
	return out
}

// ownerRange is one range of a record (owner_ranges) or of a blame result.
type ownerRange struct {
	StartLine int
	LineCount int
	lineOwner
	Wholesale bool // blame results only
}

func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func (r ownerRange) MarshalJSON() ([]byte, error) {
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
	if !r.hasMeta() {
		return json.Marshal(bare{r.StartLine, r.LineCount, r.Owner, r.Approximate, r.Wholesale})
	}
	return json.Marshal(meta{r.StartLine, r.LineCount, r.Owner, nullable(r.CommandSessionID), nullable(r.Agent),
		nullable(r.LayerID), nullable(r.TS), r.Approximate, r.Wholesale})
}

func (r *ownerRange) UnmarshalJSON(b []byte) error {
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
	*r = ownerRange{StartLine: w.StartLine, LineCount: w.LineCount, Wholesale: w.Wholesale,
		lineOwner: lineOwner{Owner: w.Owner, CommandSessionID: deref(w.CommandSessionID), Agent: deref(w.Agent),
			LayerID: deref(w.LayerID), TS: deref(w.TS), Approximate: w.Approximate}}
	return nil
}

func deref(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

// tileRanges coalesces per-line owners into ranges that tile lines
// 1..len(owners) exactly once, merging adjacent lines with the same
// (owner, command_session_id, agent, layer_id); a merged range reports the
// newest ts and approximate when any of its lines is.
func tileRanges(owners []lineOwner, wholesale bool) []ownerRange {
	out := []ownerRange{}
	for i, o := range owners {
		if n := len(out); n > 0 && out[n-1].key() == o.key() {
			last := &out[n-1]
			last.LineCount++
			if o.TS > last.TS {
				last.TS = o.TS
			}
			last.Approximate = last.Approximate || o.Approximate
			continue
		}
		out = append(out, ownerRange{StartLine: i + 1, LineCount: 1, lineOwner: o, Wholesale: wholesale})
	}
	return out
}

// isText reports whether content gets line attribution: UTF-8, no NUL,
// at most 8 MiB (§11.3).
func isText(b []byte) bool {
	if len(b) > attrTextMax || !utf8.Valid(b) {
		return false
	}
	for _, c := range b {
		if c == 0 {
			return false
		}
	}
	return true
}

// textLines splits content into the lines file_read counts.
func textLines(b []byte) []string { return splitLines(normalizeText(b)) }

// blameLineCount is the number of lines blame reports: the text lines, 1 for
// a non-empty non-text file, 0 for an empty file.
func blameLineCount(content []byte, text bool, size int64) int {
	if text {
		return len(textLines(content))
	}
	if size == 0 {
		return 0
	}
	return 1
}

func contentDigest(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// readViewFile reads a regular file of a merged view for attribution: the
// whole content when it is at most attrTextMax bytes (text tells whether it
// is text), else only its digest.
func readViewFile(v *layers.View, p string) (content []byte, digest string, text bool, err error) {
	f, e, err := v.OpenFile(p)
	if err != nil {
		return nil, "", false, err
	}
	defer f.Close()
	if e.Size > attrTextMax {
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
	return content, contentDigest(content), isText(content), nil
}

// ---------------------------------------------------------------------------
// Line diff

// lineOrigins maps each line of next to the index of the line of prev it is
// kept from, or -1 for a line next introduces. Kept lines form a longest
// common subsequence where the work stays small: common prefix and suffix
// are matched first, small remaining regions exactly (LCS), large ones are
// split at lines unique on both sides (patience anchors) and the pieces
// handled recursively; beyond a work budget only prefix and suffix match.
func lineOrigins(prev, next []byte) []int {
	return originsOf(textLines(prev), textLines(next))
}

const (
	diffExactCells   = 1 << 22 // largest region solved by the exact LCS table (4 MiB of directions)
	diffCellBudget   = 1 << 26 // total LCS table cells per diff
	diffAnchorWork   = 1 << 25 // total lines scanned for anchors per diff
	diffMaxRecursion = 64
)

func originsOf(a, b []string) []int {
	out := make([]int, len(b))
	for i := range out {
		out[i] = -1
	}
	if len(a) == 0 || len(b) == 0 {
		return out
	}
	ids := make(map[string]int32, len(a))
	intern := func(lines []string) []int32 {
		r := make([]int32, len(lines))
		for i, l := range lines {
			id, ok := ids[l]
			if !ok {
				id = int32(len(ids))
				ids[l] = id
			}
			r[i] = id
		}
		return r
	}
	d := &differ{a: intern(a), b: intern(b), out: out, cells: diffCellBudget, work: diffAnchorWork}
	d.match(0, len(a), 0, len(b), 0)
	return out
}

type differ struct {
	a, b  []int32
	out   []int
	cells int64 // remaining LCS table budget
	work  int64 // remaining anchor-scan budget
}

func (d *differ) match(alo, ahi, blo, bhi, depth int) {
	for alo < ahi && blo < bhi && d.a[alo] == d.b[blo] {
		d.out[blo] = alo
		alo, blo = alo+1, blo+1
	}
	for alo < ahi && blo < bhi && d.a[ahi-1] == d.b[bhi-1] {
		d.out[bhi-1] = ahi - 1
		ahi, bhi = ahi-1, bhi-1
	}
	n, m := int64(ahi-alo), int64(bhi-blo)
	if n == 0 || m == 0 {
		return
	}
	if n*m <= diffExactCells && n*m <= d.cells {
		d.cells -= n * m
		d.lcs(alo, ahi, blo, bhi)
		return
	}
	if d.work < n+m || depth >= diffMaxRecursion {
		return
	}
	d.work -= n + m
	anchors := d.anchors(alo, ahi, blo, bhi)
	pa, pb := alo, blo
	for _, an := range anchors {
		d.match(pa, an[0], pb, an[1], depth+1)
		d.out[an[1]] = an[0]
		pa, pb = an[0]+1, an[1]+1
	}
	if len(anchors) > 0 {
		d.match(pa, ahi, pb, bhi, depth+1)
	}
}

// lcs solves a[alo:ahi] against b[blo:bhi] exactly with a direction table.
func (d *differ) lcs(alo, ahi, blo, bhi int) {
	n, m := ahi-alo, bhi-blo
	dir := make([]byte, n*m) // 0 match, 1 skip a line of a, 2 skip a line of b
	next := make([]int32, m+1)
	cur := make([]int32, m+1)
	for i := n - 1; i >= 0; i-- {
		ai := d.a[alo+i]
		cur[m] = 0
		row := dir[i*m : (i+1)*m]
		for j := m - 1; j >= 0; j-- {
			switch {
			case ai == d.b[blo+j]:
				cur[j], row[j] = next[j+1]+1, 0
			case next[j] >= cur[j+1]:
				cur[j], row[j] = next[j], 1
			default:
				cur[j], row[j] = cur[j+1], 2
			}
		}
		next, cur = cur, next
	}
	for i, j := 0, 0; i < n && j < m; {
		switch dir[i*m+j] {
		case 0:
			d.out[blo+j] = alo + i
			i, j = i+1, j+1
		case 1:
			i++
		default:
			j++
		}
	}
}

// anchors returns pairs (i, j) of lines that occur exactly once in each
// region, increasing in both i and j (a longest such chain).
func (d *differ) anchors(alo, ahi, blo, bhi int) [][2]int {
	type occ struct{ na, nb, ia int32 }
	seen := make(map[int32]occ, ahi-alo)
	for i := alo; i < ahi; i++ {
		o := seen[d.a[i]]
		o.na++
		o.ia = int32(i)
		seen[d.a[i]] = o
	}
	for j := blo; j < bhi; j++ {
		if o, ok := seen[d.b[j]]; ok {
			o.nb++
			seen[d.b[j]] = o
		}
	}
	var pairs [][2]int // ordered by j
	for j := blo; j < bhi; j++ {
		if o := seen[d.b[j]]; o.na == 1 && o.nb == 1 {
			pairs = append(pairs, [2]int{int(o.ia), j})
		}
	}
	if len(pairs) == 0 {
		return nil
	}
	// Longest increasing subsequence of i (patience sorting).
	tails := []int{} // index into pairs of the smallest tail of each length
	prev := make([]int, len(pairs))
	for k, p := range pairs {
		lo, hi := 0, len(tails)
		for lo < hi {
			mid := (lo + hi) / 2
			if pairs[tails[mid]][0] < p[0] {
				lo = mid + 1
			} else {
				hi = mid
			}
		}
		prev[k] = -1
		if lo > 0 {
			prev[k] = tails[lo-1]
		}
		if lo == len(tails) {
			tails = append(tails, k)
		} else {
			tails[lo] = k
		}
	}
	out := make([][2]int, len(tails))
	for k, idx := len(tails)-1, tails[len(tails)-1]; k >= 0; k, idx = k-1, prev[idx] {
		out[k] = pairs[idx]
	}
	return out
}

// ---------------------------------------------------------------------------
// file_blame

func (s *Supervisor) fileBlame(c *call) (any, error) {
	p, perr := catalog.WorkspacePath(c.args.String("path"), false)
	if perr != nil {
		return nil, perr
	}
	if c.args.Has("workspace_session_id") {
		return s.blameSession(c, p)
	}
	return s.blameHead(c, p)
}

func notRegular(p string, k layers.EntryKind) error {
	return catalog.Errorf(catalog.InvalidRequest, "path is not a regular file (%s)", kindName(k)).With("path", p)
}

// viewOwners returns the per-line owners of the regular file p in view v
// (manifest version version) from its audit records (§11.2): the latest
// record with manifest_version ≤ version tiled, original without one,
// unknown when the record's digest does not match the content. wholesale is
// the record's flag. content is nil for a non-text file.
func (s *Supervisor) viewOwners(ctx context.Context, sb *sandbox, v *layers.View, version int, p string) (owners []lineOwner, content []byte, text, wholesale bool, err error) {
	e, err := v.Lstat(p)
	if err != nil {
		return nil, nil, false, false, err
	}
	if e.Kind != layers.KindFile {
		return nil, nil, false, false, notRegular(p, e.Kind)
	}
	content, digest, text, err := readViewFile(v, p)
	if err != nil {
		return nil, nil, false, false, err
	}
	n := blameLineCount(content, text, e.Size)
	rec, err := s.store.latestAudit(ctx, sb.Rec.ID, p, version)
	switch {
	case err != nil:
		s.log.Warn("audit.read_failed", "sandbox", sb.Rec.ID, "path", p, "err", err)
		return repeatOwner(lineOwner{Owner: ownerUnknown}, n), content, text, false, nil
	case rec == nil:
		return repeatOwner(lineOwner{Owner: ownerOriginal}, n), content, text, false, nil
	case rec.ContentDigest != digest:
		return repeatOwner(lineOwner{Owner: ownerUnknown}, n), content, text, false, nil
	}
	return fitOwners(rec.lineOwners(), n), content, text, rec.Wholesale, nil
}

// fitOwners pads (with unknown) or cuts owners to n lines.
func fitOwners(owners []lineOwner, n int) []lineOwner {
	if len(owners) >= n {
		return owners[:n]
	}
	for len(owners) < n {
		owners = append(owners, lineOwner{Owner: ownerUnknown})
	}
	return owners
}

func blameResult(p, view string, ws any, rev layers.Revision, owners []lineOwner, wholesale bool) map[string]any {
	return map[string]any{"path": p, "view": view, "workspace_session_id": ws, "revision": rev,
		"line_count": len(owners), "ranges": tileRanges(owners, wholesale)}
}

func (s *Supervisor) blameHead(c *call, p string) (any, error) {
	lease, err := c.sb.Stack.Acquire("read") // a squash may collect head's layers meanwhile
	if err != nil {
		return nil, err
	}
	defer func() {
		if _, err := lease.Release(); err != nil {
			s.log.Warn("release read lease", "err", err)
		}
	}()
	head := lease.Manifest()
	owners, content, text, wholesale, err := s.viewOwners(c.ctx, c.sb, c.sb.Stack.View(head), head.Version, p)
	if absent(err) {
		nf := fileNotFound(p)
		if rec, rerr := s.store.latestAudit(c.ctx, c.sb.Rec.ID, p, head.Version); rerr == nil && rec != nil {
			nf = nf.With("last_record_layer_id", rec.LayerID)
		}
		return nil, nf
	}
	if err != nil {
		return nil, err
	}
	if c.args.String("format") == "agent-trace" {
		var lines []string
		if text {
			lines = textLines(content)
		}
		return s.blameTrace(c, p, nil, head.Revision(), owners, lines, wholesale), nil
	}
	return blameResult(p, "head", nil, head.Revision(), owners, wholesale), nil
}

// sessionBase returns the manifest a session was created on.
func sessionBase(ss *session) (layers.Manifest, sessionRecord) {
	ss.mu.Lock()
	rec := ss.rec
	ss.mu.Unlock()
	return layers.Manifest{SchemaVersion: layers.SchemaVersion, Version: rec.BaseRevision.ManifestVersion, Layers: rec.Lease.Layers}, rec
}

func (s *Supervisor) blameSession(c *call, p string) (any, error) {
	v, ss, release, err := s.viewFor(c)
	if err != nil {
		return nil, err
	}
	defer release()
	e, err := v.lstat(c.ctx, p)
	if absent(err) {
		return nil, fileNotFound(p)
	}
	if err != nil {
		return nil, err
	}
	if e.kind != layers.KindFile {
		return nil, notRegular(p, e.kind)
	}
	base, rec := sessionBase(ss)
	owners, wholesale, err := s.sessionBlameOwners(c.ctx, c.sb, ss, base, p, e.size, func() ([]byte, error) {
		b, err := v.readFile(c.ctx, p, attrTextMax)
		if errors.Is(err, nsholder.ErrTooLarge) {
			return nil, nil
		}
		return b, err
	})
	if absent(err) {
		return nil, fileNotFound(p)
	}
	if err != nil {
		return nil, err
	}
	if c.args.String("format") == "agent-trace" {
		var lines []string
		if b, err := v.readFile(c.ctx, p, attrTextMax); err == nil && isText(b) {
			lines = textLines(b)
		}
		return s.blameTrace(c, p, ss.id(), rec.BaseRevision, owners, lines, wholesale), nil
	}
	return blameResult(p, "session", ss.id(), rec.BaseRevision, owners, wholesale), nil
}

// sessionBlameOwners attributes the lines of p as the session sees it
// (§11.3): a file the session never touched (absent from its upper dir)
// keeps the base's owners; otherwise lines unchanged since the base keep
// the base's owners and the others are the session's, with the writers
// recorded by checkpoints. read returns the session's content (nil when it
// is too large).
func (s *Supervisor) sessionBlameOwners(ctx context.Context, sb *sandbox, ss *session, base layers.Manifest, p string, size int64, read func() ([]byte, error)) ([]lineOwner, bool, error) {
	bv := sb.Stack.View(base)
	baseOwners, baseContent, _, baseWholesale, berr := s.viewOwners(ctx, sb, bv, base.Version, p)
	if berr != nil && !errors.Is(berr, fs.ErrNotExist) && !isInvalidRequest(berr) {
		return nil, false, berr
	}
	hasBase := berr == nil
	upperInfo, uerr := lstatUpper(ss, p)
	if hasBase && errors.Is(uerr, fs.ErrNotExist) {
		return baseOwners, baseWholesale, nil // not in the upper dir: the base's file
	}
	fallbackTS := nowRFC3339()
	if uerr == nil {
		fallbackTS = rfc3339ms(upperInfo.ModTime())
	}
	_, rec := sessionBase(ss)
	owner := sessionOwner(rec.WorkspaceSessionID, rec.Agent)
	var content []byte
	if size <= attrTextMax {
		b, err := read()
		if err != nil {
			return nil, false, err
		}
		content = b
	}
	if content == nil || !isText(content) {
		if size == 0 {
			return []lineOwner{}, false, nil
		}
		o := owner
		o.TS = fallbackTS
		return []lineOwner{o}, true, nil
	}
	origins := lineOrigins(baseContent, content)
	attr := s.sessionAttribution(ss, p, content)
	out := make([]lineOwner, len(origins))
	for i, o := range origins {
		if o >= 0 && o < len(baseOwners) {
			out[i] = baseOwners[o]
			continue
		}
		lo := owner
		lo.TS = fallbackTS
		if attr != nil && !attr[i].Base {
			lo.CommandSessionID, lo.Approximate = attr[i].Cmd, attr[i].Approx
			if attr[i].TS != "" {
				lo.TS = attr[i].TS
			}
		}
		out[i] = lo
	}
	return out, false, nil
}

// lstatUpper describes p in the session's upper dir, resolved beneath it
// without following any symlink (the session controls that tree).
func lstatUpper(ss *session, p string) (fs.FileInfo, error) {
	root, err := layers.OpenRoot(ss.upper())
	if err != nil {
		return nil, err
	}
	defer root.Close()
	return root.Lstat(p)
}

func isInvalidRequest(err error) bool {
	var ce *catalog.Error
	return errors.As(err, &ce) && ce.Kind == catalog.InvalidRequest
}

// rfc3339ms formats t as the contract's timestamps.
func rfc3339ms(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z") }

// blameTrace is file_blame's Agent Trace form: one record with the file's
// ranges grouped by owner; vcs.revision is the sandbox's recorded git HEAD
// (the view itself is no commit), metadata names the view.
func (s *Supervisor) blameTrace(c *call, p string, ws any, rev layers.Revision, owners []lineOwner, lines []string, wholesale bool) atRecord {
	view := "head"
	if ws != nil {
		view = "session"
	}
	rec := newTraceRecord(gitHeadRevision(c.sb), nowRFC3339(), map[string]any{"sandbox_id": c.sb.Rec.ID, "view": view,
		"workspace_session_id": ws, "revision": rev})
	rec.Files = append(rec.Files, traceFile(p, owners, lines, wholesale))
	return rec
}
