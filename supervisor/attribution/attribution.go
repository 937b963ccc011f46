package attribution

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ephemeral-ai-lab/sandbox/layers"
)

// Session checkpoints (§11.3). sessions/<id>/attribution/ holds, per changed
// text file of the session's upper dir, a record of per-line writers and
// the content digest, with the content (the next checkpoint's diff base):
// in the pack of the checkpoint pass that stored it (pack.go), or, for a
// sync's merges and sessions of older versions, as <key>.json and
// <key>.txt, where key is derived from the path; index.json maps every
// path seen to its stat identity and state, so unchanged files cost one
// lstat. At most attrMaxFiles checkpoints and attrMaxBytes of content copies
// per session; beyond, a file has no checkpoint and its lines fall back to
// command_session_id null.

const (
	attrMaxFiles  = 10000
	attrMaxBytes  = 256 << 20
	attrIndexName = "index.json"
)

// Index entry states.
const (
	ckStored  = "checkpoint" // a record in a pack, or <key>.json and <key>.txt
	ckBase    = "base"       // content equal to the base's: nothing to attribute
	ckNonText = "non_text"   // not attributed line by line
	ckOver    = "over_limit" // no room left in the session's budget
)

type ckIdentity struct {
	Size    int64  `json:"size"`
	MtimeNs int64  `json:"mtime_ns"`
	CtimeNs int64  `json:"ctime_ns"`
	Ino     uint64 `json:"ino"`
}

type ckEntry struct {
	State string `json:"state"`
	Key   string `json:"key,omitempty"`
	// Pack and Off locate the record of a checkpoint stored in a pack
	// (Key is then "").
	Pack   string `json:"pack,omitempty"`
	Off    int64  `json:"off,omitempty"`
	Digest string `json:"digest"`
	Bytes  int64  `json:"bytes,omitempty"` // size of the stored content copy
	// Sess and Agent, in a fork, name the session that wrote the stored
	// checkpoint's lines that name none (a checkpoint inherited as is;
	// fork.go).
	Sess  string `json:"workspace_session_id,omitempty"`
	Agent string `json:"agent,omitempty"`
	ckIdentity
}

type ckIndex struct {
	V     int                 `json:"v"`
	Files map[string]*ckEntry `json:"files"`
}

// ckLine is the writer of one line of a checkpointed file; Base marks a
// line kept from the session's base.
type ckLine struct {
	Base   bool
	Cmd    string
	TS     string
	Approx bool
	// Guess: no write record covered the line when it was checkpointed, so
	// it went to the releasing or ending command (FUSE driver); a write
	// record that arrives later and covers it re-attributes it.
	Guess bool
	// Sess and Agent name the session that wrote the line when it is not
	// the tracker's own: a fork copies its source's checkpoints with the
	// source's lines marked, so blame and publish keep crediting them to
	// the source (fork.go). "" = the tracker's session.
	Sess  string
	Agent string
}

// ckRun is a run of equal ckLines as stored.
type ckRun struct {
	N      int    `json:"n"`
	Base   bool   `json:"base,omitempty"`
	Cmd    string `json:"command_session_id,omitempty"`
	TS     string `json:"ts,omitempty"`
	Approx bool   `json:"approximate,omitempty"`
	Guess  bool   `json:"guess,omitempty"`
	Sess   string `json:"workspace_session_id,omitempty"`
	Agent  string `json:"agent,omitempty"`
}

type ckFile struct {
	V      int     `json:"v"`
	Path   string  `json:"path"`
	Digest string  `json:"content_digest"`
	Lines  []ckRun `json:"lines"`
}

func encodeRuns(lines []ckLine) []ckRun {
	runs := []ckRun{}
	for _, l := range lines {
		if n := len(runs); n > 0 {
			r := &runs[n-1]
			if r.Base == l.Base && r.Cmd == l.Cmd && r.TS == l.TS && r.Approx == l.Approx && r.Guess == l.Guess && r.Sess == l.Sess && r.Agent == l.Agent {
				r.N++
				continue
			}
		}
		runs = append(runs, ckRun{N: 1, Base: l.Base, Cmd: l.Cmd, TS: l.TS, Approx: l.Approx, Guess: l.Guess, Sess: l.Sess, Agent: l.Agent})
	}
	return runs
}

