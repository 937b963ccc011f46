package layers

// Sync of a session's upper dir onto a newer head (the storage step of
// sync_workspace_session, issue #19).
//
// The upper is captured against the session's base like a publish, and the
// captured changeset goes through the publish planner against the target
// head (plan, with the same strategies, resolutions, dry run and
// all-or-nothing rejection listing every conflict). The layer that publish
// would add on top of the head is exactly what the new upper must hold over
// the target chain: paths changed only on the head are absent from it (they
// show through the new lowers), paths changed only in the session are kept,
// whiteouts and opaque directories stay where they still apply, and merged
// paths hold the merge. A copy-up of an unchanged file whose path the head
// changed resolves to head's version and is dropped from the upper, so it
// no longer hides the head.
//
// Crash atomicity. The new upper is built beside the old one
// (".<upper>.sync-new", same filesystem), a journal (".<upper>.sync.json")
// records the device and inode of the new upper, then one
// renameat2(RENAME_EXCHANGE) puts the new upper at the upper's name and the
// old one at the staging name. Whatever instant a crash hits, the upper's
// name holds the old or the new tree whole; RecoverSync tells which from the
// inode in the journal and reports the manifests the upper belongs to.
//
// The old upper is kept (at the staging name) until CompleteSync, because
// a mounted overlay may still use it: the wiring exchanges, then moves the
// holder onto the new view, and only then completes — or AbortSync
// exchanges back when the holder refuses the swap.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// SyncOptions configures SyncUpper.
type SyncOptions struct {
	Base   Manifest // the manifest the upper was made over (the session's leased base)
	Target Manifest // the head to sync onto; the caller leases it
	Upper  string   // the session's upper dir (host path; its parent is the supervisor's)

	DefaultStrategy Strategy            // "" means merge
	Resolutions     map[string]Strategy // plan path → strategy
	Merge           MergeOptions
	MaxPlanPaths    int
	ExpansionLimit  int
	DryRun          bool // plan only: nothing is written
	Git             GitOptions
}

// SyncResult describes a sync that wrote a new upper.
type SyncResult struct {
	// Revision is the target's revision: the session's new base.
	Revision Revision
	// Changed is false when the new upper equals the old one in every path
	// the plan decides (the exchange still happens, so the upper holds no
	// stale copy-ups).
	Changed bool
	// Committed lists the paths the new upper holds, with their outcome
	// (merged paths hold the 3-way merge), for attribution.
	Committed []CommittedFile
}

// SyncRecovery is what RecoverSync found.
type SyncRecovery struct {
	Found bool // a sync journal was there
	// Synced: the upper's name holds the new upper (its base is Target);
	// otherwise it holds the old one (its base is Base).
	Synced       bool
	Base, Target Manifest
}

// ErrSyncPending says an earlier sync of this upper was neither completed
// nor aborted; RecoverSync (or CompleteSync/AbortSync) settles it first.
var ErrSyncPending = errors.New("an earlier sync of this upper is pending")

// syncStep is a point of SyncUpper where a test hook may inject a crash.
type syncStep int

const (
	syncStepBuilt     syncStep = iota + 1 // the new upper is staged
	syncStepJournaled                     // the journal is durable
	syncStepExchanged                     // the new upper is at the upper's name
)

type syncJournal struct {
	Upper   string   `json:"upper"`   // the upper's name in its parent
	Staging string   `json:"staging"` // the staging name
	NewDev  uint64   `json:"new_dev"` // the new upper's directory
	NewIno  uint64   `json:"new_ino"`
	Base    Manifest `json:"base"`
	Target  Manifest `json:"target"`
}

func syncPaths(upper string) (parent, name, staging, journal string, err error) {
	abs, err := filepath.Abs(upper)
	if err != nil {
		return "", "", "", "", err
	}
	parent, name = filepath.Dir(abs), filepath.Base(abs)
	if name == "/" || name == "." {
		return "", "", "", "", fmt.Errorf("upper %q: %w", upper, fs.ErrInvalid)
	}
	return parent, name, "." + name + ".sync-new", "." + name + ".sync.json", nil
}

