package fuseoverlay

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// cacheTimeout is how long the kernel may trust entries and attributes.
// Lowers never change and the upper changes only through this mount, whose
// replies keep the kernel's caches current, so it can be long.
const cacheTimeout = time.Minute

func mount(ctx context.Context, mountpoint string, opts Options) (*Server, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if opts.Upper == nil {
		return nil, errors.New("fuseoverlay: Options.Upper is required")
	}
	o := &ofs{
		work:     -1,
		euid:     os.Geteuid(),
		egid:     os.Getegid(),
		origin:   map[uint64]uint64{},
		writers:  map[*handle]struct{}{},
		retired:  map[fs.StableAttr]*fs.Inode{},
		rec:      newRecorder(opts.Sink),
		owner:    opts.Owner,
		released: opts.Released,

		maxSharedFds: sharedFdLimit(),
	}
	for _, f := range append([]*os.File{opts.Upper}, opts.Lowers...) {
		if f == nil {
			return nil, errors.New("fuseoverlay: nil layer directory")
		}
		var st unix.Stat_t
		fd := int(f.Fd())
		if err := unix.Fstat(fd, &st); err != nil {
			return nil, fmt.Errorf("fuseoverlay: stat layer %s: %w", f.Name(), err)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			return nil, fmt.Errorf("fuseoverlay: layer %s is not a directory", f.Name())
		}
		o.fds = append(o.fds, fd)
		o.devs = append(o.devs, st.Dev)
		o.files = append(o.files, f)
	}
	o.upperDev = o.devs[0]
	if opts.Work != nil {
		o.work = int(opts.Work.Fd())
	} else {
		o.hideTmp = true
		// A crash during copy-up may have left the staging directory behind.
		_ = os.RemoveAll(fmt.Sprintf("/proc/self/fd/%d/%s", o.fds[0], stagingName))
	}
	root := &node{o: o, layer: 0, dirLayers: o.rootLayers()}
	o.root = root
	to := cacheTimeout
	name := opts.Name
	if name == "" {
		name = "esbx-overlay"
	}
	fsOpts := &fs.Options{
		EntryTimeout:    &to,
		AttrTimeout:     &to,
		NegativeTimeout: &to,
		// Report mode 0000 as it is: go-fuse would otherwise show 0644/0755,
		// and default_permissions makes the kernel grant access by that.
		NullPermissions: true,
		MountOptions: fuse.MountOptions{
			DirectMountStrict: true,
			// No passthrough: it hides writes from the recorder. No
			// writeback cache either: it hides the writer (design rule 5).
			DisabledCapabilities: fuse.CAP_PASSTHROUGH | fuse.CAP_WRITEBACK_CACHE,
			// The server clears set-id bits itself (killpriv.go), which
			// spares a GETXATTR security.capability per write(2).
			ExtraCapabilities: fuse.CAP_HANDLE_KILLPRIV_V2,
			FsName:            name,
			Name:              "esbx",
			// Only processes in the mount's user namespace (or below) are
			// admitted even with allow_other; commands may run as other ids.
			AllowOther: true,
			Options:    []string{"default_permissions"},
			MaxWrite:   1 << 20,
			// A symlink's target never changes in place (a new one is a
			// new node), so the kernel may keep it: no READLINK per path
			// walk through it.
			EnableSymlinkCaching: true,
			Debug:                opts.Debug,
		},
	}
	if opts.Requests != nil {
		fsOpts.MountOptions.Debug = true
		fsOpts.MountOptions.Logger = opts.Requests.logger()
	}
	// fs.Mount, with the bridge wrapped (killpriv.go).
	raw := &rawFS{RawFileSystem: fs.NewNodeFS(root, fsOpts), kill: &o.kill, o: o}
	srv, err := fuse.NewServer(raw, mountpoint, &fsOpts.MountOptions)
	if err != nil {
		return nil, fmt.Errorf("fuseoverlay: mount %s: %w", mountpoint, err)
	}
	go srv.Serve()
	if err := srv.WaitMount(); err != nil {
		_ = srv.Unmount()
		return nil, fmt.Errorf("fuseoverlay: mount %s: %w", mountpoint, err)
	}
	o.mntID = mountID(mountpoint)
	s := &server{srv: srv, o: o, done: make(chan struct{})}
	interval := opts.CoalesceInterval
	if interval <= 0 {
		interval = time.Second
	}
	if o.rec != nil {
		go o.rec.loop(interval, s.done)
	}
	go func() {
		srv.Wait()
		close(s.done)
		o.flushAll()
	}()
	return &Server{impl: s}, nil
}

type server struct {
	srv  *fuse.Server
	o    *ofs
	done chan struct{}
}

func (s *server) flush() { s.o.flushAll() }

func (s *server) unmount() error {
	err := s.srv.Unmount()
	if err != nil {
		return fmt.Errorf("fuseoverlay: unmount: %w", err)
	}
	<-s.done
	return nil
}

func (s *server) wait() { <-s.done }

// rootLayers lists the layers whose root directories merge into the
// mount's root under the current chain (caller holds o.mu, or owns o).
func (o *ofs) rootLayers() []int {
	layers := []int{0}
	if !isOpaque(o.fds[0], ".") {
		for l := 1; l < len(o.fds); l++ {
			layers = append(layers, l)
			if isOpaque(o.fds[l], ".") {
				break
			}
		}
	}
	return layers
}
