package views

// The layerstack view (§8.5): layer sizes from bounded walks, the lease
// columns, one layer's changes and one workspace's mounts.

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
	"github.com/ephemeral-ai-lab/sandbox/layers"
	"github.com/ephemeral-ai-lab/sandbox/supervisor/resources"
)

const wsOwnerPrefix = "workspace-session:"

// LeaseView is what the layerstack computations need of one lease.
type LeaseView struct {
	Owner  string
	Layers []string // newest first
}

// leaseIndex computes §8.5's per-layer lease columns: leasedBy[layer] are
// the workspace sessions whose lease's newest layer is layer; bookedBy[layer]
// are the newest layers of the leases that contain layer below their
// newest one (the leased layers above it that pin it). order ranks layer
// IDs newest first; booked_by lists follow it.
func leaseIndex(order []string, leases []LeaseView) (leasedBy, bookedBy map[string][]string) {
	leasedBy, bookedBy = map[string][]string{}, map[string][]string{}
	rank := map[string]int{}
	for i, id := range order {
		rank[id] = i
	}
	seen := map[[2]string]bool{}
	for _, l := range leases {
		if len(l.Layers) == 0 {
			continue
		}
		tip := l.Layers[0]
		if ws, ok := strings.CutPrefix(l.Owner, wsOwnerPrefix); ok {
			leasedBy[tip] = append(leasedBy[tip], ws)
		}
		for _, below := range l.Layers[1:] {
			if below == tip || seen[[2]string{below, tip}] {
				continue
			}
			seen[[2]string{below, tip}] = true
			bookedBy[below] = append(bookedBy[below], tip)
		}
	}
	for _, ids := range leasedBy {
		sort.Strings(ids)
	}
	for _, ids := range bookedBy {
		sort.Slice(ids, func(i, j int) bool {
			ri, iok := rank[ids[i]]
			rj, jok := rank[ids[j]]
			switch {
			case iok && jok:
				return ri < rj
			case iok != jok:
				return iok
			}
			return ids[i] > ids[j]
		})
	}
	return leasedBy, bookedBy
}

func leaseViews(st *layers.Stack) []LeaseView {
	ls := st.Leases()
	out := make([]LeaseView, 0, len(ls))
	for _, l := range ls {
		out = append(out, LeaseView{Owner: l.Owner(), Layers: l.Manifest().LayerIDs()})
	}
	return out
}

// LayerRow is one layer of the layerstack view.
type LayerRow struct {
	LayerID        string   `json:"layer_id"`
	Bytes          int64    `json:"bytes"`
	AllocatedBytes int64    `json:"allocated_bytes"`
	LeasedBy       []string `json:"leased_by_workspaces"`
	BookedBy       []string `json:"booked_by"`
	// Estimated: a bound of the size walk was hit, so the sizes are lower
	// bounds (bytes is exact when it comes from the .bytes sidecar).
	Estimated bool   `json:"estimated"`
	Source    string `json:"bytes_source"` // "sidecar" or "walk"
}

// StackSummary is the default layerstack view, snapshot's stack block and
// the sampler's stack sample.
type StackSummary struct {
	Manifest         layers.Manifest
	Leases           []LeaseView
	Layers           []LayerRow // head, newest first
	Retained         []LayerRow // on disk and leased, not in head
	TotalBytes       int64
	TotalAllocated   int64
	StorageLogical   int64
	StorageAllocated int64
	StagingEntries   int
	Estimated        bool
}

