// Package gitindex reads a git index file (.git/index, versions 2, 3 and
// 4) and rewrites the cached stat data of its entries in place, so that git
// inside a session stats files instead of hashing them (issue #28 item 3).
//
// It owns the on-disk format only: the entry table, the stat block of each
// entry, the trailing checksum. It never changes an entry's path, mode,
// object name or flags, never adds or drops an entry or an extension, and
// never runs git. Which stat data to write, and for which entries, is the
// caller's decision (layers.RestatGitIndex).
//
// Format facts it relies on (git's Documentation/gitformat-index.txt):
//
//   - each entry starts with 40 bytes of stat data: ctime sec, ctime nsec,
//     mtime sec, mtime nsec, dev, ino, mode, uid, gid, size, each a
//     big-endian uint32 (values truncated to 32 bits);
//   - the offsets of entries and extensions do not depend on the stat data,
//     so the end-of-index-entry (EOIE) and index-entry-offset-table (IEOT)
//     extensions stay valid when only stat data change;
//   - the file ends with the hash of everything before it (SHA-1, or
//     SHA-256 in a SHA-256 repository), or with zeros when the repository
//     set index.skipHash; a rewrite recomputes it (zeros stay zeros).
//
// A split index (the "link" extension) keeps most entries in a shared
// file: Parse reports it and the caller leaves such an index alone.
package gitindex

import (
	"bytes"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"io"
	"strconv"
)

// Stat is an entry's cached stat data as the index stores it. Mode is not
// part of it: an entry's mode is its object type and permission, which a
// rewrite never changes.
type Stat struct {
	CtimeSec, CtimeNsec uint32
	MtimeSec, MtimeNsec uint32
	Dev, Ino            uint32
	UID, GID            uint32
	Size                uint32
}

// Entry is one index entry.
type Entry struct {
	Path  string
	Mode  uint32 // 0o100644, 0o100755, 0o120000 (symlink), 0o160000 (gitlink), 0o40000 (sparse dir)
	OID   []byte
	Stage int
	// AssumeValid, Extended: flags under which git does not compare stat
	// data the ordinary way (assume-unchanged, skip-worktree,
	// intent-to-add); callers leave such entries alone.
	AssumeValid, Extended bool
	Stat                  Stat
	off                   int // offset of the entry in the file
}

// Regular reports whether the entry is a stage-0 regular file or symlink
// with no flag that changes how git compares it: the entries whose stat
// data a rewrite may set.
func (e *Entry) Regular() bool {
	if e.Stage != 0 || e.AssumeValid || e.Extended {
		return false
	}
	switch e.Mode {
	case 0o100644, 0o100755, 0o120000:
		return true
	}
	return false
}

// Index is a parsed index file. Rewrites change its bytes in place.
type Index struct {
	data     []byte
	Version  uint32
	HashSize int // 20 (SHA-1) or 32 (SHA-256)
	// SkipHash: the trailer is all zeros (index.skipHash).
	SkipHash bool
	// Split: the index has a "link" extension; its entries are a delta
	// against a shared index and must not be rewritten alone.
	Split   bool
	Entries []Entry
}

// ErrFormat wraps every parse failure.
var ErrFormat = errors.New("not a git index")

const statLen = 40

