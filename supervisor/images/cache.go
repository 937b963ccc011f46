package images

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"
)

// Options configure a Cache (§13 images.*).
type Options struct {
	Dir        string // <data>/images
	DockerHost string // resolved endpoint (DockerHost)
	Pull       string // "missing" or "never"
	MaxBytes   int64  // images.cache_max_bytes
	Log        *slog.Logger
}

// Image is a cached image rootfs.
type Image struct {
	ID         string   `json:"id"` // sha256:<hex>
	Refs       []string `json:"refs"`
	Env        []string `json:"env"`
	WorkingDir string   `json:"working_dir"`
	Layers     int      `json:"layers"`
	Bytes      int64    `json:"bytes"`
	CreatedAt  string   `json:"created_at"`
	LastUsed   string   `json:"last_used"`

	Rootfs string `json:"-"` // <dir>/<hex>/rootfs
}

// Result is what Acquire did.
type Result struct {
	*Image
	Cached         bool  // the rootfs was already cached: nothing was exported or unpacked
	SkippedDevices int   // device nodes left out while unpacking
	ExportBytes    int64 // bytes exported by the Engine (0 for archives and cache hits)
}

// Cache is the image → rootfs cache. Reference counts live in memory and
// are rebuilt from the sandbox records at start (Hold).
type Cache struct {
	opt  Options
	mu   sync.Mutex
	refs map[string]int           // image hex → sandboxes using it
	busy map[string]chan struct{} // image hex → an Acquire unpacking it
}

// Open creates the cache directory and sweeps what a crash left: staging
// directories, exported archives and entries being pruned.
func Open(opt Options) (*Cache, error) {
	if opt.Log == nil {
		opt.Log = slog.New(slog.DiscardHandler)
	}
	if opt.Pull == "" {
		opt.Pull = "missing"
	}
	if err := os.MkdirAll(opt.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("image cache %s: %w", opt.Dir, err)
	}
	ents, err := os.ReadDir(opt.Dir)
	if err != nil {
		return nil, fmt.Errorf("image cache %s: %w", opt.Dir, err)
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") {
			opt.Log.Info("image cache: removing leftover", "path", e.Name())
			removeAll(filepath.Join(opt.Dir, e.Name()))
		}
	}
	return &Cache{opt: opt, refs: map[string]int{}, busy: map[string]chan struct{}{}}, nil
}

// Host is the Docker Engine endpoint the cache uses.
func (c *Cache) Host() string { return c.opt.DockerHost }

func hexOf(id string) string { return strings.TrimPrefix(id, "sha256:") }

func (c *Cache) entry(id string) string { return filepath.Join(c.opt.Dir, hexOf(id)) }

// Acquire resolves image, unpacks it unless cached and counts one more
// sandbox using it. progress gets human-readable lines. Errors are *Error.
func (c *Cache) Acquire(ctx context.Context, image string, progress func(string)) (*Result, error) {
	src, err := parseSource(image)
	if err != nil {
		return nil, err
	}
	var res *Result
	switch src.kind {
	case srcEngine:
		res, err = c.fromEngine(ctx, image, src.value, progress)
	default:
		res, err = c.fromArchive(ctx, image, src, progress)
	}
	if err != nil {
		return nil, err
	}
	c.Prune()
	return res, nil
}

func (c *Cache) fromArchive(ctx context.Context, image string, src source, progress func(string)) (*Result, error) {
	progress(fmt.Sprintf("reading %s", src.value))
	a, err := openArchive(src.value, src.kind)
	if err != nil {
		reason := "unreadable_archive"
		if errors.Is(err, fs.ErrNotExist) {
			reason = "archive_missing"
		}
		return nil, errorf(BadInput, image, reason, "image %s: %v", image, err)
	}
	defer a.close()
	return c.ensure(ctx, image, a.id, func(string) (*archiveImage, int64, error) { return a, 0, nil }, progress)
}

func (c *Cache) fromEngine(ctx context.Context, image, ref string, progress func(string)) (*Result, error) {
	progress(fmt.Sprintf("resolving %s on the Docker Engine at %s", ref, c.opt.DockerHost))
	e, err := connect(ctx, c.opt.DockerHost, image)
	if err != nil {
		return nil, err
	}
	defer e.close()
	id, err := e.resolve(ctx, ref, c.opt.Pull, progress)
	if err != nil {
		return nil, err
	}
	if !imageIDRe.MatchString(id) {
		return nil, errorf(Failed, image, "bad_image_id", "the Docker Engine gave %s the image ID %q", ref, id)
	}
	var opened *archiveImage
	defer func() {
		if opened != nil {
			opened.close()
		}
	}()
	return c.ensure(ctx, image, id, func(staging string) (*archiveImage, int64, error) {
		p := filepath.Join(staging, "image.tar")
		n, err := e.save(ctx, id, p, progress)
		if err != nil {
			return nil, n, err
		}
		a, err := openArchive(p, srcDockerArchive)
		if err != nil {
			return nil, n, errorf(Failed, image, "corrupt_export", "the Docker Engine exported %s as an unreadable archive: %v", ref, err)
		}
		opened = a
		return a, n, nil
	}, progress)
}

