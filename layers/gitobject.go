package layers

import (
	"bytes"
	"compress/zlib"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"strconv"
	"strings"
)

// Verification of the git objects a session publishes (contract A8): an
// object's name is its content's hash, so a name that does not match is a
// corrupt or forged object and is never published.

// errBadObject is wrapped by every verification failure.
var errBadObject = errors.New("invalid git object")

// verifyLooseObject checks that data, a zlib stream, inflates to
// "<type> <len>\x00<body>" whose hash is name (40 hex: SHA-1, 64: SHA-256).
func verifyLooseObject(name string, data []byte) error {
	h := hashFor(len(name))
	if h == nil {
		return fmt.Errorf("%w: name %q is not an object id", errBadObject, name)
	}
	zr, err := zlib.NewReader(bytes.NewReader(data))
	if err != nil {
		return fmt.Errorf("%w: not a zlib stream: %v", errBadObject, err)
	}
	defer zr.Close()
	// The header: at most "commit 18446744073709551615\0".
	var hdr []byte
	one := make([]byte, 1)
	for len(hdr) < 40 {
		if _, err := io.ReadFull(zr, one); err != nil {
			return fmt.Errorf("%w: truncated header: %v", errBadObject, err)
		}
		if one[0] == 0 {
			break
		}
		hdr = append(hdr, one[0])
	}
	typ, size, ok := strings.Cut(string(hdr), " ")
	switch typ {
	case "blob", "tree", "commit", "tag":
	default:
		return fmt.Errorf("%w: unknown type %q", errBadObject, typ)
	}
	n, err := strconv.ParseInt(size, 10, 64)
	if !ok || err != nil || n < 0 {
		return fmt.Errorf("%w: bad size %q", errBadObject, size)
	}
	h.Write(hdr)
	h.Write([]byte{0})
	got, err := io.Copy(h, zr)
	if err != nil {
		return fmt.Errorf("%w: %v", errBadObject, err)
	}
	if got != n {
		return fmt.Errorf("%w: header says %d bytes, content has %d", errBadObject, n, got)
	}
	if sum := hex.EncodeToString(h.Sum(nil)); sum != name {
		return fmt.Errorf("%w: content hashes to %s", errBadObject, sum)
	}
	return nil
}

func hashFor(hexLen int) hash.Hash {
	switch hexLen {
	case 40:
		return sha1.New()
	case 64:
		return sha256.New()
	}
	return nil
}

// verifyPackPair checks a pack and its index by their checksums: the pack's
// trailer is the hash of everything before it and is the pack's name, the
// index's trailer is the hash of everything before it, and the index names
// the pack's checksum just before its own. Either may be nil when only the
// other is being published (its partner is then checked through the name).
// The pack is streamed; the index is small (about 28 bytes an object).
func verifyPackPair(name string, pack io.ReaderAt, packSize int64, idx []byte) error {
	h := hashFor(len(name))
	if h == nil {
		return fmt.Errorf("%w: pack name %q", errBadObject, name)
	}
	sz := h.Size()
	if pack != nil {
		head := make([]byte, 4)
		if packSize < int64(12+sz) {
			return fmt.Errorf("%w: not a pack file", errBadObject)
		}
		if _, err := pack.ReadAt(head, 0); err != nil || string(head) != "PACK" {
			return fmt.Errorf("%w: not a pack file", errBadObject)
		}
		h.Reset()
		if _, err := io.Copy(h, io.NewSectionReader(pack, 0, packSize-int64(sz))); err != nil {
			return fmt.Errorf("%w: read pack: %v", errBadObject, err)
		}
		sum := h.Sum(nil)
		trailer := make([]byte, sz)
		if _, err := pack.ReadAt(trailer, packSize-int64(sz)); err != nil {
			return fmt.Errorf("%w: read pack: %v", errBadObject, err)
		}
		if !bytes.Equal(sum, trailer) {
			return fmt.Errorf("%w: pack checksum mismatch", errBadObject)
		}
		if hex.EncodeToString(sum) != name {
			return fmt.Errorf("%w: pack checksum %x does not match its name", errBadObject, sum)
		}
	}
	if idx != nil {
		if len(idx) < 8+256*4+2*sz {
			return fmt.Errorf("%w: index too short", errBadObject)
		}
		h.Reset()
		h.Write(idx[:len(idx)-sz])
		if !bytes.Equal(h.Sum(nil), idx[len(idx)-sz:]) {
			return fmt.Errorf("%w: index checksum mismatch", errBadObject)
		}
		if got := hex.EncodeToString(idx[len(idx)-2*sz : len(idx)-sz]); got != name {
			return fmt.Errorf("%w: index is for pack %s", errBadObject, got)
		}
	}
	return nil
}