// Parse parses an index file. It detects the hash function from the
// trailing checksum (SHA-1, else SHA-256; an all-zero trailer is accepted
// when the entries parse with one of the two sizes).
func Parse(data []byte) (*Index, error) {
	if len(data) < 12 || string(data[:4]) != "DIRC" {
		return nil, fmt.Errorf("%w: bad signature", ErrFormat)
	}
	v := binary.BigEndian.Uint32(data[4:8])
	if v < 2 || v > 4 {
		return nil, fmt.Errorf("%w: unsupported version %d", ErrFormat, v)
	}
	var errs []error
	for _, hs := range []int{20, 32} {
		if len(data) < 12+hs {
			continue
		}
		trailer := data[len(data)-hs:]
		zero := allZero(trailer)
		if !zero && !bytes.Equal(trailer, sum(hs, data[:len(data)-hs])) {
			errs = append(errs, fmt.Errorf("checksum mismatch for %d-byte hash", hs))
			continue
		}
		x := &Index{data: data, Version: v, HashSize: hs, SkipHash: zero}
		if err := x.parse(); err != nil {
			errs = append(errs, err)
			continue
		}
		return x, nil
	}
	return nil, fmt.Errorf("%w: %w", ErrFormat, errors.Join(errs...))
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

func newHash(hs int) hash.Hash {
	if hs == 32 {
		return sha256.New()
	}
	return sha1.New()
}

func sum(hs int, b []byte) []byte {
	h := newHash(hs)
	h.Write(b)
	return h.Sum(nil)
}

func (x *Index) parse() error {
	d := x.data
	end := len(d) - x.HashSize
	n := binary.BigEndian.Uint32(d[8:12])
	if uint64(n) > uint64(end)/uint64(statLen) {
		return fmt.Errorf("entry count %d exceeds the file", n)
	}
	x.Entries = make([]Entry, 0, n)
	off := 12
	prev := ""
	for i := uint32(0); i < n; i++ {
		start := off
		fixed := statLen + x.HashSize + 2
		if off+fixed > end {
			return fmt.Errorf("entry %d truncated", i)
		}
		e := Entry{off: start}
		be := binary.BigEndian
		s := d[off:]
		e.Stat = Stat{CtimeSec: be.Uint32(s[0:]), CtimeNsec: be.Uint32(s[4:]), MtimeSec: be.Uint32(s[8:]), MtimeNsec: be.Uint32(s[12:]),
			Dev: be.Uint32(s[16:]), Ino: be.Uint32(s[20:]), UID: be.Uint32(s[28:]), GID: be.Uint32(s[32:]), Size: be.Uint32(s[36:])}
		e.Mode = be.Uint32(s[24:])
		e.OID = d[off+statLen : off+statLen+x.HashSize]
		flags := be.Uint16(d[off+statLen+x.HashSize:])
		off += fixed
		e.AssumeValid = flags&0x8000 != 0
		e.Stage = int(flags>>12) & 3
		if flags&0x4000 != 0 {
			if x.Version < 3 || off+2 > end {
				return fmt.Errorf("entry %d: extended flags in version %d", i, x.Version)
			}
			e.Extended = be.Uint16(d[off:]) != 0
			off += 2
		}
		if x.Version == 4 {
			strip, k := decodeVarint(d[off:end])
			if k <= 0 || strip > uint64(len(prev)) {
				return fmt.Errorf("entry %d: bad path prefix", i)
			}
			off += k
			nul := bytes.IndexByte(d[off:end], 0)
			if nul < 0 {
				return fmt.Errorf("entry %d: unterminated path", i)
			}
			e.Path = prev[:len(prev)-int(strip)] + string(d[off:off+nul])
			off += nul + 1
		} else {
			nul := bytes.IndexByte(d[off:end], 0)
			if nul < 0 {
				return fmt.Errorf("entry %d: unterminated path", i)
			}
			e.Path = string(d[off : off+nul])
			// 1-8 NULs pad the entry to a multiple of 8 bytes.
			off = start + ((off+nul-start)+8)&^7
			if off > end {
				return fmt.Errorf("entry %d: padding past the end", i)
			}
		}
		prev = e.Path
		x.Entries = append(x.Entries, e)
	}
	for off < end {
		if off+8 > end {
			return errors.New("truncated extension header")
		}
		sig := string(d[off : off+4])
		size := binary.BigEndian.Uint32(d[off+4:])
		if uint64(size) > uint64(end-off-8) {
			return fmt.Errorf("extension %q overruns the file", sig)
		}
		if sig == "link" {
			x.Split = true
		}
		off += 8 + int(size)
	}
	return nil
}

// SetStat replaces entry i's stat data (its mode stays).
func (x *Index) SetStat(i int, s Stat) {
	e := &x.Entries[i]
	e.Stat = s
	b := x.data[e.off:]
	be := binary.BigEndian
	be.PutUint32(b[0:], s.CtimeSec)
	be.PutUint32(b[4:], s.CtimeNsec)
	be.PutUint32(b[8:], s.MtimeSec)
	be.PutUint32(b[12:], s.MtimeNsec)
	be.PutUint32(b[16:], s.Dev)
	be.PutUint32(b[20:], s.Ino)
	be.PutUint32(b[28:], s.UID)
	be.PutUint32(b[32:], s.GID)
	be.PutUint32(b[36:], s.Size)
}

// Bytes returns the index file with its trailing checksum recomputed. The
// slice is the Index's own buffer.
func (x *Index) Bytes() []byte {
	end := len(x.data) - x.HashSize
	if !x.SkipHash {
		copy(x.data[end:], sum(x.HashSize, x.data[:end]))
	}
	return x.data
}

// BlobOID is the object name git gives a blob of size bytes read from r
// (raw content: no clean filter or end-of-line conversion is applied).
func BlobOID(r io.Reader, size int64, hashSize int) ([]byte, error) {
	h := newHash(hashSize)
	h.Write([]byte("blob " + strconv.FormatInt(size, 10) + "\x00"))
	n, err := io.Copy(h, r)
	if err != nil {
		return nil, err
	}
	if n != size {
		return nil, fmt.Errorf("blob changed size while hashed: %d bytes, want %d", n, size)
	}
	return h.Sum(nil), nil
}

// decodeVarint is git's offset varint (varint.c): big-endian groups of 7
// bits, each continuation adding one. It returns the value and the bytes
// read, or k <= 0 on a truncated or overflowing number.
func decodeVarint(b []byte) (v uint64, k int) {
	if len(b) == 0 {
		return 0, 0
	}
	c := b[0]
	v = uint64(c & 127)
	k = 1
	for c&128 != 0 {
		v++
		if v == 0 || v>>57 != 0 || k >= len(b) {
			return 0, -1
		}
		c = b[k]
		k++
		v = v<<7 + uint64(c&127)
	}
	return v, k
}
