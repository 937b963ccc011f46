package layers

import (
	"strings"
)

// GitKind classifies a workspace path that lies inside a git directory
// (contract A8, design rule 10). A git directory is any path component named
// ".git" that is a directory (the workspace's own repository, a nested
// repository), and, inside one, every modules/<name>/ (a submodule's git
// directory), classified recursively.
type GitKind int

const (
	// GitNone: not inside a git directory; an ordinary path.
	GitNone GitKind = iota
	// GitPrivate: the session's own state (index, logs, COMMIT_EDITMSG,
	// ORIG_HEAD, merge/rebase/cherry-pick state, lock files, derived
	// caches, and every file git does not define): never published, never
	// a conflict.
	GitPrivate
	// GitProtected: anything that can make git run a program or read from
	// elsewhere (config, hooks/, info/, commondir, alternates, worktrees/,
	// remotes/, branches/): a session may change its own copy; publication
	// and directory exports never carry it.
	GitProtected
	// GitObject: a loose object or a pack (content-addressed by name).
	GitObject
	// GitRef: HEAD, packed-refs and refs/**.
	GitRef
	// GitDirItself: the git directory itself (".git", ".git/modules/x") or
	// an intermediate directory inside it (objects/, objects/ab, refs/heads).
	GitDirItself
)

func (k GitKind) String() string {
	switch k {
	case GitPrivate:
		return "private"
	case GitProtected:
		return "protected"
	case GitObject:
		return "object"
	case GitRef:
		return "ref"
	case GitDirItself:
		return "dir"
	}
	return "none"
}

// GitPath is a path split at its innermost git directory.
type GitPath struct {
	Kind GitKind
	// Dir is the git directory ("".git", "sub/.git", ".git/modules/m").
	Dir string
	// Rel is the path relative to Dir ("" for Dir itself).
	Rel string
}

// ClassifyGit classifies a slash-separated, workspace-relative path. isDir
// says whether the path names a directory (a directory never holds content
// of its own, so only the directories git itself makes are GitDirItself;
// anything else is classified as its would-be contents are).
func ClassifyGit(path string, isDir bool) GitPath {
	comps := strings.Split(path, "/")
	start := -1
	for i, c := range comps {
		if c == ".git" {
			start = i
			break
		}
	}
	if start < 0 {
		return GitPath{Kind: GitNone}
	}
	// The component ".git" names a file (a linked worktree's or a
	// submodule's gitlink) when it is the last component and not a
	// directory: a gitlink points git elsewhere, so it is protected.
	dir := strings.Join(comps[:start+1], "/")
	rest := comps[start+1:]
	if len(rest) == 0 {
		if isDir {
			return GitPath{Kind: GitDirItself, Dir: dir}
		}
		return GitPath{Kind: GitProtected, Dir: strings.Join(comps[:start], "/"), Rel: ".git"}
	}
	for len(rest) >= 2 && rest[0] == "modules" {
		// modules/<name>/...: a submodule's git directory. Submodule names
		// may contain slashes; git places the module's git dir at
		// modules/<name>, and every git dir has a HEAD, so the innermost
		// split cannot be known from the name alone. Names with slashes are
		// rare: treat modules/<first>/ as the git dir, which keeps config,
		// hooks and info of nested names protected through the fallback
		// below (anything undefined is private, never published).
		dir += "/modules/" + rest[1]
		rest = rest[2:]
		if len(rest) == 0 {
			return GitPath{Kind: GitDirItself, Dir: dir}
		}
	}
	rel := strings.Join(rest, "/")
	return GitPath{Kind: classifyGitRel(rest, isDir), Dir: dir, Rel: rel}
}

// gitPrivateTop are files at the top of a git directory that only the
// session's own work tree and history state give meaning to.
var gitPrivateTop = map[string]bool{
	"index": true, "COMMIT_EDITMSG": true, "ORIG_HEAD": true, "FETCH_HEAD": true,
	"MERGE_HEAD": true, "MERGE_MSG": true, "MERGE_MODE": true, "MERGE_AUTOSTASH": true,
	"CHERRY_PICK_HEAD": true, "REVERT_HEAD": true, "REBASE_HEAD": true, "AUTO_MERGE": true,
	"BISECT_LOG": true, "BISECT_START": true, "BISECT_TERMS": true, "BISECT_EXPECTED_REV": true,
	"BISECT_ANCESTORS_OK": true, "BISECT_NAMES": true, "BISECT_RUN": true, "BISECT_HEAD": true,
	"gc.log": true, "gc.pid": true, "description": true, "shallow": true, "packed-refs.new": true,
	"logs": true, "rebase-merge": true, "rebase-apply": true, "sequencer": true, "rr-cache": true,
	"lfs": true, "fsmonitor--daemon": true, "fsmonitor--daemon.ipc": true,
}