// save streams ImageSave of id into p, reporting bytes once a second.
func (e *engine) save(ctx context.Context, id, p string, progress func(string)) (int64, error) {
	rc, err := e.cl.ImageSave(ctx, []string{id})
	if err != nil {
		return 0, e.failure(id, "export_failed", "export %s: %w", id, err)
	}
	defer rc.Close()
	f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return 0, errorf(Failed, id, "export_failed", "export %s: %v", id, err)
	}
	defer f.Close()
	cw := &countingWriter{w: f, report: func(n int64) { progress(fmt.Sprintf("exporting image %s: %d bytes", short(id), n)) }}
	if _, err := io.Copy(cw, rc); err != nil {
		return cw.n, e.failure(id, "export_failed", "export %s: %w", id, err)
	}
	progress(fmt.Sprintf("exported image %s: %d bytes", short(id), cw.n))
	return cw.n, nil
}

type countingWriter struct {
	w      io.Writer
	n      int64
	last   time.Time
	report func(int64)
}

func (cw *countingWriter) Write(b []byte) (int, error) {
	n, err := cw.w.Write(b)
	cw.n += int64(n)
	if time.Since(cw.last) >= time.Second {
		cw.last = time.Now()
		cw.report(cw.n)
	}
	return n, err
}

// countingReader reports the bytes read so far at most once a second (§4.2:
// progress at least once per second).
type countingReader struct {
	r      io.Reader
	n      int64
	last   time.Time
	report func(int64)
}

func (cr *countingReader) Read(b []byte) (int, error) {
	n, err := cr.r.Read(b)
	cr.n += int64(n)
	if time.Since(cr.last) >= time.Second {
		cr.last = time.Now()
		cr.report(cr.n)
	}
	return n, err
}

func short(id string) string {
	h := hexOf(id)
	if len(h) > 12 {
		h = h[:12]
	}
	return "sha256:" + h
}

// ensure returns the cached entry of id, building it from open when it is
// absent. Only one caller builds a given ID at a time; the others wait and
// then find it cached.
func (c *Cache) ensure(ctx context.Context, image, id string, open func(staging string) (*archiveImage, int64, error), progress func(string)) (*Result, error) {
	hex := hexOf(id)
	for {
		c.mu.Lock()
		ch, busy := c.busy[hex]
		if !busy {
			c.busy[hex] = make(chan struct{})
			c.mu.Unlock()
			break
		}
		c.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, errorf(Failed, image, "cancelled", "image %s: %v", image, ctx.Err())
		}
	}
	defer func() {
		c.mu.Lock()
		close(c.busy[hex])
		delete(c.busy, hex)
		c.mu.Unlock()
	}()

	if img, err := c.load(id); err == nil {
		c.mu.Lock()
		c.refs[hex]++
		c.mu.Unlock()
		img.Refs = addRef(img.Refs, image)
		c.touch(img)
		progress(fmt.Sprintf("image %s is cached: reusing %s", short(id), img.Rootfs))
		return &Result{Image: img, Cached: true}, nil
	}

	staging, err := os.MkdirTemp(c.opt.Dir, ".staging-"+hex[:12]+"-")
	if err != nil {
		return nil, errorf(Failed, image, "cache_failed", "image cache: %v", err)
	}
	ok := false
	defer func() {
		if !ok {
			removeAll(staging)
		}
	}()
	a, exported, err := open(staging)
	if err != nil {
		return nil, err
	}
	rootfs := filepath.Join(staging, "rootfs")
	if err := os.Mkdir(rootfs, 0o755); err != nil {
		return nil, errorf(Failed, image, "cache_failed", "image cache: %v", err)
	}
	res := &Result{ExportBytes: exported}
	for i, l := range a.layers {
		r, err := a.tar.open(l)
		if err != nil {
			return nil, errorf(Failed, image, "corrupt_archive", "image %s: layer %d of %d: %v", image, i+1, len(a.layers), err)
		}
		progress(fmt.Sprintf("unpacking layer %d of %d (%d bytes)", i+1, len(a.layers), r.Size()))
		cr := &countingReader{r: r, last: time.Now(), report: func(n int64) {
			progress(fmt.Sprintf("unpacking layer %d of %d: %d of %d bytes", i+1, len(a.layers), n, r.Size()))
		}}
		st, err := applyLayer(ctx, rootfs, cr)
		res.SkippedDevices += st.skippedDevices
		if err != nil {
			reason := "unpack_failed"
			var ue *unsafeEntryError
			switch {
			case errors.As(err, &ue):
				reason = "unsafe_entry"
			case strings.HasPrefix(err.Error(), "corrupt layer"):
				reason = "corrupt_layer"
			}
			return nil, errorf(Failed, image, reason, "unpack %s: layer %d of %d: %v", image, i+1, len(a.layers), err)
		}
	}
	os.Remove(filepath.Join(staging, "image.tar"))
	now := time.Now().UTC().Format(time.RFC3339Nano)
	img := &Image{ID: id, Refs: []string{image}, Env: a.config.Config.Env, WorkingDir: a.config.Config.WorkingDir,
		Layers: len(a.layers), Bytes: treeBytes(rootfs), CreatedAt: now, LastUsed: now}
	if img.Env == nil {
		img.Env = []string{}
	}
	if err := writeJSON(filepath.Join(staging, "image.json"), img); err != nil {
		return nil, errorf(Failed, image, "cache_failed", "image cache: %v", err)
	}
	dst := c.entry(id)
	removeAll(dst) // an entry without a readable image.json is garbage
	if err := os.Rename(staging, dst); err != nil {
		return nil, errorf(Failed, image, "cache_failed", "image cache: %v", err)
	}
	ok = true
	img.Rootfs = filepath.Join(dst, "rootfs")
	c.mu.Lock()
	c.refs[hex]++
	c.mu.Unlock()
	progress(fmt.Sprintf("image %s unpacked: %d layers, %d bytes", short(id), img.Layers, img.Bytes))
	res.Image = img
	return res, nil
}

