package attribution

import (
	"context"
	"os"
	"path/filepath"
	"testing"
)

// TestFuseRenameSaveKeepsGuessedOwners: a save through a temporary file
// and a rename credits only the lines it changed, whether the temporary
// file's release reaches the supervisor before or after the rename. A
// FUSE RELEASE is asynchronous (close(2) does not wait for it), so the
// holder may serve the rename first; the temporary file's write ranges
// then move with it. They cover the whole file, so they must not take
// over the lines the diff keeps, even those a previous rename credited as
// a guess (sed -i: its new line had no range left at its rename). The
// end-to-end TestProvenanceRewrites failed this way under load.
func TestFuseRenameSaveKeepsGuessedOwners(t *testing.T) {
	order := func(releaseFirst bool) string {
		if releaseFirst {
			return "release first"
		}
		return "rename first"
	}
	for _, tc := range [][2]bool{{true, true}, {true, false}, {false, true}, {false, false}} {
		t.Run("sed "+order(tc[0])+", editor "+order(tc[1]), func(t *testing.T) {
			a := testAudit(t, map[string]string{})
			w, tr := testSession(t, a)
			ctx := context.Background()
			notices := func(ns ...FSNotice) { tr.FuseNotices(ctx, w, ns, func([]ActivityRecord) {}) }
			write := func(cmd, p, content string) FSNotice {
				upperWrite(t, w, p, content)
				return FSNotice{Records: []FSRecord{{Command: cmd, Op: "write", Path: p, Length: int64(len(content))}}}
			}
			rename := func(cmd, from, to string) FSNotice {
				if err := os.Rename(filepath.Join(w.Upper, from), filepath.Join(w.Upper, to)); err != nil {
					t.Fatal(err)
				}
				return FSNotice{Records: []FSRecord{{Command: cmd, Op: "rename", Path: from, NewPath: to}}}
			}
			released := func(cmd, p string) FSNotice { return FSNotice{Released: []FSReleased{{Path: p, Command: cmd}}} }
			save := func(cmd, tmp, content string, releaseFirst bool) {
				wn := write(cmd, tmp, content)
				if releaseFirst {
					notices(wn, released(cmd, tmp))
					notices(rename(cmd, tmp, "f.txt"))
				} else {
					notices(wn)
					notices(rename(cmd, tmp, "f.txt"), released(cmd, tmp))
				}
				tr.FuseCommandEnd(ctx, w, cmd)
			}
			notices(write("c1", "f.txt", "one\ntwo\nthree\nfour\nfive\n"), released("c1", "f.txt"))
			tr.FuseCommandEnd(ctx, w, "c1")
			save("c3", "sedX", "one\ntwo\nTHREE\nfour\nfive\n", tc[0])
			if got := cmdsOf(tr.LineOwners(w, "f.txt", []byte("one\ntwo\nTHREE\nfour\nfive\n"))); got != "c1,c1,c3,c1,c1" {
				t.Fatalf("after sed -i: %s", got)
			}
			save("c4", ".f.txt.swp", "one\ntwo\nTHREE\nfour\nFIVE\n", tc[1])
			if got := cmdsOf(tr.LineOwners(w, "f.txt", []byte("one\ntwo\nTHREE\nfour\nFIVE\n"))); got != "c1,c1,c3,c1,c4" {
				t.Fatalf("after the editor save: %s", got)
			}
		})
	}
}
