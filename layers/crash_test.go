package layers

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestPublishCrashSafety(t *testing.T) {
	// stepStagingWrite interrupts a staging worker in the middle of the
	// layer's files: the whole publish must fail (or crash) with the old head.
	steps := []publishStep{stepStagingWrite, stepAfterStaging, stepAfterRename, stepAfterDigest, stepBeforeManifestRename, stepAfterManifestRename}
	actions := []struct {
		name string
		act  hookAction
	}{{"fail", hookFail}, {"crash", hookCrash}}
	for _, step := range steps {
		for _, a := range actions {
			t.Run(step.String()+"/"+a.name, func(t *testing.T) {
				s := newTestStack(t)
				publish(t, s, write("README.md", "v2\n", 0o644))
				prev := mustHead(t, s)

				// A lease persisted by a session on a layer that is no longer in head.
				leased := LayerRef{LayerID: "L000002-0000beef", Path: "layers/L000002-0000beef"}
				writeFile(t, filepath.Join(s.Dir(), "layers", leased.LayerID, "f"), "leased", 0o644)
				writeFile(t, filepath.Join(s.Dir(), metaDirName, leased.LayerID+digestSuffix), "00", 0o644)
				// Unknown B* directories are never swept.
				mkdir(t, filepath.Join(s.Dir(), "layers", "B000002-other"), 0o755)

				s.hook = func(p publishStep) hookAction {
					if p == step {
						return a.act
					}
					return hookContinue
				}
				_, err := s.Publish(context.Background(), []Change{write("README.md", "v3\n", 0o644), write("new/f", "n", 0o644)})
				if err == nil {
					t.Fatal("interrupted publish reported success")
				}
				s.hook = nil

				// After a restart: Open + Head give the previous or the next manifest.
				re, err := Open(s.Dir())
				if err != nil {
					t.Fatalf("Open after interruption: %v", err)
				}
				head := mustHead(t, re)
				committed := step == stepAfterManifestRename
				switch {
				case committed:
					if head.Version != prev.Version+1 || len(head.Layers) != len(prev.Layers)+1 ||
						head.Layers[1:][0] != prev.Layers[0] {
						t.Fatalf("head %+v, want the next manifest after %+v", head, prev)
					}
				default:
					if head.Version != prev.Version || head.RootHash() != prev.RootHash() {
						t.Fatalf("head %+v, want the previous manifest %+v", head, prev)
					}
				}
				checkManifestLayers(t, re, head)
				want := "v2\n"
				if committed {
					want = "v3\n"
				}
				if got := readString(t, re.View(head), "README.md"); got != want {
					t.Errorf("README.md = %q, want %q", got, want)
				}

				leftovers := leftoverIDs(t, re, head, leased.LayerID)
				if a.act == hookFail && len(leftovers) > 0 {
					t.Errorf("failed publish left %v", leftovers)
				}
				if a.act == hookCrash && !committed && step > stepAfterStaging && len(leftovers) != 1 {
					t.Errorf("crash leftovers %v, want the orphan layer", leftovers)
				}
				staging := names(t, filepath.Join(s.Dir(), "staging"))
				if a.act == hookCrash && step <= stepAfterStaging && len(staging) != 1 {
					t.Errorf("crash after staging: staging = %v", staging)
				}
				if a.act == hookFail && len(staging) != 0 {
					t.Errorf("failed publish left staging %v", staging)
				}
				if a.act == hookCrash && step == stepBeforeManifestRename && !hasTemp(t, s.Dir()) {
					t.Error("crash before manifest rename left no temp manifest")
				}

				// The boot sweep removes the leftovers and nothing else.
				res, err := re.Sweep([][]LayerRef{{leased, {LayerID: BaseLayerID, Path: "layers/" + BaseLayerID}}})
				if err != nil || res.SkippedReason != "" {
					t.Fatalf("Sweep: %+v %v", res, err)
				}
				if !equalStrings(res.RemovedLayerIDs, leftovers) && !(len(res.RemovedLayerIDs) == 0 && len(leftovers) == 0) {
					t.Errorf("swept %v, want %v", res.RemovedLayerIDs, leftovers)
				}
				if got := names(t, filepath.Join(s.Dir(), "staging")); len(got) != 0 {
					t.Errorf("staging after sweep %v", got)
				}
				if hasTemp(t, s.Dir()) {
					t.Error("temp files after sweep")
				}
				wantLayers := append(sortedIDs(head), "B000002-other", leased.LayerID)
				slicesSort(wantLayers)
				if got := names(t, filepath.Join(s.Dir(), "layers")); !equalStrings(got, wantLayers) {
					t.Errorf("layers/ after sweep = %v, want %v", got, wantLayers)
				}
				for _, n := range names(t, filepath.Join(s.Dir(), metaDirName)) {
					id := strings.TrimSuffix(strings.TrimSuffix(n, digestSuffix), bytesSuffix)
					if !contains(head.LayerIDs(), id) && id != leased.LayerID {
						t.Errorf("sidecar %s survived the sweep", n)
					}
				}
				if _, err := re.StoredDigest(leased.LayerID); err != nil {
					t.Errorf("leased sidecar removed: %v", err)
				}
				checkManifestLayers(t, re, mustHead(t, re))

				// The stack keeps working.
				if res := publish(t, re, write("after", "x", 0o644)); res.NoOp {
					t.Error("publish after recovery was a no-op")
				}
			})
		}
	}
}