func addRef(refs []string, r string) []string {
	if slices.Contains(refs, r) {
		return refs
	}
	return append(refs, r)
}

// load reads a complete cache entry.
func (c *Cache) load(id string) (*Image, error) {
	dir := c.entry(id)
	b, err := os.ReadFile(filepath.Join(dir, "image.json"))
	if err != nil {
		return nil, err
	}
	var img Image
	if err := json.Unmarshal(b, &img); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, "image.json"), err)
	}
	img.Rootfs = filepath.Join(dir, "rootfs")
	if st, err := os.Stat(img.Rootfs); err != nil || !st.IsDir() {
		return nil, fmt.Errorf("image %s: no rootfs in the cache", id)
	}
	return &img, nil
}

// Lookup returns the cached entry of an image ID (for a session's root).
func (c *Cache) Lookup(id string) (*Image, error) { return c.load(id) }

// Hold counts a sandbox that uses id (recovery at start).
func (c *Cache) Hold(id string) {
	c.mu.Lock()
	c.refs[hexOf(id)]++
	c.mu.Unlock()
}

// Release drops one sandbox's use of id and prunes.
func (c *Cache) Release(id string) {
	hex := hexOf(id)
	c.mu.Lock()
	if c.refs[hex] > 1 {
		c.refs[hex]--
	} else {
		delete(c.refs, hex)
	}
	c.mu.Unlock()
	if img, err := c.load(id); err == nil {
		c.touch(img)
	}
	c.Prune()
}

// touch records the last use of img (the LRU order).
func (c *Cache) touch(img *Image) {
	img.LastUsed = time.Now().UTC().Format(time.RFC3339Nano)
	if err := writeJSON(filepath.Join(c.entry(img.ID), "image.json"), img); err != nil {
		c.opt.Log.Warn("image cache: record last use", "image", img.ID, "err", err)
	}
}

// Entries lists the complete cache entries.
func (c *Cache) Entries() []*Image {
	ents, _ := os.ReadDir(c.opt.Dir)
	var out []*Image
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") || !e.IsDir() {
			continue
		}
		if img, err := c.load("sha256:" + e.Name()); err == nil {
			out = append(out, img)
		}
	}
	return out
}

// Prune removes unreferenced entries, least recently used first, while the
// cache holds more than MaxBytes.
func (c *Cache) Prune() {
	all := c.Entries()
	var total int64
	for _, img := range all {
		total += img.Bytes
	}
	if total <= c.opt.MaxBytes {
		return
	}
	slices.SortFunc(all, func(a, b *Image) int { return strings.Compare(a.LastUsed, b.LastUsed) })
	for _, img := range all {
		if total <= c.opt.MaxBytes {
			return
		}
		hex := hexOf(img.ID)
		c.mu.Lock()
		_, busy := c.busy[hex]
		used := c.refs[hex] > 0 || busy
		if !used {
			// Renamed under the lock so a concurrent Acquire never finds a half-removed entry.
			trash := filepath.Join(c.opt.Dir, ".prune-"+hex)
			if err := os.Rename(c.entry(img.ID), trash); err != nil {
				c.mu.Unlock()
				c.opt.Log.Warn("image cache: prune", "image", img.ID, "err", err)
				continue
			}
			c.mu.Unlock()
			removeAll(trash)
			total -= img.Bytes
			c.opt.Log.Info("image cache: pruned", "image", img.ID, "bytes", img.Bytes)
			continue
		}
		c.mu.Unlock()
	}
}

func writeJSON(p string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(p), ".json-")
	if err != nil {
		return err
	}
	_, err = f.Write(append(b, '\n'))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), p)
	}
	if err != nil {
		os.Remove(f.Name())
	}
	return err
}

// treeBytes sums the sizes of the regular files below dir.
func treeBytes(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}

// removeAll deletes a tree, first giving every directory u+rwx (image
// directories may be read-only).
func removeAll(dir string) {
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			_ = os.Chmod(p, 0o700)
		}
		return nil
	})
	_ = os.RemoveAll(dir)
}