// SummarizeStack sizes every layer with a bounded walk (at most maxNodes
// nodes per layer) and attaches the lease columns.
func SummarizeStack(st *layers.Stack, maxNodes, maxDepth int) (StackSummary, error) {
	var sum StackSummary
	m, err := st.Head()
	if err != nil {
		return sum, err
	}
	sum.Manifest = m
	sum.Leases = leaseViews(st)
	order := m.LayerIDs()
	inOrder := map[string]bool{}
	for _, id := range order {
		inOrder[id] = true
	}
	for _, l := range sum.Leases {
		for _, id := range l.Layers {
			if !inOrder[id] {
				inOrder[id] = true
				order = append(order, id)
			}
		}
	}
	leasedBy, bookedBy := leaseIndex(order, sum.Leases)
	sized := map[string]bool{}
	row := func(id string) LayerRow {
		r := LayerRow{LayerID: id, LeasedBy: NonNil(leasedBy[id]), BookedBy: NonNil(bookedBy[id]), Source: "walk"}
		w, err := boundedWalk(filepath.Join(st.Dir(), "layers", id), maxNodes, maxDepth)
		sized[id] = true
		r.Bytes, r.AllocatedBytes, r.Estimated = w.Logical, w.Allocated, w.Truncated || err != nil
		if n, err := st.StoredBytes(id); err == nil {
			r.Bytes, r.Source = n, "sidecar"
		}
		sum.StorageLogical += r.Bytes
		sum.StorageAllocated += r.AllocatedBytes
		sum.Estimated = sum.Estimated || r.Estimated
		return r
	}
	sum.Layers = make([]LayerRow, 0, len(m.Layers))
	for _, l := range m.Layers {
		r := row(l.LayerID)
		sum.TotalBytes += r.Bytes
		sum.TotalAllocated += r.AllocatedBytes
		sum.Layers = append(sum.Layers, r)
	}
	for _, id := range order[len(m.Layers):] {
		sum.Retained = append(sum.Retained, row(id))
	}
	// Layer directories held by nothing (garbage the next sweep removes) and
	// staging entries count toward storage too.
	if names, err := resources.ReadNames(filepath.Join(st.Dir(), "layers"), 4096); err == nil {
		for _, id := range names {
			if sized[id] {
				continue
			}
			w, err := boundedWalk(filepath.Join(st.Dir(), "layers", id), maxNodes, maxDepth)
			sum.StorageLogical += w.Logical
			sum.StorageAllocated += w.Allocated
			sum.Estimated = sum.Estimated || w.Truncated || err != nil
		}
	}
	if names, err := resources.ReadNames(filepath.Join(st.Dir(), "staging"), 4096); err == nil {
		sum.StagingEntries = len(names)
		for _, n := range names {
			w, err := boundedWalk(filepath.Join(st.Dir(), "staging", n), maxNodes, maxDepth)
			sum.StorageLogical += w.Logical
			sum.StorageAllocated += w.Allocated
			sum.Estimated = sum.Estimated || w.Truncated || err != nil
		}
	}
	return sum, nil
}

// LayerstackLayer is the layerstack view of one layer of st: its changes,
// at most limit of them.
func LayerstackLayer(st *layers.Stack, id string, limit, depth int) (map[string]any, error) {
	notFound := catalog.Errorf(catalog.NotFound, "layer not found: %s", id).With("layer_id", id)
	if id == "." || id == ".." || strings.ContainsAny(id, "/") {
		return nil, notFound
	}
	dir := filepath.Join(st.Dir(), "layers", id)
	if fi, err := os.Lstat(dir); err != nil || !fi.IsDir() {
		return nil, notFound
	}
	entries, truncated, err := layerEntries(dir, limit, depth)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, notFound // collected meanwhile
		}
		return nil, err
	}
	return map[string]any{"view": "layerstack", "layer_id": id, "entries": entries, "truncated": truncated}, nil
}

// LayerstackWorkspace is the layerstack view of one workspace session: the
// layers of its lease (newest first), which other sessions share each, and
// the size of its upper directory.
func LayerstackWorkspace(st *layers.Stack, id string, lease []layers.LayerRef, upper string, nodes, depth int) map[string]any {
	users := map[string][]string{} // layer → workspace sessions leasing it
	for _, l := range leaseViews(st) {
		ws, ok := strings.CutPrefix(l.Owner, wsOwnerPrefix)
		if !ok || ws == id {
			continue
		}
		for _, lid := range l.Layers {
			users[lid] = append(users[lid], ws)
		}
	}
	mounts := make([]map[string]any, 0, len(lease))
	for _, l := range lease {
		shared := NonNil(users[l.LayerID])
		sort.Strings(shared)
		mounts = append(mounts, map[string]any{"layer_id": l.LayerID, "shared_with": shared})
	}
	w, err := boundedWalk(upper, nodes, depth)
	return map[string]any{"view": "layerstack", "workspace": id, "mounts": mounts, "upper_bytes": w.Logical,
		"estimated": w.Truncated || err != nil}
}

// Layerstack is the default layerstack view of st: every layer of head
// sized, with its lease columns, and the layers leases retain beyond head.
func Layerstack(st *layers.Stack, nodes, depth int) (map[string]any, error) {
	sum, err := SummarizeStack(st, nodes, depth)
	if err != nil {
		return nil, err
	}
	out := map[string]any{
		"view": "layerstack", "manifest_version": sum.Manifest.Version, "root_hash": sum.Manifest.RootHash(),
		"active_lease_count": len(sum.Leases), "total_bytes": sum.TotalBytes, "total_allocated_bytes": sum.TotalAllocated,
		"storage_logical_bytes": sum.StorageLogical, "storage_allocated_bytes": sum.StorageAllocated,
		"staging_entry_count": sum.StagingEntries, "layers": sum.Layers, "estimated": sum.Estimated,
	}
	if len(sum.Retained) > 0 {
		out["retained_layers"] = sum.Retained
	}
	return out, nil
}
