package attribution

// Checkpoint packs. One checkpoint pass stores the checkpoints of every
// file it visits in one file, pack-<unix nanoseconds>.ck, instead of a
// .json and a .txt per file (each written through a temporary name and a
// rename): a command that wrote 1,000 new files cost 2,000 creates and
// 2,000 renames at its end, about 120 ms on this host, then as many
// unlinks at the session's end, and a fork linked 2,000 files.
//
// A pack is a sequence of records: the lengths of the meta (ckFile, JSON)
// and of the content as two little-endian uint64, then both. An index
// entry names its pack and record offset. Packs are never written in
// place (a fork links them into its own directory); a pack that no entry
// of the saved index names is removed after that save (gcPacks), so a
// crash never loses a checkpoint the saved index still names.

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

const (
	packPrefix = "pack-"
	packSuffix = ".ck"
	// packFlushAt bounds the bytes a pass holds in memory before it writes
	// the pack and starts another.
	packFlushAt = 8 << 20
)

// packWriter collects one pass's checkpoint records.
type packWriter struct {
	dir   string
	name  string // of the pack being filled; "" before the first record
	buf   bytes.Buffer
	paths []string // whose entries point into the pack being filled
}

// add appends a record and returns the pack and offset it will have.
func (w *packWriter) add(p string, meta, content []byte) (pack string, off int64) {
	if w.name == "" {
		// The time orders packs for loadPacks (a clock that went back only
		// matters when index.json is lost); a name in use is never reused.
		for ts := time.Now().UnixNano(); ; ts++ {
			w.name = fmt.Sprintf("%s%019d%s", packPrefix, ts, packSuffix)
			if _, err := os.Lstat(filepath.Join(w.dir, w.name)); errors.Is(err, fs.ErrNotExist) {
				break
			}
		}
	}
	off = int64(w.buf.Len())
	var hdr [16]byte
	binary.LittleEndian.PutUint64(hdr[:8], uint64(len(meta)))
	binary.LittleEndian.PutUint64(hdr[8:], uint64(len(content)))
	w.buf.Write(hdr[:])
	w.buf.Write(meta)
	w.buf.Write(content)
	w.paths = append(w.paths, p)
	return w.name, off
}

// flush writes the pack being filled. On failure it returns the paths
// whose entries point into it: they have no checkpoint.
func (w *packWriter) flush() (lost []string, err error) {
	if w.name == "" {
		return nil, nil
	}
	err = writeFileAtomic(filepath.Join(w.dir, w.name), w.buf.Bytes())
	if err != nil {
		lost = w.paths
	}
	w.name, w.paths = "", nil
	w.buf.Reset()
	return lost, err
}

// readRecord reads the record at off of r (size bytes long): its meta and
// content.
func readRecord(r io.ReaderAt, size, off int64) (ckFile, []byte, error) {
	var f ckFile
	var hdr [16]byte
	if off < 0 || off+16 > size {
		return f, nil, errors.New("checkpoint record: beyond the pack")
	}
	if _, err := r.ReadAt(hdr[:], off); err != nil {
		return f, nil, err
	}
	ml, cl := binary.LittleEndian.Uint64(hdr[:8]), binary.LittleEndian.Uint64(hdr[8:])
	// A damaged header must not make a huge allocation.
	if cl > TextMax || ml > uint64(size) || int64(ml+cl) > size-off-16 {
		return f, nil, errors.New("checkpoint record: bad lengths")
	}
	b := make([]byte, ml+cl)
	if _, err := r.ReadAt(b, off+16); err != nil {
		return f, nil, err
	}
	if err := json.Unmarshal(b[:ml], &f); err != nil {
		return f, nil, err
	}
	return f, b[ml:], nil
}

// readPacked reads the record of e from its pack in dir.
func readPacked(dir string, e *ckEntry) (ckFile, []byte, error) {
	fh, err := os.Open(filepath.Join(dir, e.Pack))
	if err != nil {
		return ckFile{}, nil, err
	}
	defer fh.Close()
	st, err := fh.Stat()
	if err != nil {
		return ckFile{}, nil, err
	}
	return readRecord(fh, st.Size(), e.Off)
}

// isPackName: name is a checkpoint pack's file name.
func isPackName(name string) bool {
	return strings.HasPrefix(name, packPrefix) && strings.HasSuffix(name, packSuffix) && !strings.Contains(name, "/")
}

// gcPacks removes the packs of dir that no entry of idx names (idx was
// just saved as dir's index).
func gcPacks(dir string, idx *ckIndex) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	used := map[string]bool{}
	for _, e := range idx.Files {
		if e.Pack != "" {
			used[e.Pack] = true
		}
	}
	for _, de := range ents {
		if n := de.Name(); isPackName(n) && !used[n] {
			_ = os.Remove(filepath.Join(dir, n))
		}
	}
}

// loadPacks adds the records of dir's packs to idx, oldest pack first so
// the newest record of a path wins (an index rebuilt after index.json was
// lost; see loadIndex).
func loadPacks(dir string, names []string, idx *ckIndex) {
	slices.Sort(names) // names carry a fixed-width timestamp
	for _, n := range names {
		b, err := os.ReadFile(filepath.Join(dir, n))
		if err != nil {
			continue
		}
		r := bytes.NewReader(b)
		for off := int64(0); off < int64(len(b)); {
			f, content, err := readRecord(r, int64(len(b)), off)
			if err != nil || ContentDigest(content) != f.Digest {
				break
			}
			idx.Files[f.Path] = &ckEntry{State: ckStored, Pack: n, Off: off, Digest: f.Digest, Bytes: int64(len(content))}
			off += 16 + recordLen(b, off)
		}
	}
}

// recordLen is the meta and content length of the record at off of b
// (readRecord read it, so both fit).
func recordLen(b []byte, off int64) int64 {
	return int64(binary.LittleEndian.Uint64(b[off:off+8]) + binary.LittleEndian.Uint64(b[off+8:off+16]))
}
