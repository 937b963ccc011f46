package sandbox

import (
	"context"
	"fmt"
	"log/slog"
	"os"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
	"github.com/ephemeral-ai-lab/sandbox/layers"
)

// Store persists sandbox records (the state database).
type Store interface {
	PutSandbox(ctx context.Context, rec *Record) error
	// DeleteSandboxRows removes the sandbox's record and every record that
	// belongs to it.
	DeleteSandboxRows(ctx context.Context, id string) error
}

// Occupants is what the workspace layer does for a sandbox's lifecycle:
// it ends what lives in the sandbox and forgets what it kept of it.
type Occupants[W any] interface {
	// Stop ends every session of sb; destroy calls it with sb's gate
	// write-held.
	Stop(ctx context.Context, sb *Sandbox[W], progress func(string))
	// Forget removes what the occupants stored outside sb's directory
	// (command transcripts), once the directory is gone.
	Forget(sb *Sandbox[W])
}

// Manager changes the registry: destroy, removal and the persisted
// activity revision. Its fields are the supervisor's parts it uses.
type Manager[W any] struct {
	Reg       *Registry[W]
	Store     Store
	Log       *slog.Logger
	Occupants Occupants[W]
	// NewID makes a new ID with prefix; Dir is the directory of sandbox id;
	// NewWork is a new sandbox's empty occupants.
	NewID   func(prefix string) string
	Dir     func(id string) string
	NewWork func() W
	// Span opens a span (of sb when not nil; a child when ctx carries one).
	Span func(ctx context.Context, sb *Sandbox[W], origin, name string, attrs map[string]any) (Span, context.Context)
	// Detach drops what the supervisor keeps of sb outside the registry
	// before its directory goes (its cgroup); Seal seals the sandbox's
	// event, span and resource stores below dir, whose later appends are
	// dropped. Both may be nil.
	Detach func(id string)
	Seal   func(dir string)
	// RemoveDir removes the sandbox's directory, which holds what its
	// sessions wrote (entries of subordinate IDs included); nil is
	// layers.RemoveAll.
	RemoveDir func(ctx context.Context, dir string) error
	// ReleaseImage drops a destroyed sandbox's reference on its image
	// rootfs (§4.3); nil when there is no image cache.
	ReleaseImage func(rootfs string)
}

// Bump records a client-visible change (§4.4).
func (m *Manager[W]) Bump(ctx context.Context, sb *Sandbox[W]) {
	rec := m.Revise(sb)
	if err := m.Store.PutSandbox(ctx, &rec); err != nil {
		m.Log.Warn("persist activity revision", "sandbox", rec.ID, "err", err)
	}
}

// Revise advances sb's activity revision (§4.4) and returns the record to
// persist, for a caller that stores it in the same transaction as the
// change it records.
func (m *Manager[W]) Revise(sb *Sandbox[W]) Record {
	sb.Mu.Lock()
	defer sb.Mu.Unlock()
	sb.Rec.ActivityRevision++
	return sb.Rec
}

// Remove deletes everything a sandbox owns: directory, the occupants'
// files, records, registry entry.
func (m *Manager[W]) Remove(ctx context.Context, sb *Sandbox[W]) error {
	if m.Detach != nil {
		m.Detach(sb.Rec.ID)
	}
	sb.StopBackground()
	if m.Seal != nil {
		m.Seal(sb.Dir)
	}
	var rerr error
	if m.RemoveDir != nil {
		rerr = m.RemoveDir(ctx, sb.Dir)
	} else {
		rerr = layers.RemoveAll(sb.Dir)
	}
	if _, err := os.Lstat(sb.Dir); err == nil {
		if rerr != nil {
			return rerr
		}
		return fmt.Errorf("remove %s: still present", sb.Dir)
	}
	m.Occupants.Forget(sb)
	if err := m.Store.DeleteSandboxRows(ctx, sb.Rec.ID); err != nil {
		return err
	}
	m.Reg.Delete(sb.Rec.ID)
	return nil
}

// Destroy is destroy_sandbox: it marks the sandbox stopping, waits for the
// requests in flight on it, stops its sessions and removes it. The result
// is the record as it was, in state stopped.
func (m *Manager[W]) Destroy(ctx context.Context, id string, progress func(string)) (Record, error) {
	sb, e := m.Reg.Lookup(id)
	if e != nil {
		return Record{}, e
	}
	sb.Mu.Lock()
	state := sb.Rec.State
	if state == StateCreating || state == StateStopping {
		sb.Mu.Unlock()
		return Record{}, sb.BusyError()
	}
	sb.Rec.State = StateStopping
	rec := sb.Rec
	sb.Mu.Unlock()
	if err := m.Store.PutSandbox(ctx, &rec); err != nil {
		return Record{}, err
	}
	progress("waiting for in-flight operations of " + rec.ID)
	sb.Gate.Lock() // new requests already see stopping; wait for the running ones
	defer sb.Gate.Unlock()
	m.Occupants.Stop(ctx, sb, progress)
	final := sb.View()
	progress("removing " + sb.Dir)
	if err := m.Remove(ctx, sb); err != nil {
		sb.Mu.Lock()
		sb.Rec.State, sb.Rec.Error = StateFailed, err.Error()
		rec := sb.Rec
		sb.Mu.Unlock()
		_ = m.Store.PutSandbox(ctx, &rec)
		return Record{}, catalog.Errorf(catalog.OperationFailed, "destroy sandbox %s: %v", rec.ID, err).With("sandbox_id", rec.ID)
	}
	if rec.Rootfs != "host" && m.ReleaseImage != nil {
		m.ReleaseImage(rec.Rootfs) // §4.3: the image rootfs reference is released
	}
	final.State = StateStopped
	final.LiveWorkspaceSessions = []string{}
	final.Error = ""
	return final, nil
}
