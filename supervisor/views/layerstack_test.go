package views

import (
	"context"
	"errors"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
	"github.com/ephemeral-ai-lab/sandbox/layers"
)

func TestViewLeaseIndex(t *testing.T) {
	order := []string{"L000003-cccccccc", "L000002-bbbbbbbb", "B000001-base"}
	leases := []LeaseView{
		{Owner: "workspace-session:ws-a", Layers: []string{"L000003-cccccccc", "L000002-bbbbbbbb", "B000001-base"}},
		{Owner: "workspace-session:ws-b", Layers: []string{"L000002-bbbbbbbb", "B000001-base"}},
		{Owner: "export", Layers: []string{"L000003-cccccccc", "L000002-bbbbbbbb", "B000001-base"}},
		{Owner: "workspace-session:ws-d", Layers: []string{"B000001-base"}},
		{Owner: "workspace-session:ws-c", Layers: []string{"B000001-base"}},
		{Owner: "workspace-session:ws-empty", Layers: nil},
	}
	leased, booked := leaseIndex(order, leases)
	wantLeased := map[string][]string{
		"L000003-cccccccc": {"ws-a"}, // the export lease is not a workspace
		"L000002-bbbbbbbb": {"ws-b"},
		"B000001-base":     {"ws-c", "ws-d"},
	}
	if !reflect.DeepEqual(leased, wantLeased) {
		t.Errorf("leased_by_workspaces = %v, want %v", leased, wantLeased)
	}
	wantBooked := map[string][]string{
		"L000002-bbbbbbbb": {"L000003-cccccccc"},                     // deduplicated over ws-a and export
		"B000001-base":     {"L000003-cccccccc", "L000002-bbbbbbbb"}, // newest first
	}
	if !reflect.DeepEqual(booked, wantBooked) {
		t.Errorf("booked_by = %v, want %v", booked, wantBooked)
	}

	// After a squash the head no longer holds the leased L layers; they rank
	// after the head (the order summarizeStack builds) and still book the base.
	order = []string{"S000004-dddddddd", "B000001-base", "L000003-cccccccc", "L000002-bbbbbbbb"}
	leases = []LeaseView{
		{Owner: "workspace-session:ws-a", Layers: []string{"L000003-cccccccc", "L000002-bbbbbbbb", "B000001-base"}},
		{Owner: "workspace-session:ws-new", Layers: []string{"S000004-dddddddd", "B000001-base"}},
	}
	leased, booked = leaseIndex(order, leases)
	if got := booked["B000001-base"]; !reflect.DeepEqual(got, []string{"S000004-dddddddd", "L000003-cccccccc"}) {
		t.Errorf("booked_by of the base after squash = %v", got)
	}
	if got := booked["L000002-bbbbbbbb"]; !reflect.DeepEqual(got, []string{"L000003-cccccccc"}) {
		t.Errorf("booked_by of a retained layer = %v", got)
	}
	if len(booked["S000004-dddddddd"]) != 0 || !reflect.DeepEqual(leased["S000004-dddddddd"], []string{"ws-new"}) {
		t.Errorf("squashed head layer: leased %v booked %v", leased["S000004-dddddddd"], booked["S000004-dddddddd"])
	}
}

func TestViewSummarizeStack(t *testing.T) {
	ws := t.TempDir()
	writeTree(t, ws, map[string]string{"a.txt": "hello\n", "b/c.txt": "world\n"})
	st, _, err := layers.Create(context.Background(), filepath.Join(t.TempDir(), "layerstack"), ws, layers.SnapshotOptions{})
	if err != nil {
		t.Fatal(err)
	}
	a, _ := st.Acquire("workspace-session:ws-a")
	b, _ := st.Acquire("workspace-session:ws-b")
	defer a.Release()
	defer b.Release()
	sum, err := SummarizeStack(st, 1024, 64)
	if err != nil {
		t.Fatal(err)
	}
	if len(sum.Layers) != 1 || sum.Layers[0].LayerID != layers.BaseLayerID || sum.Layers[0].Bytes != 12 || sum.Layers[0].Estimated {
		t.Fatalf("layers: %+v", sum.Layers)
	}
	if !reflect.DeepEqual(sum.Layers[0].LeasedBy, []string{"ws-a", "ws-b"}) || len(sum.Layers[0].BookedBy) != 0 {
		t.Fatalf("lease columns: %+v", sum.Layers[0])
	}
	if len(sum.Leases) != 2 || sum.TotalBytes != 12 || sum.StorageLogical < 12 || sum.StagingEntries != 0 {
		t.Fatalf("summary: %+v", sum)
	}
	sum, _ = SummarizeStack(st, 1, 64)
	if !sum.Estimated || !sum.Layers[0].Estimated {
		t.Fatalf("a walk cut by the node bound is not marked estimated: %+v", sum.Layers[0])
	}
}

func TestViewLayerstackLayerAndWorkspace(t *testing.T) {
	ws := t.TempDir()
	writeTree(t, ws, map[string]string{"a.txt": "hello\n"})
	st, _, err := layers.Create(context.Background(), filepath.Join(t.TempDir(), "layerstack"), ws, layers.SnapshotOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"missing", ".", "..", "../layers", "a/b"} {
		_, err := LayerstackLayer(st, id, 10, 64)
		var ce *catalog.Error
		if !errors.As(err, &ce) || ce.Kind != catalog.NotFound {
			t.Errorf("layer %q: %v, want not_found", id, err)
		}
	}
	out, err := LayerstackLayer(st, layers.BaseLayerID, 10, 64)
	if err != nil || !reflect.DeepEqual(out["entries"], []layerEntry{{"a.txt", "write"}}) || out["truncated"] != false {
		t.Fatalf("base layer: %v %v", out, err)
	}

	a, _ := st.Acquire("workspace-session:ws-a")
	b, _ := st.Acquire("workspace-session:ws-b")
	defer a.Release()
	defer b.Release()
	upper := t.TempDir()
	writeTree(t, upper, map[string]string{"new.txt": "1234"})
	w := LayerstackWorkspace(st, "ws-a", a.Manifest().Layers, upper, 1024, 64)
	mounts := w["mounts"].([]map[string]any)
	if len(mounts) != 1 || !reflect.DeepEqual(mounts[0]["shared_with"], []string{"ws-b"}) || w["upper_bytes"] != int64(4) || w["estimated"] != false {
		t.Fatalf("workspace view: %v", w)
	}
}