// gitProtectedTop are files and directories at the top of a git directory
// through which git runs programs or reads outside the repository.
var gitProtectedTop = map[string]bool{
	"config": true, "config.worktree": true, "hooks": true, "info": true, "commondir": true,
	"gitdir": true, "worktrees": true, "remotes": true, "branches": true,
}

func classifyGitRel(rest []string, isDir bool) GitKind {
	last := rest[len(rest)-1]
	top := rest[0]
	if gitProtectedTop[top] {
		return GitProtected
	}
	if strings.HasSuffix(last, ".lock") && !isDir {
		return GitPrivate
	}
	switch {
	case gitPrivateTop[top]:
		return GitPrivate
	case top == "HEAD" && len(rest) == 1 && !isDir:
		return GitRef
	case top == "packed-refs" && len(rest) == 1 && !isDir:
		return GitRef
	case top == "refs":
		if isDir {
			return GitDirItself
		}
		return GitRef
	case top == "objects":
		return classifyGitObjects(rest[1:], isDir)
	case strings.HasPrefix(top, "sharedindex.") || strings.HasPrefix(top, "index."):
		return GitPrivate
	}
	return GitPrivate
}

func classifyGitObjects(rest []string, isDir bool) GitKind {
	if len(rest) == 0 {
		return GitDirItself
	}
	switch {
	case rest[0] == "info":
		if len(rest) == 2 && (rest[1] == "alternates" || rest[1] == "http-alternates") {
			return GitProtected
		}
		if len(rest) == 1 && isDir {
			return GitDirItself
		}
		return GitPrivate // commit-graph(s), packs: derived caches
	case len(rest[0]) == 2 && isHex(rest[0]):
		if len(rest) == 1 && isDir {
			return GitDirItself
		}
		if len(rest) == 2 && !isDir && isHex(rest[1]) && (len(rest[1]) == 38 || len(rest[1]) == 62) {
			return GitObject
		}
		return GitPrivate // tmp_obj_*, anything else
	case rest[0] == "pack":
		if len(rest) == 1 && isDir {
			return GitDirItself
		}
		if len(rest) == 2 && !isDir && isPackName(rest[1]) {
			return GitObject
		}
		return GitPrivate // bitmaps, .rev, .mtimes, tmp_pack_*, multi-pack-index
	}
	return GitPrivate
}

// isPackName: pack-<hex>.{pack,idx,keep,promisor}.
func isPackName(name string) bool {
	rest, ok := strings.CutPrefix(name, "pack-")
	if !ok {
		return false
	}
	dot := strings.IndexByte(rest, '.')
	if dot < 0 {
		return false
	}
	h, ext := rest[:dot], rest[dot+1:]
	if (len(h) != 40 && len(h) != 64) || !isHex(h) {
		return false
	}
	switch ext {
	case "pack", "idx", "keep", "promisor":
		return true
	}
	return false
}

func isHex(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// GitNeverPublished reports whether a path inside a git directory must never
// leave a session: private state and everything protected.
func GitNeverPublished(path string, isDir bool) bool {
	k := ClassifyGit(path, isDir).Kind
	return k == GitPrivate || k == GitProtected
}

// exportKeepsOut reports whether an export (dir or archive) leaves the
// folded entry at p out (export.go's decisions): git-private and
// git-protected files and directories, protected ones also by their
// lower-cased spelling, and any symlink or deletion inside a git directory.
func exportKeepsOut(p string, k foldKind) bool {
	isDir := k == foldDir
	lower := strings.ToLower(p)
	if ClassifyGit(lower, isDir).Kind == GitProtected || (k == foldDelete && ClassifyGit(lower, true).Kind == GitProtected) {
		return true
	}
	kind := ClassifyGit(p, isDir).Kind
	switch k {
	case foldSymlink, foldDelete:
		return kind != GitNone || ClassifyGit(lower, isDir).Kind != GitNone
	}
	return kind == GitPrivate || kind == GitProtected
}
