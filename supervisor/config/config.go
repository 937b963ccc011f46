package config

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
)

// Config is config.yml (§13). Decoding into a value pre-filled with defaults
// gives the contract's merge rule: objects merge recursively, scalars and
// arrays replace. Unknown keys are refused by the decoder.
type Config struct {
	Supervisor struct {
		SocketPath               string  `yaml:"socket_path"`
		Listen                   *string `yaml:"listen"`
		MaxConcurrentConnections int     `yaml:"max_concurrent_connections"`
		MaxRequestBytes          int     `yaml:"max_request_bytes"`
		RequestReadTimeoutS      float64 `yaml:"request_read_timeout_s"`
		ShutdownGraceS           float64 `yaml:"shutdown_grace_s"`
		MaxActiveCommands        int     `yaml:"max_active_commands"`
		MaxSessions              int     `yaml:"max_sessions"`
	} `yaml:"supervisor"`
	HTTP struct {
		Listen  *string `yaml:"listen"`
		Forward struct {
			ConnectTimeoutS  float64 `yaml:"connect_timeout_s"`
			ResponseTimeoutS float64 `yaml:"response_timeout_s"`
		} `yaml:"forward"`
	} `yaml:"http"`
	Network struct {
		Isolated struct {
			AllowPrivate bool   `yaml:"allow_private"`
			Helper       string `yaml:"helper"`
		} `yaml:"isolated"`
	} `yaml:"network"`
	Manager struct {
		WorkspaceRoots      []string `yaml:"workspace_roots"`
		MaxSandboxes        int      `yaml:"max_sandboxes"`
		MaxCreateCount      int      `yaml:"max_create_count"`
		MaxWorkspaceEntries int      `yaml:"max_workspace_entries"`
		Export              struct {
			MaxStreamBytes       int64 `yaml:"max_stream_bytes"`
			MaxDecompressedBytes int64 `yaml:"max_decompressed_bytes"`
			MaxApplyEntries      int64 `yaml:"max_apply_entries"`
			// AllowedRoots are the directories, besides each sandbox's
			// own workspace root, below which export_changes may write
			// (#27 item 2); empty by default.
			AllowedRoots []string `yaml:"allowed_roots"`
		} `yaml:"export"`
	} `yaml:"manager"`
	// Git: the workspace's git directory in publication (contract A8).
	Git struct {
		// PublishRefs: how a session's branch is published when the
		// head's tip moved (merge, rebase or branch).
		PublishRefs string `yaml:"publish_refs"`
	} `yaml:"git"`
	Images struct {
		DockerHost    *string `yaml:"docker_host"`
		Pull          string  `yaml:"pull"`
		CacheMaxBytes int64   `yaml:"cache_max_bytes"`
	} `yaml:"images"`
	Sandbox struct {
		DefaultOverlay  string   `yaml:"default_overlay"`
		HostPaths       []string `yaml:"host_paths"`
		HiddenPaths     []string `yaml:"hidden_paths"`
		IDMapping       string   `yaml:"id_mapping"`
		ResourceProfile string   `yaml:"resource_profile"`
	} `yaml:"sandbox"`
	ResourceProfiles map[string]ResourceProfile `yaml:"resource_profiles"`
	Runtime          struct {
		Workspace struct {
			SetupTimeoutS         float64 `yaml:"setup_timeout_s"`
			ExitGraceS            float64 `yaml:"exit_grace_s"`
			FinalizeTimeoutS      float64 `yaml:"finalize_timeout_s"`
			MaxSessionsPerSandbox int     `yaml:"max_sessions_per_sandbox"`
			MaxChainDepth         int     `yaml:"max_chain_depth"`
			MaxRecoveryArtifacts  int     `yaml:"max_recovery_artifacts"`
		} `yaml:"workspace"`
		Command struct {
			MaxActivePerSandbox      int               `yaml:"max_active_per_sandbox"`
			DefaultYieldMs           int               `yaml:"default_yield_ms"`
			MaxYieldMs               int               `yaml:"max_yield_ms"`
			ReadLinesDefault         int               `yaml:"read_lines_default"`
			ReadLinesMax             int               `yaml:"read_lines_max"`
			MaxTerminalEntries       int               `yaml:"max_terminal_entries"`
			MaxTranscriptWindowBytes int               `yaml:"max_transcript_window_bytes"`
			MaxTranscriptBytes       int64             `yaml:"max_transcript_bytes"`
			StdinWriteDeadlineS      float64           `yaml:"stdin_write_deadline_s"`
			MaxStdinBytes            int               `yaml:"max_stdin_bytes"`
			PtyRows                  int               `yaml:"pty_rows"`
			PtyCols                  int               `yaml:"pty_cols"`
			Env                      map[string]string `yaml:"env"`
		} `yaml:"command"`
		File struct {
			ReadLinesDefault int   `yaml:"read_lines_default"`
			ReadLinesMax     int   `yaml:"read_lines_max"`
			MaxOutputBytes   int   `yaml:"max_output_bytes"`
			MaxEditBytes     int64 `yaml:"max_edit_bytes"`
			MaxReadFileBytes int64 `yaml:"max_read_file_bytes"`
			MaxListEntries   int   `yaml:"max_list_entries"`
		} `yaml:"file"`
		Publish struct {
			ProtectedPaths       []string `yaml:"protected_paths"`
			MaxPlanPaths         int      `yaml:"max_plan_paths"`
			ExpansionLimit       int      `yaml:"expansion_limit"`
			MergeMaxFileBytes    int64    `yaml:"merge_max_file_bytes"`
			MergeMaxEditDistance int      `yaml:"merge_max_edit_distance"`
		} `yaml:"publish"`
		Layerstack struct {
			RemountSweepWidth int     `yaml:"remount_sweep_width"`
			FreezeBudgetS     float64 `yaml:"freeze_budget_s"`
			SpoolZstdLevel    int     `yaml:"spool_zstd_level"`
			Autosquash        struct {
				SquashAtNLayers *int `yaml:"squash_at_n_layers"`
			} `yaml:"autosquash"`
		} `yaml:"layerstack"`
	} `yaml:"runtime"`
	Observability struct {
		Enabled       bool `yaml:"enabled"`
		MaxDiskBytes  int  `yaml:"max_disk_bytes"`
		MaxLineBytes  int  `yaml:"max_line_bytes"`
		ResourceStats struct {
			Enabled          bool `yaml:"enabled"`
			SampleIntervalMs int  `yaml:"sample_interval_ms"`
			MaxDiskBytes     int  `yaml:"max_disk_bytes"`
		} `yaml:"resource_stats"`
		FileActivity struct {
			Enabled    bool `yaml:"enabled"`
			MaxRecords int  `yaml:"max_records"`
			CoalesceMs int  `yaml:"coalesce_ms"`
		} `yaml:"file_activity"`
		Sampling struct {
			MaxWalkNodes int `yaml:"max_walk_nodes"`
			MaxWalkDepth int `yaml:"max_walk_depth"`
		} `yaml:"sampling"`
		Views struct {
			ResourceWindowMs       int `yaml:"resource_window_ms"`
			LayerDeltaDefaultLimit int `yaml:"layer_delta_default_limit"`
			LayerDeltaMaxLimit     int `yaml:"layer_delta_max_limit"`
		} `yaml:"views"`
	} `yaml:"observability"`
}

