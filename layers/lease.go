package layers

import (
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"
)

// Lease pins one manifest snapshot: while it is live, none of its layers is
// garbage collected (§8.5).
type Lease struct {
	s        *Stack
	id       string
	owner    string
	m        Manifest
	released bool // guarded by s.mu
}

// ID is the lease ID ("lease-" + lowercase ULID).
func (l *Lease) ID() string { return l.id }

// Owner is the owner string given when the lease was taken.
func (l *Lease) Owner() string { return l.owner }

// Manifest is the pinned manifest snapshot.
func (l *Lease) Manifest() Manifest { return cloneManifest(l.m) }

func cloneManifest(m Manifest) Manifest {
	m.Layers = slices.Clone(m.Layers)
	if m.Layers == nil {
		m.Layers = []LayerRef{}
	}
	return m
}

// Acquire pins the current head.
func (s *Stack) Acquire(owner string) (*Lease, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	head, err := s.Head()
	if err != nil {
		return nil, fmt.Errorf("acquire lease: %w", err)
	}
	return s.registerLocked("lease-"+newULID(), head, owner), nil
}

// AcquireAt pins the given manifest snapshot (which the caller read earlier).
func (s *Stack) AcquireAt(m Manifest, owner string) *Lease {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.registerLocked("lease-"+newULID(), m, owner)
}

// Restore re-registers a persisted lease (after a restart) under its ID. A
// live lease with the same ID is replaced.
func (s *Stack) Restore(leaseID string, m Manifest, owner string) *Lease {
	s.mu.Lock()
	defer s.mu.Unlock()
	if old, ok := s.leases[leaseID]; ok {
		old.released = true
	}
	return s.registerLocked(leaseID, m, owner)
}

func (s *Stack) registerLocked(id string, m Manifest, owner string) *Lease {
	l := &Lease{s: s, id: id, owner: owner, m: cloneManifest(m)}
	s.leases[id] = l
	return l
}

// Leases returns the live leases, ordered by ID.
func (s *Stack) Leases() []*Lease {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*Lease, 0, len(s.leases))
	for _, l := range s.leases {
		out = append(out, l)
	}
	slices.SortFunc(out, func(a, b *Lease) int { return strings.Compare(a.id, b.id) })
	return out
}

// Release ends the lease and garbage collects (§8.7): the lease's layers that
// are neither in head nor in any other live lease are deleted with their
// sidecars; B* layers never are. Nothing is collected when head cannot be
// read or manifest.json is missing. Releasing twice is a no-op.
func (l *Lease) Release() (removed []string, err error) {
	s := l.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if l.released {
		return nil, nil
	}
	l.released = true
	if s.leases[l.id] == l {
		delete(s.leases, l.id)
	}
	head, exists, err := readManifest(s.dir)
	if err != nil {
		return nil, fmt.Errorf("release %s: nothing collected: %w", l.id, err)
	}
	if !exists {
		return nil, nil
	}
	keep := make(map[string]bool)
	for _, r := range head.Layers {
		keep[r.LayerID] = true
	}
	for _, o := range s.leases {
		for _, r := range o.m.Layers {
			keep[r.LayerID] = true
		}
	}
	var errs []error
	for _, r := range l.m.Layers {
		if keep[r.LayerID] || strings.HasPrefix(r.LayerID, "B") {
			continue
		}
		dir := s.LayerDir(r)
		_, statErr := os.Lstat(dir)
		if err := s.deleteLayer(r.LayerID, dir); err != nil {
			errs = append(errs, err)
			continue
		}
		if statErr == nil {
			removed = append(removed, r.LayerID)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return removed, fmt.Errorf("release %s: %w", l.id, err)
	}
	return removed, nil
}

// deleteLayer removes a layer directory and its sidecars.
func (s *Stack) deleteLayer(id, dir string) error {
	var errs []error
	if err := forceRemoveAll(dir); err != nil {
		errs = append(errs, err)
	}
	for _, suf := range []string{digestSuffix, bytesSuffix} {
		if err := os.Remove(filepath.Join(s.dir, metaDirName, id+suf)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("delete layer %s: %w", id, err)
	}
	return nil
}

// ULIDs: 48-bit millisecond time + 80 random bits, monotonic within one
// millisecond, lowercase Crockford base32 (26 characters).
var ulidState struct {
	sync.Mutex
	ms   uint64
	rand [10]byte
}

const crockford = "0123456789abcdefghjkmnpqrstvwxyz"

func newULID() string {
	ulidState.Lock()
	defer ulidState.Unlock()
	ms := uint64(time.Now().UnixMilli())
	if ms > ulidState.ms {
		ulidState.ms = ms
		if _, err := rand.Read(ulidState.rand[:]); err != nil {
			// crypto/rand does not fail on Linux; fall back to the clock.
			ns := uint64(time.Now().UnixNano())
			for i := range ulidState.rand {
				ulidState.rand[i] = byte(ns >> (8 * (i % 8)))
			}
		}
	} else {
		// Same (or an earlier) millisecond: increment the random part.
		i := len(ulidState.rand) - 1
		for ; i >= 0; i-- {
			ulidState.rand[i]++
			if ulidState.rand[i] != 0 {
				break
			}
		}
		if i < 0 {
			ulidState.ms++
		}
	}
	var b [16]byte
	t := ulidState.ms
	for i := 5; i >= 0; i-- {
		b[i] = byte(t)
		t >>= 8
	}
	copy(b[6:], ulidState.rand[:])
	// 128 bits → 26 base32 digits (the first digit holds the top 3 bits).
	var hi, lo uint64
	for i := 0; i < 8; i++ {
		hi = hi<<8 | uint64(b[i])
		lo = lo<<8 | uint64(b[8+i])
	}
	var out [26]byte
	for i := 25; i >= 0; i-- {
		out[i] = crockford[lo&31]
		lo = lo>>5 | hi<<59
		hi >>= 5
	}
	return string(out[:])
}