// SyncUpper plans the sync of opt.Upper (made over opt.Base) onto
// opt.Target and, unless the plan rejects or DryRun is set, replaces the
// upper atomically by its new version and keeps the old one aside until
// CompleteSync or AbortSync.
//
// A rejection returns the plan and a *Rejection error (every conflicting
// path listed), an invalid resolution a *ResolutionError and no plan; in
// both cases, and for DryRun (rejection in Plan.Rejection, nil error),
// nothing on disk changes. A pending earlier sync is ErrSyncPending.
//
// The session must not write its upper from the capture to the exchange
// (freeze it): a write in that window is not carried into the new upper.
// One sync per upper at a time: the caller serializes per session.
//
// The wiring: lease Target; SyncUpper; move the holder onto Target's chain
// (SwapLower, which must then serve the upper at opt.Upper's name: the
// kernel driver reopens it by name, the FUSE driver holds a descriptor of
// the old one); on success record the new base, CompleteSync, release the
// old lease; on failure AbortSync and release Target's lease. At start-up,
// RecoverSync before mounting says which base the upper has.
func (s *Stack) SyncUpper(ctx context.Context, opt SyncOptions) (*Plan, SyncResult, error) {
	parent, name, staging, journal, err := syncPaths(opt.Upper)
	if err != nil {
		return nil, SyncResult{}, fmt.Errorf("sync: %w", err)
	}
	popt, err := normalizePublishOptions(PublishOptions{DefaultStrategy: opt.DefaultStrategy, Resolutions: opt.Resolutions,
		Merge: opt.Merge, MaxPlanPaths: opt.MaxPlanPaths, ExpansionLimit: opt.ExpansionLimit, DryRun: opt.DryRun})
	if err != nil {
		return nil, SyncResult{}, err
	}
	popt.keepGit = true
	popt.Git = opt.Git
	if !opt.DryRun {
		for _, n := range []string{staging, journal} {
			if _, err := os.Lstat(filepath.Join(parent, n)); err == nil {
				return nil, SyncResult{}, fmt.Errorf("sync %s: %w", opt.Upper, ErrSyncPending)
			}
		}
	}
	lease := s.AcquireAt(opt.Target, "sync")
	defer func() { _, _ = lease.Release() }()

	upperPath := filepath.Join(parent, name)
	cs, err := Capture(ctx, upperPath, s.View(opt.Base))
	if err != nil {
		return nil, SyncResult{}, fmt.Errorf("sync: %w", err)
	}
	defer cs.Close()
	// Special files (FIFOs, sockets) are the session's private state: a
	// sync carries them over instead of refusing like a publish. Entries
	// with a non-UTF-8 name still reject (protected_path).
	var special []Drop
	planCS := &Changeset{Changes: cs.Changes, Carriers: cs.Carriers, Root: cs.Root}
	for _, d := range cs.Drops {
		if d.Reason == DropUnsupportedSpecialFile {
			special = append(special, d)
		} else {
			planCS.Drops = append(planCS.Drops, d)
		}
	}

	tv := s.View(opt.Target)
	pr, err := s.plan(ctx, opt.Base, opt.Target, tv, planCS, popt)
	if err != nil {
		return nil, SyncResult{}, fmt.Errorf("sync %s: %w", opt.Upper, err)
	}
	plan := pr.plan
	res := SyncResult{Revision: opt.Target.Revision()}
	if plan.Rejection != nil {
		if opt.DryRun {
			return plan, res, nil
		}
		return plan, res, plan.Rejection
	}
	res.Changed = !sameUpperContent(cs, pr.layer)
	res.Committed = pr.committed
	plan.WouldCommit = true
	if opt.DryRun {
		return plan, res, nil
	}

	stagingPath := filepath.Join(parent, staging)
	fail := func(err error) (*Plan, SyncResult, error) {
		if !errors.Is(err, errSimulatedCrash) {
			_ = forceRemoveAll(stagingPath)
			_ = os.Remove(filepath.Join(parent, journal))
		}
		return plan, SyncResult{}, fmt.Errorf("sync %s: %w", opt.Upper, err)
	}
	if err := buildUpper(stagingPath, tv, pr.layer, cs.Root, special); err != nil {
		return fail(err)
	}
	if err := s.syncStep(syncStepBuilt); err != nil {
		return fail(err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(stagingPath, &st); err != nil {
		return fail(&fs.PathError{Op: "lstat", Path: stagingPath, Err: err})
	}
	j := syncJournal{Upper: name, Staging: staging, NewDev: st.Dev, NewIno: st.Ino,
		Base: cloneManifest(opt.Base), Target: cloneManifest(opt.Target)}
	if err := writeJournal(filepath.Join(parent, journal), j); err != nil {
		return fail(err)
	}
	if err := s.syncStep(syncStepJournaled); err != nil {
		return fail(err)
	}
	if err := exchange(parent, name, staging); err != nil {
		return fail(err)
	}
	if err := s.syncStep(syncStepExchanged); err != nil {
		return plan, SyncResult{}, fmt.Errorf("sync %s: %w", opt.Upper, err)
	}
	return plan, res, nil
}

// sameUpperContent reports whether the layer is exactly the captured
// changes and carriers (the sync changed nothing the session sees).
func sameUpperContent(cs *Changeset, layer []Change) bool {
	all := cs.All()
	if len(all) != len(layer) {
		return false
	}
	for i := range all {
		a, b := all[i], layer[i]
		if a.Kind != b.Kind || a.Path != b.Path || a.Source != b.Source || a.Root != b.Root || b.Data != nil ||
			a.Target != b.Target || a.Mode != b.Mode {
			return false
		}
	}
	return true
}

// buildUpper writes the new upper: the planned changes in the upper format
// (layerBuilder: whiteouts as 0:0 devices or their xattr form, opaque
// xattrs, modes, mtimes, file content cloned where the filesystem can),
// the special files carried from the old upper, the old root's mode, then
// one syncfs.
func buildUpper(dir string, v *View, changes []Change, old *Root, special []Drop) error {
	b, err := newLayerBuilder(dir, v)
	if err != nil {
		return fmt.Errorf("stage new upper: %w", err)
	}
	defer func() { _ = b.wait() }() // finish reports its error; this stops the workers on an early return
	for _, c := range changes {
		if err := b.apply(c); err != nil {
			return fmt.Errorf("stage new upper: %w", err)
		}
	}
	for _, d := range special {
		if _, ok := b.built[d.Path]; ok {
			continue
		}
		if err := b.ensureDir(parentOf(d.Path)); err != nil {
			return fmt.Errorf("stage new upper: %s: %w", d.Path, err)
		}
		src, err := old.OpenDir(parentOf(d.Path))
		if err != nil {
			return fmt.Errorf("stage new upper: %w", err)
		}
		c := &upperCopier{links: map[[2]uint64]string{}}
		err = c.entry(src, path.Base(d.Path), b.host(d.Path))
		src.Close()
		if err != nil {
			return fmt.Errorf("stage new upper: %w", err)
		}
		b.built[d.Path] = builtOther
	}
	if err := b.finish(); err != nil {
		return fmt.Errorf("stage new upper: %w", err)
	}
	fi, err := old.dir.stat()
	if err != nil {
		return fmt.Errorf("stage new upper: %w", err)
	}
	if err := chmodSyncDir(dir, unixMode(fi.Mode())); err != nil {
		return fmt.Errorf("stage new upper: %w", err)
	}
	return nil
}

func writeJournal(p string, j syncJournal) error {
	data, err := json.Marshal(j)
	if err != nil {
		return err
	}
	tmp := p + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, p); err != nil {
		return err
	}
	return fsyncDir(filepath.Dir(p))
}

// exchange swaps two names of dir atomically and makes it durable.
func exchange(dir, a, b string) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return &fs.PathError{Op: "open", Path: dir, Err: err}
	}
	defer unix.Close(fd)
	if err := unix.Renameat2(fd, a, fd, b, unix.RENAME_EXCHANGE); err != nil {
		return &os.LinkError{Op: "renameat2 exchange", Old: filepath.Join(dir, a), New: filepath.Join(dir, b), Err: err}
	}
	if err := unix.Fsync(fd); err != nil {
		return &fs.PathError{Op: "fsync", Path: dir, Err: err}
	}
	return nil
}