// checkManifestLayers: every layer of m exists, with its digest sidecar.
func checkManifestLayers(t *testing.T, s *Stack, m Manifest) {
	t.Helper()
	for _, l := range m.Layers {
		if fi, err := os.Lstat(s.LayerDir(l)); err != nil || !fi.IsDir() {
			t.Errorf("manifest layer %s missing: %v", l.LayerID, err)
		}
		if _, err := s.StoredDigest(l.LayerID); err != nil {
			t.Errorf("manifest layer %s: %v", l.LayerID, err)
		}
	}
}

// leftoverIDs lists layer IDs present in layers/ or as sidecars that are
// neither in m nor the given extra ID (B* excluded).
func leftoverIDs(t *testing.T, s *Stack, m Manifest, extra string) []string {
	t.Helper()
	seen := map[string]bool{}
	for _, n := range names(t, filepath.Join(s.Dir(), "layers")) {
		seen[n] = true
	}
	for _, n := range names(t, filepath.Join(s.Dir(), metaDirName)) {
		if isTempName(n) || n == FailNextPublishMarker {
			continue
		}
		seen[strings.TrimSuffix(strings.TrimSuffix(n, digestSuffix), bytesSuffix)] = true
	}
	var out []string
	for id := range seen {
		if !contains(m.LayerIDs(), id) && id != extra && !strings.HasPrefix(id, "B") {
			out = append(out, id)
		}
	}
	slicesSort(out)
	return out
}

func hasTemp(t *testing.T, dir string) bool {
	for _, d := range []string{dir, filepath.Join(dir, metaDirName)} {
		for _, n := range names(t, d) {
			if isTempName(n) {
				return true
			}
		}
	}
	return false
}

func TestSweepFailClosed(t *testing.T) {
	tests := []struct {
		name     string
		manifest *string // nil = remove manifest.json
		reason   string
	}{
		{"unparsable", ptr(`{"schema_version":1,"version":`), SweepSkipManifestUnreadable},
		{"newer_schema", ptr(`{"schema_version":2,"version":5,"layers":[{"layer_id":"B000001-base","path":"layers/B000001-base"}]}`), SweepSkipManifestUnreadable},
		{"missing", nil, SweepSkipManifestMissing},
		{"version_zero", ptr(`{"schema_version":1,"version":0,"layers":[{"layer_id":"B000001-base","path":"layers/B000001-base"}]}`), SweepSkipNoVersion},
		{"no_layers", ptr(`{"schema_version":1,"version":3,"layers":[]}`), SweepSkipNoLayers},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newTestStack(t)
			res := publish(t, s, write("x", "x", 0o644))
			mkdir(t, filepath.Join(s.Dir(), "staging", "L000009-00000000.staging"), 0o755)
			mp := filepath.Join(s.Dir(), manifestName)
			if tc.manifest == nil {
				os.Remove(mp)
			} else {
				os.WriteFile(mp, []byte(*tc.manifest), 0o644)
			}
			got, err := s.Sweep(nil)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(got.SkippedReason, tc.reason) || len(got.RemovedLayerIDs) != 0 || got.RemovedStagingEntries != 0 {
				t.Errorf("sweep %+v, want skipped with %s", got, tc.reason)
			}
			for _, p := range []string{"staging/L000009-00000000.staging", "layers/" + res.LayerID, metaDirName + "/" + res.LayerID + digestSuffix} {
				if _, err := os.Lstat(filepath.Join(s.Dir(), p)); err != nil {
					t.Errorf("%s touched by a skipped sweep: %v", p, err)
				}
			}
		})
	}
}

func TestSweepKeepsLiveLeases(t *testing.T) {
	s := newTestStack(t)
	publish(t, s, write("x", "1", 0o644))
	lease, err := s.Acquire("workspace_session:ws-1")
	if err != nil {
		t.Fatal(err)
	}
	pinned := lease.Manifest().Layers[0]
	// Simulate a squash that replaced the pinned layer in head.
	if err := writeManifest(s.Dir(), Manifest{SchemaVersion: 1, Version: 3, Layers: lease.Manifest().Layers[1:]}, nil); err != nil {
		t.Fatal(err)
	}
	if res, err := s.Sweep(nil); err != nil || len(res.RemovedLayerIDs) != 0 {
		t.Fatalf("sweep removed a live lease's layer: %+v %v", res, err)
	}
	removed, err := lease.Release()
	if err != nil || !equalStrings(removed, []string{pinned.LayerID}) {
		t.Fatalf("Release = %v, %v", removed, err)
	}
}

func ptr(s string) *string { return &s }