func decodeRuns(runs []ckRun) []ckLine {
	var out []ckLine
	for _, r := range runs {
		for range r.N {
			out = append(out, ckLine{Base: r.Base, Cmd: r.Cmd, TS: r.TS, Approx: r.Approx, Guess: r.Guess, Sess: r.Sess, Agent: r.Agent})
		}
	}
	return out
}

func ckKey(p string) string {
	sum := sha256.Sum256([]byte(p))
	return hex.EncodeToString(sum[:16])
}

// Workspace is what attribution needs of one workspace session: plain
// values, never the session object.
type Workspace struct {
	ID    string  // workspace_session_id
	Agent *string // the session's agent label
	Dir   string  // the session's state directory (sessions/<id>)
	Upper string  // the session's upper dir
	Base  *layers.View
	Log   *slog.Logger
}

// Tracker is one workspace session's attribution state: the cached
// checkpoint index, the serialization of checkpoints and captures, and a
// FUSE session's pending write ranges. The zero value is ready to use.
type Tracker struct {
	mu sync.Mutex // serializes checkpoints; guards the cached index below
	// idx caches the parsed checkpoint index with the identity of the
	// index.json it was read from (or written to).
	idx   *ckIndex
	idxID fileIdentity
	dirty bool      // idx is newer than index.json
	saved time.Time // when index.json was last written

	actMu sync.Mutex // serializes captures of file activity (activity.go)
	// act caches the capture state parsed from (or written to)
	// activity.json, whose identity was actID (guarded by actMu).
	act   map[string]upperState
	actID fileIdentity

	walks atomic.Int64 // full walks of the upper dir (tests)

	scans int // full passes over the index by checkpoints (tests)

	fuseMu sync.Mutex
	fuse   *fuseAttr // FUSE driver: write ranges since the last checkpoint (fuseattr.go)
}

func attrDir(w Workspace) string { return filepath.Join(w.Dir, "attribution") }

// writeFileAtomic writes a file through a temporary name and a rename.
func writeFileAtomic(p string, data []byte) error {
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, p)
}

// loadIndex reads index.json; a missing or corrupt one is rebuilt from the
// stored checkpoints with unknown stat identities (their files are re-read
// once).
// cachedIndex returns the session's checkpoint index, parsing index.json
// only when it changed: a publish asks once per committed file, and parsing
// a 1,000-entry index 1,000 times made large publishes quadratic. The
// caller holds t.mu.
func (t *Tracker) cachedIndex(dir string) *ckIndex {
	if t.idx != nil && t.dirty {
		return t.idx // newer than index.json (a deferred write, FUSE driver)
	}
	id, ok := identityOfFile(filepath.Join(dir, attrIndexName))
	if ok && t.idx != nil && id == t.idxID {
		return t.idx
	}
	idx := loadIndex(dir)
	if ok {
		t.idx, t.idxID = idx, id
	}
	return idx
}

// saveIndex writes index.json and caches idx as what it holds. The caller
// holds t.mu.
func (t *Tracker) saveIndex(dir string, idx *ckIndex) error {
	b, err := json.Marshal(idx)
	if err == nil {
		err = writeFileAtomic(filepath.Join(dir, attrIndexName), b)
	}
	t.idx, t.dirty, t.saved = idx, err != nil, time.Now()
	if err != nil {
		return err
	}
	gcPacks(dir, idx)
	t.idxID, _ = identityOfFile(filepath.Join(dir, attrIndexName))
	return nil
}

// indexSaveEvery bounds how long a deferred index write may wait; what a
// crash loses in between is attribution of the files checkpointed since
// (they start again from the base).
const indexSaveEvery = 2 * time.Second

func loadIndex(dir string) *ckIndex {
	idx := &ckIndex{V: 1, Files: map[string]*ckEntry{}}
	if b, err := os.ReadFile(filepath.Join(dir, attrIndexName)); err == nil {
		if json.Unmarshal(b, idx) == nil && idx.Files != nil {
			return idx
		}
		idx = &ckIndex{V: 1, Files: map[string]*ckEntry{}}
	}
	ents, _ := os.ReadDir(dir)
	var packs []string
	for _, de := range ents {
		if isPackName(de.Name()) {
			packs = append(packs, de.Name())
		}
	}
	loadPacks(dir, packs, idx)
	for _, de := range ents {
		name := de.Name()
		if !strings.HasSuffix(name, ".json") || name == attrIndexName {
			continue
		}
		key := strings.TrimSuffix(name, ".json")
		var f ckFile
		b, err := os.ReadFile(filepath.Join(dir, name))
		st, serr := os.Stat(filepath.Join(dir, key+".txt"))
		if err != nil || serr != nil || json.Unmarshal(b, &f) != nil || ckKey(f.Path) != key {
			_ = os.Remove(filepath.Join(dir, name))
			_ = os.Remove(filepath.Join(dir, key+".txt"))
			continue
		}
		idx.Files[f.Path] = &ckEntry{State: ckStored, Key: key, Digest: f.Digest, Bytes: st.Size()}
	}
	return idx
}