func readJournal(p string) (syncJournal, bool, error) {
	var j syncJournal
	data, err := os.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		return j, false, nil
	}
	if err != nil {
		return j, false, err
	}
	if err := json.Unmarshal(data, &j); err != nil {
		return j, false, fmt.Errorf("parse %s: %w", p, err)
	}
	return j, true, nil
}

// isNew reports whether the upper's name holds the journal's new upper.
func (j syncJournal) isNew(upper string) (bool, error) {
	var st unix.Stat_t
	if err := unix.Lstat(upper, &st); err != nil {
		return false, &fs.PathError{Op: "lstat", Path: upper, Err: err}
	}
	return st.Dev == j.NewDev && st.Ino == j.NewIno, nil
}

// InspectSync reports what RecoverSync would find, changing nothing: the
// caller decides from it whether the sync committed (CompleteSync or
// RecoverSync keep the tree at the upper's name) or not (AbortSync).
func InspectSync(upper string) (SyncRecovery, error) {
	parent, name, _, journal, err := syncPaths(upper)
	if err != nil {
		return SyncRecovery{}, fmt.Errorf("inspect sync: %w", err)
	}
	j, found, err := readJournal(filepath.Join(parent, journal))
	if err != nil {
		return SyncRecovery{}, fmt.Errorf("inspect sync %s: %w", upper, err)
	}
	rec := SyncRecovery{Found: found}
	if found {
		rec.Base, rec.Target = j.Base, j.Target
		if rec.Synced, err = j.isNew(filepath.Join(parent, name)); err != nil {
			return SyncRecovery{}, fmt.Errorf("inspect sync %s: %w", upper, err)
		}
	}
	return rec, nil
}

