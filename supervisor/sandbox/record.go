package sandbox

// Sandbox states (§4.1).
const (
	StateCreating = "creating"
	StateReady    = "ready"
	StateStopping = "stopping"
	StateStopped  = "stopped"
	StateFailed   = "failed"
)

// Record is the persisted record; its JSON is the contract's shape (§4.1).
type Record struct {
	ID                    string             `json:"id"`
	Name                  *string            `json:"name"`
	WorkspaceRoot         string             `json:"workspace_root"`
	Image                 string             `json:"image"`
	Rootfs                string             `json:"rootfs"`
	OverlayDriver         string             `json:"overlay_driver"`
	State                 string             `json:"state"`
	ActivityRevision      int64              `json:"activity_revision"`
	CreatedAt             string             `json:"created_at"`
	LayerCount            int                `json:"layer_count"`
	LiveWorkspaceSessions []string           `json:"live_workspace_sessions"`
	SharedBase            SharedBase         `json:"shared_base"`
	ResourceProfile       ResourceProfileRec `json:"resource_profile"`
	RecoveryArtifacts     []RecoveryArtifact `json:"recovery_artifacts"`
	// Git is where the snapshot came from when the workspace is a git work
	// tree (A5); absent otherwise.
	Git   *GitOrigin `json:"git,omitempty"`
	Error string     `json:"error,omitempty"`
}

type SharedBase struct {
	Source   string `json:"source"`
	Target   string `json:"target"`
	RootHash string `json:"root_hash"`
	Readonly bool   `json:"readonly"`
}

// ResourceLimits has the fields of the configuration's resource profile;
// the record keeps its own copy so this package does not depend on the
// configuration's types (a struct conversion turns one into the other).
type ResourceLimits struct {
	NanoCPUs        *int64 `json:"nano_cpus"`
	MemoryHighBytes *int64 `json:"memory_high_bytes"`
	MemoryMaxBytes  *int64 `json:"memory_max_bytes"`
	PidsMax         *int64 `json:"pids_max"`
}

type ResourceProfileRec struct {
	Name string `json:"name"`
	ResourceLimits
	Enforced bool `json:"enforced"`
}

// RecoveryArtifact is one entry of the record's recovery_artifacts.
type RecoveryArtifact struct {
	WorkspaceSessionID string `json:"workspace_session_id"`
	CreatedAt          string `json:"created_at"`
	Reason             string `json:"reason"`
	Bytes              int64  `json:"bytes"`
}

// GitOrigin is the record's "git" object.
type GitOrigin struct {
	Head   *string `json:"head"`   // null for an unborn branch
	Branch *string `json:"branch"` // null for a detached HEAD
	Dirty  bool    `json:"dirty"`
	Ref    *string `json:"ref,omitempty"` // create_sandbox git_ref
	GitDir string  `json:"git_dir"`
	Prefix string  `json:"prefix"` // the workspace's path below the top level, "" or "dir/"
}