// stored is what an entry counts against the attribution store's limits.
func (e *ckEntry) stored() (files int, bytes int64) {
	if e == nil || e.State != ckStored {
		return 0, 0
	}
	return 1, e.Bytes
}

// ckUsage is the stored checkpoints' count and bytes, kept current by a
// checkpointer as it changes the index: recounting the index for every
// visited file made a command that wrote n files cost n² map steps at its
// checkpoint (about a second at 10,000 files).
type ckUsage struct {
	files int
	bytes int64
	// scans counts full passes over the index (tests check it stays at
	// one per checkpoint).
	scans int
}

// usageExcept is the usage of every stored checkpoint but p's.
func (cp *checkpointer) usageExcept(p string) (files int, bytes int64) {
	if !cp.counted {
		cp.use = ckUsage{scans: cp.use.scans + 1}
		for _, e := range cp.idx.Files {
			f, b := e.stored()
			cp.use.files += f
			cp.use.bytes += b
		}
		cp.counted = true
	}
	f, b := cp.idx.Files[p].stored()
	return cp.use.files - f, cp.use.bytes - b
}

// put sets (e != nil) or removes p's entry, keeping the usage current.
func (cp *checkpointer) put(p string, e *ckEntry) {
	of, ob := cp.idx.Files[p].stored()
	nf, nb := e.stored()
	cp.use.files += nf - of
	cp.use.bytes += nb - ob
	if e == nil {
		delete(cp.idx.Files, p)
	} else {
		cp.idx.Files[p] = e
	}
	cp.changed = true
}

// loadCheckpoint reads a stored checkpoint: its lines and content copy.
// A pass visits each path once, so the entry it reads is never in the pack
// that pass is filling.
func loadCheckpoint(dir string, e *ckEntry) ([]ckLine, []byte, bool) {
	if e != nil && e.State == ckStored && e.Pack != "" {
		f, content, err := readPacked(dir, e)
		if err != nil {
			return nil, nil, false
		}
		lines := entryLines(e, f)
		if ContentDigest(content) != f.Digest || len(lines) != len(TextLines(content)) {
			return nil, nil, false
		}
		return lines, content, true
	}
	lines, digest, ok := loadCheckpointLines(dir, e)
	if !ok {
		return nil, nil, false
	}
	content, err := os.ReadFile(filepath.Join(dir, e.Key+".txt"))
	if err != nil || ContentDigest(content) != digest || len(lines) != len(TextLines(content)) {
		return nil, nil, false
	}
	return lines, content, true
}

// loadCheckpointLines reads a stored checkpoint's lines and the digest of
// the content they describe, without the content copy (of a key file
// checkpoint; a pack record is read whole).
func loadCheckpointLines(dir string, e *ckEntry) ([]ckLine, string, bool) {
	if e == nil || e.State != ckStored {
		return nil, "", false
	}
	var f ckFile
	if e.Pack != "" {
		var err error
		if f, _, err = readPacked(dir, e); err != nil {
			return nil, "", false
		}
		return entryLines(e, f), f.Digest, true
	}
	b, err := os.ReadFile(filepath.Join(dir, e.Key+".json"))
	if err != nil {
		return nil, "", false
	}
	if json.Unmarshal(b, &f) != nil {
		return nil, "", false
	}
	return entryLines(e, f), f.Digest, true
}

// entryLines are the lines of a stored checkpoint f of entry e: lines
// that name no session are e's session's (a fork's inherited entry).
func entryLines(e *ckEntry, f ckFile) []ckLine {
	lines := decodeRuns(f.Lines)
	if e.Sess != "" {
		for i := range lines {
			if !lines[i].Base && lines[i].Sess == "" {
				lines[i].Sess, lines[i].Agent = e.Sess, e.Agent
			}
		}
	}
	return lines
}