// RecoverSync settles what a crash left of a sync of upper, at start-up,
// before the session is mounted again: the upper's name always holds a
// whole tree; the other one and the journal are removed. The result says
// whether that tree is the synced one (the session's base is then
// Target) or the old one (Base). Without a journal, a leftover staging
// tree (a crash while building) is removed and Found is false.
func RecoverSync(upper string) (SyncRecovery, error) {
	parent, name, staging, journal, err := syncPaths(upper)
	if err != nil {
		return SyncRecovery{}, fmt.Errorf("recover sync: %w", err)
	}
	j, found, err := readJournal(filepath.Join(parent, journal))
	if err != nil {
		return SyncRecovery{}, fmt.Errorf("recover sync %s: %w", upper, err)
	}
	rec := SyncRecovery{Found: found}
	if found {
		rec.Base, rec.Target = j.Base, j.Target
		if rec.Synced, err = j.isNew(filepath.Join(parent, name)); err != nil {
			return SyncRecovery{}, fmt.Errorf("recover sync %s: %w", upper, err)
		}
	}
	if err := settleSync(parent, staging, journal); err != nil {
		return SyncRecovery{}, fmt.Errorf("recover sync %s: %w", upper, err)
	}
	return rec, nil
}

// CompleteSync removes the old upper and the journal once the session runs
// on the new upper (the holder swapped) and the new base is recorded.
func CompleteSync(upper string) error {
	parent, name, staging, journal, err := syncPaths(upper)
	if err != nil {
		return fmt.Errorf("complete sync: %w", err)
	}
	j, found, err := readJournal(filepath.Join(parent, journal))
	if err != nil || !found {
		return fmt.Errorf("complete sync %s: no journal: %w", upper, errors.Join(err, fs.ErrNotExist))
	}
	isNew, err := j.isNew(filepath.Join(parent, name))
	if err != nil {
		return fmt.Errorf("complete sync %s: %w", upper, err)
	}
	if !isNew {
		return fmt.Errorf("complete sync %s: the upper is not the synced one", upper)
	}
	if err := settleSync(parent, staging, journal); err != nil {
		return fmt.Errorf("complete sync %s: %w", upper, err)
	}
	return nil
}

// AbortSync puts the old upper back (when the exchange happened) and
// removes the new one and the journal: for a holder that refused the swap.
func AbortSync(upper string) error {
	parent, name, staging, journal, err := syncPaths(upper)
	if err != nil {
		return fmt.Errorf("abort sync: %w", err)
	}
	j, found, err := readJournal(filepath.Join(parent, journal))
	if err != nil {
		return fmt.Errorf("abort sync %s: %w", upper, err)
	}
	if found {
		isNew, err := j.isNew(filepath.Join(parent, name))
		if err != nil {
			return fmt.Errorf("abort sync %s: %w", upper, err)
		}
		if isNew {
			if err := exchange(parent, name, staging); err != nil {
				return fmt.Errorf("abort sync %s: %w", upper, err)
			}
		}
	}
	if err := settleSync(parent, staging, journal); err != nil {
		return fmt.Errorf("abort sync %s: %w", upper, err)
	}
	return nil
}

// settleSync removes the staging tree, then the journal (in that order: a
// journal without staging still tells old from new).
func settleSync(parent, staging, journal string) error {
	if err := forceRemoveAll(filepath.Join(parent, staging)); err != nil {
		return err
	}
	if err := os.Remove(filepath.Join(parent, journal)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	_ = os.Remove(filepath.Join(parent, journal+".tmp"))
	return fsyncDir(parent)
}

func (s *Stack) syncStep(st syncStep) error {
	if s.syncHook != nil && s.syncHook(st) {
		return errSimulatedCrash
	}
	return nil
}
