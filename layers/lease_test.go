package layers

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"testing"
)

func TestLeaseGC(t *testing.T) {
	s := newTestStack(t)
	l1 := publish(t, s, write("a", "1", 0o644)).LayerID
	leaseA, err := s.Acquire("workspace_session:ws-a") // pins [L1, B]
	if err != nil {
		t.Fatal(err)
	}
	l2 := publish(t, s, write("a", "2", 0o644)).LayerID
	leaseB, err := s.Acquire("workspace_session:ws-b") // pins [L2, L1, B]
	if err != nil {
		t.Fatal(err)
	}
	leaseHead, err := s.Acquire("operation:req-1") // pins [L2, L1, B] as well
	if err != nil {
		t.Fatal(err)
	}
	l3 := publish(t, s, write("a", "3", 0o644)).LayerID
	if got := len(s.Leases()); got != 3 {
		t.Fatalf("%d live leases", got)
	}

	// Simulate a squash commit: head no longer contains L1 and L2.
	head := mustHead(t, s)
	squashed := Manifest{SchemaVersion: 1, Version: head.Version + 1,
		Layers: []LayerRef{head.Layers[0], head.Layers[len(head.Layers)-1]}}
	if err := writeManifest(s.Dir(), squashed, nil); err != nil {
		t.Fatal(err)
	}

	steps := []struct {
		name    string
		lease   *Lease
		removed []string
		present []string
		absent  []string
	}{
		{"A: L1 still pinned by B", leaseA, nil, []string{l1, l2, l3, BaseLayerID}, nil},
		{"B: L2, L1 still pinned by the head lease", leaseB, nil, []string{l1, l2, l3, BaseLayerID}, nil},
		{"last: both collected, base never", leaseHead, []string{l2, l1}, []string{l3, BaseLayerID}, []string{l1, l2}},
		{"twice: no-op", leaseHead, nil, []string{l3, BaseLayerID}, nil},
	}
	for _, st := range steps {
		removed, err := st.lease.Release()
		if err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if !slices.Equal(removed, st.removed) {
			t.Errorf("%s: removed %v, want %v", st.name, removed, st.removed)
		}
		for _, id := range st.present {
			if _, err := os.Lstat(filepath.Join(s.Dir(), "layers", id)); err != nil {
				t.Errorf("%s: layer %s gone", st.name, id)
			}
			if _, err := s.StoredDigest(id); err != nil {
				t.Errorf("%s: sidecar of %s gone", st.name, id)
			}
		}
		for _, id := range st.absent {
			if _, err := os.Lstat(filepath.Join(s.Dir(), "layers", id)); !isNotExist(err) {
				t.Errorf("%s: layer %s kept", st.name, id)
			}
			for _, suf := range []string{digestSuffix, bytesSuffix} {
				if _, err := os.Lstat(filepath.Join(s.Dir(), metaDirName, id+suf)); !isNotExist(err) {
					t.Errorf("%s: sidecar %s%s kept", st.name, id, suf)
				}
			}
		}
	}
	if got := len(s.Leases()); got != 0 {
		t.Errorf("%d leases left", got)
	}
	if got := readString(t, s.View(mustHead(t, s)), "a"); got != "3" {
		t.Errorf("head content %q", got)
	}
}

func TestLeaseRestoreAndIDs(t *testing.T) {
	s := newTestStack(t)
	old := publish(t, s, write("a", "1", 0o644))
	m := mustHead(t, s)
	publish(t, s, write("a", "2", 0o644))

	// After a restart the persisted lease is restored and still pins its layers.
	re, err := Open(s.Dir())
	if err != nil {
		t.Fatal(err)
	}
	restored := re.Restore("lease-01hzzzzzzzzzzzzzzzzzzzzzzz", m, "workspace_session:ws-1")
	if restored.ID() != "lease-01hzzzzzzzzzzzzzzzzzzzzzzz" || restored.Owner() != "workspace_session:ws-1" ||
		restored.Manifest().RootHash() != m.RootHash() {
		t.Errorf("restored lease %s %s %+v", restored.ID(), restored.Owner(), restored.Manifest())
	}
	at := re.AcquireAt(m, "export")
	if err := writeManifest(re.Dir(), Manifest{SchemaVersion: 1, Version: 9, Layers: m.Layers[1:]}, nil); err != nil {
		t.Fatal(err)
	}
	if removed, err := at.Release(); err != nil || len(removed) != 0 {
		t.Errorf("release while restored lease pins: %v %v", removed, err)
	}
	if removed, err := restored.Release(); err != nil || !slices.Equal(removed, []string{old.LayerID}) {
		t.Errorf("release restored: %v %v", removed, err)
	}

	idRe := regexp.MustCompile(`^lease-[0-9a-hjkmnp-tv-z]{26}$`)
	var ids []string
	for range 200 {
		l, err := s.Acquire("x")
		if err != nil {
			t.Fatal(err)
		}
		if !idRe.MatchString(l.ID()) {
			t.Fatalf("lease id %q", l.ID())
		}
		ids = append(ids, l.ID())
	}
	if !slices.IsSorted(ids) || len(slices.Compact(slices.Clone(ids))) != len(ids) {
		t.Error("lease IDs are not unique and monotonic")
	}
}

func TestLeaseWithoutManifestCollectsNothing(t *testing.T) {
	s := newTestStack(t)
	id := publish(t, s, write("a", "1", 0o644)).LayerID
	l, err := s.Acquire("x")
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(s.Dir(), manifestName), []byte("garbage"), 0o644)
	if removed, err := l.Release(); err == nil || len(removed) != 0 {
		t.Errorf("release with a broken manifest: %v %v", removed, err)
	}
	if _, err := os.Lstat(filepath.Join(s.Dir(), "layers", id)); err != nil {
		t.Error("layer collected without a valid manifest")
	}
}
