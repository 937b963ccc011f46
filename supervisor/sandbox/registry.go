package sandbox

import (
	"sort"
	"sync"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
)

// Registry is the set of live sandboxes by ID. Its lock is a leaf: nothing
// else is acquired while it is held.
type Registry[W any] struct {
	mu sync.Mutex
	m  map[string]*Sandbox[W]
}

func NewRegistry[W any]() *Registry[W] {
	return &Registry[W]{m: map[string]*Sandbox[W]{}}
}

// Get returns the entry of id, nil when there is none.
func (r *Registry[W]) Get(id string) *Sandbox[W] {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.m[id]
}

// Put adds sb under its record's ID.
func (r *Registry[W]) Put(sb *Sandbox[W]) {
	r.mu.Lock()
	r.m[sb.Rec.ID] = sb
	r.mu.Unlock()
}

func (r *Registry[W]) Delete(id string) {
	r.mu.Lock()
	delete(r.m, id)
	r.mu.Unlock()
}

func (r *Registry[W]) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.m)
}

// All is a copy of the registry: callers range over it without the lock.
func (r *Registry[W]) All() map[string]*Sandbox[W] {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]*Sandbox[W], len(r.m))
	for id, sb := range r.m {
		out[id] = sb
	}
	return out
}

// Sorted is every entry ordered by ID.
func (r *Registry[W]) Sorted() []*Sandbox[W] {
	r.mu.Lock()
	all := make([]*Sandbox[W], 0, len(r.m))
	for _, sb := range r.m {
		all = append(all, sb)
	}
	r.mu.Unlock()
	sort.Slice(all, func(i, j int) bool { return all[i].Rec.ID < all[j].Rec.ID })
	return all
}

// Resolve is §2.4 step 7. Observability reads also work on failed sandboxes.
func (r *Registry[W]) Resolve(id string, readOnly bool) (*Sandbox[W], *catalog.Error) {
	if !catalog.ValidID(id) {
		return nil, catalog.Errorf(catalog.InvalidRequest, "sandbox_id must match [A-Za-z0-9._:-]{1,128}")
	}
	sb := r.Get(id)
	if sb == nil {
		return nil, NotFound(id)
	}
	sb.Mu.Lock()
	state, why := sb.Rec.State, sb.Rec.Error
	sb.Mu.Unlock()
	switch state {
	case StateCreating, StateStopping:
		return nil, sb.BusyError()
	case StateFailed:
		if !readOnly {
			return nil, catalog.Errorf(catalog.OperationFailed, "sandbox %s failed: %s", id, why).With("sandbox_id", id)
		}
	}
	return sb, nil
}

// Lookup finds id in any state, for the management operations (destroy,
// inspect) that also act on busy and failed sandboxes.
func (r *Registry[W]) Lookup(id string) (*Sandbox[W], *catalog.Error) {
	sb := r.Get(id)
	if sb == nil {
		return nil, NotFound(id)
	}
	return sb, nil
}

// ReadStack read-holds the gate of the ready sandbox id for a read of its
// layer stack; done releases it. A busy or failed sandbox is refused.
func (r *Registry[W]) ReadStack(id string) (sb *Sandbox[W], done func(), e *catalog.Error) {
	sb, e = r.Lookup(id)
	if e != nil {
		return nil, nil, e
	}
	if !sb.Gate.TryRLock() {
		return nil, nil, sb.BusyError()
	}
	sb.Mu.Lock()
	state, failure := sb.Rec.State, sb.Rec.Error
	sb.Mu.Unlock()
	switch {
	case state == StateFailed:
		e = catalog.Errorf(catalog.OperationFailed, "sandbox %s failed: %s", id, failure).With("sandbox_id", id)
	case state != StateReady:
		e = sb.BusyError()
	case sb.Stack == nil:
		e = catalog.Errorf(catalog.OperationFailed, "sandbox %s has no layer stack", id).With("sandbox_id", id)
	}
	if e != nil {
		sb.Gate.RUnlock()
		return nil, nil, e
	}
	return sb, sb.Gate.RUnlock, nil
}