// ResourceProfile is one entry of resource_profiles; nil means unlimited.
type ResourceProfile struct {
	NanoCPUs        *int64 `yaml:"nano_cpus" json:"nano_cpus"`
	MemoryHighBytes *int64 `yaml:"memory_high_bytes" json:"memory_high_bytes"`
	MemoryMaxBytes  *int64 `yaml:"memory_max_bytes" json:"memory_max_bytes"`
	PidsMax         *int64 `yaml:"pids_max" json:"pids_max"`
}

const mib = 1 << 20

func ptr[T any](v T) *T { return &v }

// Default is the configuration with every default of §13.
func Default() *Config {
	c := &Config{}
	s := &c.Supervisor
	s.MaxConcurrentConnections, s.MaxRequestBytes, s.RequestReadTimeoutS = 256, 16*mib, 30
	s.ShutdownGraceS, s.MaxActiveCommands, s.MaxSessions = 10, 128, 256
	c.HTTP.Forward.ConnectTimeoutS, c.HTTP.Forward.ResponseTimeoutS = 10, 30
	m := &c.Manager
	m.MaxSandboxes, m.MaxCreateCount, m.MaxWorkspaceEntries = 64, 16, 1000000
	m.Export.MaxStreamBytes, m.Export.MaxDecompressedBytes, m.Export.MaxApplyEntries = 2<<30, 8<<30, 1000000
	c.Network.Isolated.Helper = "auto"
	c.Images.Pull, c.Images.CacheMaxBytes = "missing", 20<<30
	c.Git.PublishRefs = "merge"
	c.Sandbox.DefaultOverlay = "auto"
	c.Sandbox.HostPaths = []string{"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt", "/nix"}
	c.Sandbox.HiddenPaths = []string{}
	c.Sandbox.IDMapping, c.Sandbox.ResourceProfile = "single", "unlimited"
	c.ResourceProfiles = map[string]ResourceProfile{
		"unlimited":   {},
		"standard":    {NanoCPUs: ptr[int64](1e9), MemoryHighBytes: ptr[int64](384 * mib), MemoryMaxBytes: ptr[int64](512 * mib), PidsMax: ptr[int64](256)},
		"build-heavy": {NanoCPUs: ptr[int64](4e9), MemoryHighBytes: ptr[int64](3 << 30), MemoryMaxBytes: ptr[int64](4 << 30), PidsMax: ptr[int64](1024)},
	}
	w := &c.Runtime.Workspace
	w.SetupTimeoutS, w.ExitGraceS, w.FinalizeTimeoutS = 30, 0.25, 30
	w.MaxSessionsPerSandbox, w.MaxChainDepth, w.MaxRecoveryArtifacts = 64, 500, 32
	cm := &c.Runtime.Command
	cm.MaxActivePerSandbox, cm.DefaultYieldMs, cm.MaxYieldMs = 32, 1000, 300000
	cm.ReadLinesDefault, cm.ReadLinesMax, cm.MaxTerminalEntries = 200, 1000, 512
	cm.MaxTranscriptWindowBytes, cm.MaxTranscriptBytes = mib, 64*mib
	cm.StdinWriteDeadlineS, cm.MaxStdinBytes, cm.PtyRows, cm.PtyCols = 2, mib, 50, 200
	cm.Env = map[string]string{}
	f := &c.Runtime.File
	f.ReadLinesDefault, f.ReadLinesMax, f.MaxOutputBytes = 2000, 2000, 262144
	f.MaxEditBytes, f.MaxReadFileBytes, f.MaxListEntries = 4*mib, 256*mib, 2000
	p := &c.Runtime.Publish
	p.ProtectedPaths, p.MaxPlanPaths, p.ExpansionLimit = []string{}, 10000, 4096
	p.MergeMaxFileBytes, p.MergeMaxEditDistance = 8*mib, 200000
	l := &c.Runtime.Layerstack
	l.RemountSweepWidth, l.FreezeBudgetS, l.SpoolZstdLevel = 4, 0.5, 3
	l.Autosquash.SquashAtNLayers = ptr(100)
	o := &c.Observability
	o.Enabled, o.MaxDiskBytes, o.MaxLineBytes = true, 4*mib, 16384
	o.ResourceStats.Enabled, o.ResourceStats.SampleIntervalMs, o.ResourceStats.MaxDiskBytes = true, 2000, mib
	o.FileActivity.Enabled, o.FileActivity.MaxRecords, o.FileActivity.CoalesceMs = true, 200000, 1000
	o.Sampling.MaxWalkNodes, o.Sampling.MaxWalkDepth = 1024, 64
	o.Views.ResourceWindowMs, o.Views.LayerDeltaDefaultLimit, o.Views.LayerDeltaMaxLimit = 600000, 500, 5000
	return c
}

