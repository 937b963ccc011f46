package views

// Bounded walks of layer and upper directories. Every walk stops at a node
// and a depth bound and never follows symlinks.

import (
	"io/fs"
	"os"
	"path"
	"sort"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/ephemeral-ai-lab/sandbox/layers"
)

// walkStats is the result of a bounded size walk.
type walkStats struct {
	Logical   int64 // sizes of regular files
	Allocated int64 // st_blocks*512 of every node
	Nodes     int
	Truncated bool // the node or depth bound cut the walk: sizes are lower bounds
}

// boundedWalk sums a tree visiting at most maxNodes nodes and descending at
// most maxDepth directory levels below root. It never follows symlinks: the
// tree may be a session's upper dir, so directories are opened beneath a
// layers.Root.
func boundedWalk(root string, maxNodes, maxDepth int) (walkStats, error) {
	var w walkStats
	var st unix.Stat_t
	if err := unix.Lstat(root, &st); err != nil {
		return w, &fs.PathError{Op: "lstat", Path: root, Err: err}
	}
	w.Allocated += st.Blocks * 512
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		if st.Mode&unix.S_IFMT == unix.S_IFREG {
			w.Logical += st.Size
		}
		return w, nil
	}
	r, err := layers.OpenRoot(root)
	if err != nil {
		w.Truncated = true
		return w, nil
	}
	defer r.Close()
	type item struct {
		rel   string
		depth int
	}
	stack := []item{{"", 0}}
	for len(stack) > 0 {
		it := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		d, err := r.OpenDir(it.rel)
		if err != nil {
			w.Truncated = true // unreadable directory: its content is not counted
			continue
		}
		names, err := d.Names()
		if err != nil {
			w.Truncated = true
		}
		for _, name := range names {
			if w.Nodes >= maxNodes {
				w.Truncated = true
				d.Close()
				return w, nil
			}
			w.Nodes++
			fi, err := d.Lstat(name)
			if err != nil {
				continue
			}
			st, ok := fi.Sys().(*unix.Stat_t)
			if !ok {
				continue
			}
			w.Allocated += st.Blocks * 512
			switch st.Mode & unix.S_IFMT {
			case unix.S_IFREG:
				w.Logical += st.Size
			case unix.S_IFDIR:
				if it.depth+1 >= maxDepth {
					w.Truncated = true
				} else {
					stack = append(stack, item{path.Join(it.rel, name), it.depth + 1})
				}
			}
		}
		d.Close()
	}
	return w, nil
}

// layerEntry is one change recorded in a layer directory.
type layerEntry struct {
	Path string `json:"path"`
	Kind string `json:"kind"`
}

// layerEntries lists the changes of one layer directory (kinds of §8.3),
// at most limit of them, sorted by path. Whiteouts in either encoding are
// "delete", OCI .wh.<name> names too; opaque directories are "opaque_dir".
func layerEntries(root string, limit, maxDepth int) (entries []layerEntry, truncated bool, err error) {
	entries = []layerEntry{}
	type item struct {
		path, rel string
		depth     int
	}
	stack := []item{{root, "", 0}}
	for len(stack) > 0 && !truncated {
		it := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		d, oerr := os.Open(it.path)
		if oerr != nil {
			if it.rel == "" {
				return nil, false, oerr
			}
			truncated = true
			continue
		}
		names, rerr := d.Readdirnames(-1)
		d.Close()
		if rerr != nil {
			truncated = true
		}
		sort.Strings(names)
		// Push subdirectories in reverse so they pop in name order.
		var subdirs []item
		for _, name := range names {
			rel := path.Join(it.rel, name)
			p := it.path + "/" + name
			kind, target := layers.ParseName(layers.LayerFormat, name)
			if kind == layers.NameOpaqueMarker {
				continue // the directory itself is reported as opaque_dir
			}
			if kind == layers.NameOCIWhiteout {
				entries = append(entries, layerEntry{path.Join(it.rel, target), "delete"})
			} else if fi, lerr := os.Lstat(p); lerr == nil {
				st := fi.Sys().(*syscall.Stat_t)
				switch st.Mode & unix.S_IFMT {
				case unix.S_IFCHR:
					if layers.IsLayerWhiteout(p, fi) {
						entries = append(entries, layerEntry{rel, "delete"})
					}
				case unix.S_IFREG:
					if layers.IsLayerWhiteout(p, fi) {
						entries = append(entries, layerEntry{rel, "delete"})
					} else {
						entries = append(entries, layerEntry{rel, "write"})
					}
				case unix.S_IFLNK:
					entries = append(entries, layerEntry{rel, "symlink"})
				case unix.S_IFDIR:
					kind := "directory"
					if layers.IsLayerOpaque(p) {
						kind = "opaque_dir"
					}
					entries = append(entries, layerEntry{rel, kind})
					if it.depth+1 >= maxDepth {
						truncated = true
					} else {
						subdirs = append(subdirs, item{p, rel, it.depth + 1})
					}
				}
			}
			if len(entries) > limit {
				truncated = true
				break
			}
		}
		for i := len(subdirs) - 1; i >= 0; i-- {
			stack = append(stack, subdirs[i])
		}
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].Path < entries[j].Path })
	if len(entries) > limit {
		entries, truncated = entries[:limit], true
	}
	return entries, truncated, nil
}