func dropCheckpoint(dir string, e *ckEntry) {
	if e != nil && e.Key != "" {
		_ = os.Remove(filepath.Join(dir, e.Key+".json"))
		_ = os.Remove(filepath.Join(dir, e.Key+".txt"))
	}
}

func identityOf(st *unix.Stat_t) ckIdentity {
	return ckIdentity{Size: st.Size, MtimeNs: st.Mtim.Nano(), CtimeNs: st.Ctim.Nano(), Ino: st.Ino}
}

// Checkpoint takes a checkpoint of a session (§11.3, kernel driver):
// every text file of the upper dir that changed since the previous
// checkpoint (size, mtime, ctime, inode; then content) is diffed against
// its previous checkpoint, or against the base for a first change; kept
// lines keep their writers, new lines get commandID ("" = null: a file
// operation) with approximate set as given. With paths, only those
// workspace-relative paths are examined (a file operation's own target).
// Best effort: failures only lose attribution.
func (t *Tracker) Checkpoint(ctx context.Context, w Workspace, commandID string, approximate bool, paths ...string) {
	t.checkpointWith(ctx, w, ckLine{Cmd: commandID, Approx: approximate}, nil, false, nil, paths...)
}

// CommandEnd is what the end of a kernel session's command records: a
// Checkpoint crediting commandID and, with activity, the file activity
// capture of CaptureActivity (source "capture"), which it returns. Both
// come from one walk of the upper dir: they walked it once each, and with
// 10,000 changed files each walk cost about 20 ms of every command.
func (t *Tracker) CommandEnd(ctx context.Context, w Workspace, commandID string, approximate, activity bool) []ActivityRecord {
	if _, err := os.Stat(w.Dir); err != nil {
		return nil // destroyed
	}
	root, err := layers.OpenRoot(w.Upper)
	if err != nil {
		return nil
	}
	sc := t.scanUpper(ctx, root)
	root.Close()
	if ctx.Err() != nil {
		return nil
	}
	t.checkpointWith(ctx, w, ckLine{Cmd: commandID, Approx: approximate}, nil, false, sc)
	if !activity {
		return nil
	}
	return t.captureActivity(ctx, w, commandID, "", "capture", sc)
}

// checkpointWith is Checkpoint with the default writer of new lines
// given as a line (FUSE: Guess set) and, per path, the write ranges
// reported since the previous checkpoint: a new line (or a guessed one)
// that a range covers belongs to the range's writer.
//
// deferIndex keeps the updated index in memory and writes index.json at
// most every indexSaveEvery (a FUSE session checkpoints at every release
// of a written handle: rewriting a large index each time made a command
// writing thousands of files quadratic).
//
// Without paths every file of the upper dir is examined: those of the scan
// sc, or of a walk when sc is nil.
func (t *Tracker) checkpointWith(ctx context.Context, w Workspace, line ckLine, ranges map[string][]writeRange, deferIndex bool, sc []scanEntry, paths ...string) {
	t.mu.Lock() // checkpoints of one session are serialized
	defer t.mu.Unlock()
	dir := attrDir(w)
	if _, err := os.Stat(w.Dir); err != nil {
		return // destroyed
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		w.Log.Warn("attribution.checkpoint_failed", "workspace_session_id", w.ID, "err", err)
		return
	}
	// The session's processes control the upper dir: read it beneath a
	// Root, never through a symlink.
	root, err := layers.OpenRoot(w.Upper)
	if err != nil {
		return
	}
	defer root.Close()
	cp := &checkpointer{log: w.Log, idx: t.cachedIndex(dir), dir: dir, root: root, base: w.Base,
		ts: now3339(), line: line, ranges: ranges, pack: packWriter{dir: dir}}
	cp.line.TS = cp.ts
	if len(paths) > 0 {
		for _, p := range paths {
			cp.visit(p)
		}
	} else {
		if sc == nil {
			sc = t.scanUpper(ctx, root)
		}
		seen := map[string]bool{}
		for _, e := range sc {
			if strings.HasPrefix(e.fi.Name(), ".wh.") || !e.fi.Mode().IsRegular() {
				continue
			}
			seen[e.rel] = true
			if st, ok := e.fi.Sys().(*unix.Stat_t); ok {
				if e := cp.idx.Files[e.rel]; e != nil && e.ckIdentity == identityOf(st) {
					continue // unchanged: no need to open it
				}
			}
			cp.visit(e.rel)
		}
		if ctx.Err() == nil {
			for p, e := range cp.idx.Files {
				if !seen[p] {
					dropCheckpoint(dir, e)
					cp.put(p, nil)
				}
			}
		}
	}
	cp.flush()
	t.scans += cp.use.scans
	if cp.changed {
		t.idx, t.dirty = cp.idx, true
	}
	if t.dirty && (!deferIndex || time.Since(t.saved) >= indexSaveEvery) {
		if err := t.saveIndex(dir, cp.idx); err != nil {
			w.Log.Warn("attribution.checkpoint_failed", "workspace_session_id", w.ID, "err", err)
		}
	}
}