// Load reads path; an absent file means all defaults. Every problem is an
// *Error (a config_error naming the key) that keeps its cause.
func Load(path string) (*Config, error) {
	c := Default()
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return c, nil
	}
	if err != nil {
		return nil, errorf("read config %s: %w", path, err)
	}
	if len(bytes.TrimSpace(b)) > 0 {
		d := yaml.NewDecoder(bytes.NewReader(b))
		d.KnownFields(true)
		if err := d.Decode(c); err != nil {
			return nil, errorf("config %s: %w", path, err)
		}
	}
	if err := c.validate(); err != nil {
		return nil, errorf("config %s: %w", path, err)
	}
	return c, nil
}

func (c *Config) validate() error {
	type rng struct {
		key    string
		v      float64
		lo, hi float64
	}
	inf := 1e300
	checks := []rng{
		{"supervisor.max_concurrent_connections", float64(c.Supervisor.MaxConcurrentConnections), 1, 4096},
		{"supervisor.max_request_bytes", float64(c.Supervisor.MaxRequestBytes), 65536, 16 * mib},
		{"supervisor.shutdown_grace_s", c.Supervisor.ShutdownGraceS, 0, inf},
		{"supervisor.max_active_commands", float64(c.Supervisor.MaxActiveCommands), 1, 4096},
		{"supervisor.max_sessions", float64(c.Supervisor.MaxSessions), 1, 4096},
		{"manager.max_sandboxes", float64(c.Manager.MaxSandboxes), 1, inf},
		{"manager.max_create_count", float64(c.Manager.MaxCreateCount), 1, 256},
		{"manager.max_workspace_entries", float64(c.Manager.MaxWorkspaceEntries), 1, inf},
		{"runtime.workspace.exit_grace_s", c.Runtime.Workspace.ExitGraceS, 0, 60},
		{"runtime.workspace.max_sessions_per_sandbox", float64(c.Runtime.Workspace.MaxSessionsPerSandbox), 1, 1024},
		{"runtime.workspace.max_chain_depth", float64(c.Runtime.Workspace.MaxChainDepth), 2, 500},
		{"runtime.workspace.max_recovery_artifacts", float64(c.Runtime.Workspace.MaxRecoveryArtifacts), 0, 1024},
		{"runtime.command.max_active_per_sandbox", float64(c.Runtime.Command.MaxActivePerSandbox), 1, float64(min(1024, c.Supervisor.MaxActiveCommands))},
		{"runtime.command.max_stdin_bytes", float64(c.Runtime.Command.MaxStdinBytes), 1, 16 * mib},
		{"runtime.command.pty_rows", float64(c.Runtime.Command.PtyRows), 1, 1000},
		{"runtime.command.pty_cols", float64(c.Runtime.Command.PtyCols), 1, 1000},
		{"runtime.file.read_lines_default", float64(c.Runtime.File.ReadLinesDefault), 1, float64(c.Runtime.File.ReadLinesMax)},
		{"runtime.file.max_output_bytes", float64(c.Runtime.File.MaxOutputBytes), 1, inf},
		{"runtime.file.max_edit_bytes", float64(c.Runtime.File.MaxEditBytes), 1, inf},
		{"runtime.file.max_read_file_bytes", float64(c.Runtime.File.MaxReadFileBytes), 1, inf},
		{"runtime.file.max_list_entries", float64(c.Runtime.File.MaxListEntries), 1, inf},
		{"runtime.layerstack.spool_zstd_level", float64(c.Runtime.Layerstack.SpoolZstdLevel), 1, 22},
		{"observability.max_disk_bytes", float64(c.Observability.MaxDiskBytes), mib, 16 * mib},
		{"observability.max_line_bytes", float64(c.Observability.MaxLineBytes), 1, 16384},
		{"observability.resource_stats.sample_interval_ms", float64(c.Observability.ResourceStats.SampleIntervalMs), 250, 600000},
		{"observability.resource_stats.max_disk_bytes", float64(c.Observability.ResourceStats.MaxDiskBytes), 128 << 10, 4 * mib},
		{"observability.file_activity.max_records", float64(c.Observability.FileActivity.MaxRecords), 1000, 10000000},
		{"observability.file_activity.coalesce_ms", float64(c.Observability.FileActivity.CoalesceMs), 10, 60000},
	}
	for _, r := range checks {
		if r.v < r.lo || r.v > r.hi {
			return fmt.Errorf("%s: %v is out of range", r.key, r.v)
		}
	}
	if c.Observability.ResourceStats.MaxDiskBytes%2 != 0 {
		return fmt.Errorf("observability.resource_stats.max_disk_bytes: %d is not even (two equal segments)", c.Observability.ResourceStats.MaxDiskBytes)
	}
	if c.Supervisor.RequestReadTimeoutS <= 0 {
		return fmt.Errorf("supervisor.request_read_timeout_s: must be > 0")
	}
	if c.Runtime.Command.DefaultYieldMs > c.Runtime.Command.MaxYieldMs {
		return fmt.Errorf("runtime.command.default_yield_ms: must be ≤ max_yield_ms")
	}
	enum := func(key, v string, allowed ...string) error {
		for _, a := range allowed {
			if v == a {
				return nil
			}
		}
		return fmt.Errorf("%s: %q is not one of %s", key, v, strings.Join(allowed, ", "))
	}
	for _, e := range []error{
		enum("images.pull", c.Images.Pull, "missing", "never"),
		enum("git.publish_refs", c.Git.PublishRefs, "merge", "rebase", "branch"),
		enum("sandbox.default_overlay", c.Sandbox.DefaultOverlay, "auto", "kernel", "fuse"),
		enum("sandbox.id_mapping", c.Sandbox.IDMapping, "single", "subid"),
		enum("network.isolated.helper", c.Network.Isolated.Helper, "auto", "pasta", "slirp4netns"),
	} {
		if e != nil {
			return e
		}
	}
	for _, l := range []struct {
		key string
		v   *string
	}{{"supervisor.listen", c.Supervisor.Listen}, {"http.listen", c.HTTP.Listen}} {
		if l.v == nil {
			continue
		}
		ep, err := catalog.ParseEndpoint(*l.v)
		if err != nil || ep.Network != "tcp" {
			return fmt.Errorf("%s: must be a tcp:// loopback literal", l.key)
		}
	}
	if h := c.Images.DockerHost; h != nil {
		u, err := url.Parse(*h)
		ok := err == nil && ((u.Scheme == "unix" && filepath.IsAbs(u.Path) && u.Host == "") || (u.Scheme == "tcp" && u.Host != ""))
		if !ok {
			return fmt.Errorf("images.docker_host: %q must be a unix:///abs/path or tcp://host:port URL", *h)
		}
	}
	if c.Images.CacheMaxBytes < 0 {
		return fmt.Errorf("images.cache_max_bytes: must be ≥ 0")
	}
	if c.Manager.WorkspaceRoots != nil && len(c.Manager.WorkspaceRoots) == 0 {
		return fmt.Errorf("manager.workspace_roots: must be a non-empty list")
	}
	for _, r := range c.Manager.WorkspaceRoots {
		if !filepath.IsAbs(r) {
			return fmt.Errorf("manager.workspace_roots: %q is not absolute", r)
		}
	}
	for _, r := range c.Manager.Export.AllowedRoots {
		if !filepath.IsAbs(r) || filepath.Clean(r) == "/" {
			return fmt.Errorf("manager.export.allowed_roots: %q must be an absolute path other than /", r)
		}
	}
	home, _ := os.UserHomeDir()
	for _, p := range c.Sandbox.HostPaths {
		p = filepath.Clean(p)
		if !filepath.IsAbs(p) || p == "/" || p == "/home" || (home != "" && (p == home || strings.HasPrefix(home, p+"/"))) {
			return fmt.Errorf("sandbox.host_paths: %q must be absolute, not /, and not a home directory or one containing it", p)
		}
	}
	if _, ok := c.ResourceProfiles[c.Sandbox.ResourceProfile]; !ok {
		return fmt.Errorf("sandbox.resource_profile: %q is not a key of resource_profiles", c.Sandbox.ResourceProfile)
	}
	for name, p := range c.ResourceProfiles {
		if p.MemoryHighBytes != nil && p.MemoryMaxBytes != nil && *p.MemoryHighBytes >= *p.MemoryMaxBytes {
			return fmt.Errorf("resource_profiles.%s: memory_high_bytes must be < memory_max_bytes", name)
		}
	}
	if n := c.Runtime.Layerstack.Autosquash.SquashAtNLayers; n != nil && *n < 3 {
		return fmt.Errorf("runtime.layerstack.autosquash.squash_at_n_layers: must be null or ≥ 3")
	}
	for k := range c.Runtime.Command.Env {
		if !envName(k) || k == "LD_PRELOAD" || k == "LD_LIBRARY_PATH" || k == "LD_AUDIT" || strings.HasPrefix(k, "BASH_FUNC_") {
			return fmt.Errorf("runtime.command.env: %q is not allowed", k)
		}
	}
	return nil
}

func envName(s string) bool {
	if s == "" {
		return false
	}
	for i, c := range s {
		alpha := c == '_' || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z')
		if !alpha && (i == 0 || c < '0' || c > '9') {
			return false
		}
	}
	return true
}
