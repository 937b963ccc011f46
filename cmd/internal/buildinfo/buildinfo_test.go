package buildinfo

import (
	"runtime/debug"
	"testing"
)

func TestVersion(t *testing.T) {
	vcs := func(rev, modified string) []debug.BuildSetting {
		return []debug.BuildSetting{{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: rev}, {Key: "vcs.modified", Value: modified}}
	}
	const rev = "cd8f0a9c0ffee0123456789abcdef0123456789a"
	for _, tc := range []struct {
		name   string
		linked string
		bi     *debug.BuildInfo
		want   string
	}{
		{"linked wins", "v9.8.7", &debug.BuildInfo{Main: debug.Module{Version: "v1.2.3"}, Settings: vcs(rev, "false")}, "v9.8.7"},
		{"go install @version", "", &debug.BuildInfo{Main: debug.Module{Version: "v1.2.3"}}, "v1.2.3"},
		{"go build stamps a pseudo-version", "", &debug.BuildInfo{Main: debug.Module{Version: "v0.0.0-20261205082542-cd8f0a9c0ffe+dirty"}, Settings: vcs(rev, "true")}, "v0.0.0-20261205082542-cd8f0a9c0ffe+dirty"},
		{"revision only", "", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: vcs(rev, "false")}, "devel-cd8f0a9c0ffe"},
		{"modified revision", "", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: vcs(rev, "true")}, "devel-cd8f0a9c0ffe-dirty"},
		{"-buildvcs=false", "", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, "dev"},
		{"no build info", "", nil, "dev"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := version(tc.linked, tc.bi); got != tc.want {
				t.Errorf("version = %q, want %q", got, tc.want)
			}
		})
	}
}