type checkpointer struct {
	log     *slog.Logger
	idx     *ckIndex
	dir     string
	root    *layers.Root
	base    *layers.View
	ts      string
	line    ckLine // the writer of new lines
	changed bool
	ranges  map[string][]writeRange // FUSE write records per path since the previous checkpoint
	use     ckUsage                 // valid once counted
	counted bool
	pack    packWriter // this pass's stored checkpoints
}

func (cp *checkpointer) set(p string, e *ckEntry) {
	if old := cp.idx.Files[p]; old != nil && old.Key != "" && (e == nil || e.Key == "") {
		dropCheckpoint(cp.dir, old)
	}
	cp.put(p, e)
}

// visit checkpoints one path of the upper dir.
func (cp *checkpointer) visit(p string) {
	prev := cp.idx.Files[p]
	f, err := cp.root.Open(p)
	if err != nil {
		if prev != nil && (errors.Is(err, fs.ErrNotExist) || errors.Is(err, layers.ErrSymlink) || errors.Is(err, unix.ENOTDIR)) {
			dropCheckpoint(cp.dir, prev)
			cp.put(p, nil)
		}
		return
	}
	defer f.Close()
	var st unix.Stat_t
	if unix.Fstat(int(f.Fd()), &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFREG || layers.IsUpperWhiteout(cp.root, p, &st) {
		return
	}
	id := identityOf(&st)
	rs := cp.ranges[p]
	if prev != nil && prev.ckIdentity == id && len(rs) == 0 {
		return // unchanged since the previous checkpoint
	}
	if st.Size > TextMax {
		cp.set(p, &ckEntry{State: ckNonText, ckIdentity: id})
		return
	}
	content, err := io.ReadAll(io.LimitReader(f, TextMax+1))
	if err != nil {
		return
	}
	digest := ContentDigest(content)
	if prev != nil && prev.Digest == digest && (len(rs) == 0 || prev.State != ckStored) {
		e := *prev
		e.ckIdentity = id
		cp.set(p, &e)
		return
	}
	if !IsText(content) {
		cp.set(p, &ckEntry{State: ckNonText, Digest: digest, ckIdentity: id})
		return
	}
	prevLines, prevContent, ok := loadCheckpoint(cp.dir, prev)
	if !ok {
		// First change: the base's lines are nobody's in the session.
		prevContent = nil
		if b, err := cp.base.ReadFile(p); err == nil && IsText(b) {
			prevContent = b
		}
		if prevContent != nil && ContentDigest(prevContent) == digest {
			cp.set(p, &ckEntry{State: ckBase, Digest: digest, ckIdentity: id})
			return
		}
		prevLines = make([]ckLine, len(TextLines(prevContent)))
		for i := range prevLines {
			prevLines[i] = ckLine{Base: true}
		}
	}
	origins := lineOrigins(prevContent, content)
	lines := make([]ckLine, len(origins))
	spans := lineSpans(content)
	for i, o := range origins {
		kept := o >= 0 && o < len(prevLines)
		if kept {
			lines[i] = prevLines[o]
		} else {
			lines[i] = cp.line
		}
		// A kept line that was a guess goes to a range written to this
		// path since (a second writer's records arrived after the first
		// release); a range moved here by a rename covers the whole copy,
		// kept lines included, and so credits new lines only.
		if (!kept || lines[i].Guess) && len(rs) > 0 && i < len(spans) {
			if cmd, ok := rangeWriter(rs, spans[i], kept); ok {
				// The ranges are of the session the checkpoint credits (a
				// fork's first checkpoint: its source's).
				lines[i] = ckLine{Cmd: cmd, TS: cp.ts, Sess: cp.line.Sess, Agent: cp.line.Agent}
			}
		}
	}
	if prev != nil && prev.Digest == digest && prev.State == ckStored && slices.Equal(lines, prevLines) {
		e := *prev
		e.ckIdentity = id
		cp.set(p, &e)
		return
	}
	files, bytes := cp.usageExcept(p)
	if files+1 > attrMaxFiles || bytes+int64(len(content)) > attrMaxBytes {
		cp.set(p, &ckEntry{State: ckOver, Digest: digest, ckIdentity: id})
		return
	}
	meta, err := json.Marshal(ckFile{V: 1, Path: p, Digest: digest, Lines: encodeRuns(lines)})
	if err != nil {
		cp.log.Warn("attribution.checkpoint_failed", "path", p, "err", err)
		cp.set(p, nil)
		return
	}
	pack, off := cp.pack.add(p, meta, content)
	cp.set(p, &ckEntry{State: ckStored, Pack: pack, Off: off, Digest: digest, Bytes: int64(len(content)), ckIdentity: id})
	if cp.pack.buf.Len() >= packFlushAt {
		cp.flush()
	}
}

// flush writes the pack being filled; the entries of a pack that could not
// be written have no checkpoint (their next change diffs against the base).
func (cp *checkpointer) flush() {
	pack := cp.pack.name
	lost, err := cp.pack.flush()
	if err == nil {
		return
	}
	cp.log.Warn("attribution.checkpoint_failed", "pack", pack, "files", len(lost), "err", err)
	for _, p := range lost {
		if e := cp.idx.Files[p]; e != nil && e.Pack == pack {
			cp.put(p, nil)
		}
	}
}

// attribution returns the checkpointed writer of each line of
// content (the session's current version of p), or nil without a
// checkpoint. Lines changed after the last checkpoint have an empty Cmd and
// TS (writer unknown).
func (t *Tracker) attribution(w Workspace, p string, content []byte) []ckLine {
	digest := ContentDigest(content)
	t.mu.Lock() // checkpoints of one session are serialized
	dir := attrDir(w)
	e := t.cachedIndex(dir).Files[p]
	if e != nil && e.Digest == digest {
		// Unchanged since its checkpoint (the usual case at publication):
		// the stored lines describe content as is, the content copy is not
		// needed.
		lines, ckDigest, ok := loadCheckpointLines(dir, e)
		t.mu.Unlock()
		if !ok || ckDigest != digest || len(lines) != len(TextLines(content)) {
			return nil
		}
		return lines
	}
	lines, ckContent, ok := loadCheckpoint(dir, e)
	t.mu.Unlock()
	if !ok {
		return nil
	}
	if ContentDigest(ckContent) == digest {
		return lines
	}
	out := make([]ckLine, len(TextLines(content)))
	for i, o := range lineOrigins(ckContent, content) {
		if o >= 0 && o < len(lines) {
			out[i] = lines[o]
		}
	}
	return out
}

// LineOwners returns the owner of each line of content, the
// session's version of path, for publication (AuditFile.Session with
// SessionContent = content): workspace_session:<id> with the session's
// agent and the checkpointed command_session_id and approximate flag (null
// command for lines of file operations, of unknown writers and for lines
// the session kept from its base). Call it before the session directory is
// removed.
func (t *Tracker) LineOwners(w Workspace, path string, content []byte) []LineOwner {
	owner := SessionOwner(w.ID, w.Agent)
	n := len(TextLines(content))
	out := RepeatOwner(owner, n)
	if !IsText(content) {
		return out
	}
	for i, l := range t.attribution(w, path, content) {
		if i < n && !l.Base {
			out[i] = l.owner(owner)
			out[i].CommandSessionID, out[i].TS, out[i].Approximate = l.Cmd, l.TS, l.Approx
		}
	}
	return out
}

// owner is the session owner of a line the tracker's session (own) or,
// for a line a fork inherited, its source wrote.
func (l ckLine) owner(own LineOwner) LineOwner {
	if l.Sess == "" {
		return own
	}
	return LineOwner{Owner: "workspace_session:" + l.Sess, Agent: l.Agent}
}
