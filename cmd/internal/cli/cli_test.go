package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
	"github.com/ephemeral-ai-lab/sandbox/cmd/internal/clitest"
)

var uuidV4 = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

// isolate points the client at a private home and, unless sock is "", at a
// socket; autostart is off.
func isolate(t *testing.T, sock string) string {
	t.Helper()
	home := t.TempDir()
	t.Setenv("EPHEMERAL_SANDBOX_HOME", home)
	t.Setenv("SANDBOX_NO_AUTOSTART", "1")
	t.Setenv(TokenEnv, "")
	t.Setenv("SANDBOX_SUPERVISOR_SOCKET", sock)
	return home
}

type result struct {
	code           int
	stdout, stderr string
}

func runCLI(g catalog.Group, ops []catalog.Op, args ...string) result {
	var out, errb bytes.Buffer
	if ops == nil {
		ops = catalog.GroupOps(g)
	}
	code := run(g, ops, args, &out, &errb)
	return result{code, out.String(), errb.String()}
}

func decodeLine(t *testing.T, s string) map[string]any {
	t.Helper()
	if strings.Count(s, "\n") != 1 || !strings.HasSuffix(s, "\n") {
		t.Fatalf("want exactly one JSON line, got %q", s)
	}
	d := json.NewDecoder(strings.NewReader(s))
	d.UseNumber()
	var m map[string]any
	if err := d.Decode(&m); err != nil {
		t.Fatalf("not JSON: %q: %v", s, err)
	}
	return m
}

func errorOf(t *testing.T, s string) (kind, msg string) {
	t.Helper()
	m := decodeLine(t, s)
	e, ok := m["error"].(map[string]any)
	if !ok {
		t.Fatalf("no error envelope: %q", s)
	}
	if _, ok := e["details"].(map[string]any); !ok {
		t.Fatalf("envelope without details object: %q", s)
	}
	kind, _ = e["kind"].(string)
	msg, _ = e["message"].(string)
	return kind, msg
}

func TestGroupHelpListsFamiliesAndOps(t *testing.T) {
	sup := clitest.NewUnix(t, clitest.Echo)
	isolate(t, sup.Path)
	for _, g := range []catalog.Group{catalog.Management, catalog.Runtime, catalog.Observability} {
		r := runCLI(g, nil, "help")
		if r.code != 0 || r.stderr != "" {
			t.Fatalf("%s help: code %d stderr %q", g, r.code, r.stderr)
		}
		lines := strings.Split(r.stdout, "\n")
		// Every operation appears, in catalog order.
		last := -1
		for _, op := range catalog.GroupOps(g) {
			i := indexOfPrefix(lines, "  "+op.ID+" ")
			if i < 0 {
				t.Fatalf("%s help lacks %s:\n%s", g, op.ID, r.stdout)
			}
			if i < last {
				t.Errorf("%s help: %s out of catalog order", g, op.ID)
			}
			last = i
		}
		// Headings: capability families and families with operations, in
		// catalog order; empty non-capability families are skipped.
		last = -1
		for _, f := range catalog.Families() {
			if f.Group != g {
				continue
			}
			heading := f.Name + " "
			if f.Capability {
				heading = f.Name + " (capability) "
			}
			i := indexOfPrefix(lines, heading)
			hasOps := false
			for _, op := range catalog.GroupOps(g) {
				hasOps = hasOps || op.Family == f.Name
			}
			switch {
			case f.Capability || hasOps:
				if i < 0 || i < last {
					t.Errorf("%s help: heading %q missing or out of order:\n%s", g, heading, r.stdout)
				}
				if !strings.Contains(lines[max(i, 0)], f.Help) {
					t.Errorf("%s help: heading %q without its help", g, f.Name)
				}
				last = i
			case i >= 0:
				t.Errorf("%s help: empty family %q listed", g, f.Name)
			}
		}
		for _, flag := range []string{"--endpoint", "--auth-token", "--request-id"} {
			if !strings.Contains(r.stdout, flag) {
				t.Errorf("%s help lacks global flag %s", g, flag)
			}
		}
	}
	if n := len(sup.Requests()); n != 0 {
		t.Fatalf("help contacted the supervisor %d times", n)
	}
}

func indexOfPrefix(lines []string, p string) int {
	for i, l := range lines {
		if strings.HasPrefix(l, p) {
			return i
		}
	}
	return -1
}

func TestOpHelpListsFlags(t *testing.T) {
	sup := clitest.NewUnix(t, clitest.Echo)
	isolate(t, sup.Path)
	for _, g := range []catalog.Group{catalog.Management, catalog.Runtime, catalog.Observability} {
		for _, op := range catalog.GroupOps(g) {
			for _, args := range [][]string{{"help", op.ID}, {op.ID, "--help"}} {
				r := runCLI(g, nil, args...)
				if r.code != 0 || r.stderr != "" {
					t.Fatalf("%v: code %d stderr %q", args, r.code, r.stderr)
				}
				for _, a := range op.Args {
					line, lead := "", "--"+a.FlagName()
					if a.Positional != "" {
						lead = a.Positional + " (positional)"
					}
					for _, l := range strings.Split(r.stdout, "\n") {
						if strings.HasPrefix(strings.TrimSpace(l), lead) {
							line = l
						}
					}
					if line == "" {
						t.Fatalf("%v: no line for --%s:\n%s", args, a.FlagName(), r.stdout)
					}
					req := "no"
					if a.Required {
						req = "yes"
					}
					if !strings.Contains(line, a.Kind.String()) || !strings.Contains(line, " "+req+" ") {
						t.Errorf("%v: line %q lacks kind %s / required %s", args, line, a.Kind, req)
					}
					if d := a.DefaultText(); d != "" && !strings.Contains(line, d) {
						t.Errorf("%v: line %q lacks default %s", args, line, d)
					}
					for _, al := range a.FlagAliases {
						if !strings.Contains(line, "--"+al) {
							t.Errorf("%v: line %q lacks alias --%s", args, line, al)
						}
					}
				}
			}
		}
	}
	// Runtime help needs no --sandbox-id.
	if r := runCLI(catalog.Runtime, nil, "help", "file_read"); r.code != 0 || !strings.Contains(r.stdout, "--path") {
		t.Fatalf("runtime help file_read: %+v", r)
	}
	if n := len(sup.Requests()); n != 0 {
		t.Fatalf("help contacted the supervisor %d times", n)
	}
}

func TestNoFlagCollidesWithGlobals(t *testing.T) {
	for _, g := range []catalog.Group{catalog.Management, catalog.Runtime, catalog.Observability} {
		globals := map[string]bool{"endpoint": true, "gateway-endpoint": true, "auth-token": true, "request-id": true, "help": true}
		if g == catalog.Management {
			globals["progress"] = true
		}
		if g == catalog.Runtime {
			globals["sandbox-id"] = true
		}
		for _, op := range catalog.GroupOps(g) {
			for _, a := range op.Args {
				for _, n := range append([]string{a.FlagName()}, a.FlagAliases...) {
					if globals[n] && a.Positional == "" {
						t.Errorf("%s %s: flag --%s collides with a global flag", g, op.ID, n)
					}
				}
			}
		}
	}
}

func TestConvertFlag(t *testing.T) {
	arg := func(k catalog.Kind) *catalog.Arg { return &catalog.Arg{Name: "x", Kind: k} }
	ok := []struct {
		kind catalog.Kind
		in   string
		want any
	}{
		{catalog.String, "a b", "a b"},
		{catalog.String, "", ""},
		{catalog.Path, "/w", "/w"},
		{catalog.Integer, "0", uint64(0)},
		{catalog.Integer, "18446744073709551615", uint64(18446744073709551615)},
		{catalog.Float, "0.5", 0.5},
		{catalog.Float, "-2e3", -2000.0},
		{catalog.Boolean, "true", true},
		{catalog.Boolean, "false", false},
		{catalog.JSONArray, `[1,"a",{"b":null}]`, []any{json.Number("1"), "a", map[string]any{"b": nil}}},
		{catalog.JSONArray, `[]`, []any{}},
	}
	for _, c := range ok {
		got, err := ConvertFlag(arg(c.kind), c.in)
		if err != nil || !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s %q: got %#v, %v; want %#v", c.kind, c.in, got, err, c.want)
		}
	}
	bad := []struct {
		kind catalog.Kind
		in   string
		msg  string
	}{
		{catalog.Integer, "-1", "x must be an unsigned integer"},
		{catalog.Integer, "+1", "x must be an unsigned integer"},
		{catalog.Integer, "1.0", "x must be an unsigned integer"},
		{catalog.Integer, "0x10", "x must be an unsigned integer"},
		{catalog.Integer, "18446744073709551616", "x must be an unsigned integer"},
		{catalog.Integer, "", "x must be an unsigned integer"},
		{catalog.Float, "NaN", "x must be a finite number"},
		{catalog.Float, "Inf", "x must be a finite number"},
		{catalog.Float, "1e999", "x must be a finite number"},
		{catalog.Float, "0x1p3", "x must be a finite number"},
		{catalog.Boolean, "yes", "x must be a boolean"},
		{catalog.Boolean, "1", "x must be a boolean"},
		{catalog.JSONArray, `{"a":1}`, "x must be an array"},
		{catalog.JSONArray, `[1] [2]`, "x must be an array"},
		{catalog.JSONArray, `null`, "x must be an array"},
		{catalog.JSONArray, `[1`, "x must be an array"},
	}
	for _, c := range bad {
		_, err := ConvertFlag(arg(c.kind), c.in)
		if err == nil || err.Kind != catalog.InvalidRequest || err.Message != c.msg {
			t.Errorf("%s %q: got %v, want %q", c.kind, c.in, err, c.msg)
		}
	}
}

// synthetic operations exercise kinds and projections the catalog does not
// declare yet (positional, Boolean, Float, system|sandbox scope).
var synthRuntime = []catalog.Op{{
	ID: "do_things", Group: catalog.Runtime, Family: "command", Scope: catalog.ScopeSandbox, Summary: "Synthetic.",
	Args: []catalog.Arg{
		{Name: "cmd", Kind: catalog.String, Required: true, Positional: "COMMAND"},
		{Name: "flag_on", Kind: catalog.Boolean},
		{Name: "flag_off", Kind: catalog.Boolean},
		{Name: "ratio", Kind: catalog.Float},
		{Name: "items", Kind: catalog.JSONArray},
		{Name: "big", Kind: catalog.Integer},
		{Name: "dflt", Kind: catalog.Integer, Default: uint64(7)},
		{Name: "the_path", Kind: catalog.Path, Flag: "where", FlagAliases: []string{"where-alias"}},
	},
}}

var synthObservability = []catalog.Op{{
	ID: "snap", Group: catalog.Observability, Family: "snap", Scope: catalog.ScopeSystemOrSandbox, Summary: "Synthetic.",
	Args: []catalog.Arg{{Name: "sandbox_id", Kind: catalog.String, ID: true}},
}}

func TestFlagsToArgs(t *testing.T) {
	sup := clitest.NewUnix(t, clitest.Echo)
	isolate(t, sup.Path)
	r := runCLI(catalog.Runtime, synthRuntime, "--sandbox-id", "sbx-1", "do_things",
		"--flag-on", "--flag-off=false", "--ratio", "0.25", "--items", `[1,{"a":"b"}]`,
		"--big", "18446744073709551615", "--where-alias", "/x", "echo hi")
	if r.code != 0 {
		t.Fatalf("code %d stderr %q", r.code, r.stderr)
	}
	reqs := sup.Requests()
	if len(reqs) != 1 {
		t.Fatalf("%d requests", len(reqs))
	}
	want := map[string]any{
		"cmd": "echo hi", "flag_on": true, "flag_off": false, "ratio": json.Number("0.25"),
		"items": []any{json.Number("1"), map[string]any{"a": "b"}}, "big": json.Number("18446744073709551615"),
		"dflt": json.Number("7"), "the_path": "/x",
	}
	if got := reqs[0]["args"]; !reflect.DeepEqual(got, want) {
		t.Fatalf("args = %#v\nwant %#v", got, want)
	}
	if !reflect.DeepEqual(reqs[0]["scope"], map[string]any{"kind": "sandbox", "sandbox_id": "sbx-1"}) {
		t.Fatalf("scope = %v", reqs[0]["scope"])
	}

	for _, c := range []struct {
		args []string
		msg  string
	}{
		{[]string{"--sandbox-id", "sbx-1", "do_things"}, "cmd is required for do_things"},
		{[]string{"--sandbox-id", "sbx-1", "do_things", "a", "b"}, "unexpected argument for do_things: b (quote COMMAND as one argument)"},
		{[]string{"--sandbox-id", "sbx-1", "do_things", "--flag-on=maybe", "x"}, "flag_on must be a boolean"},
		{[]string{"--sandbox-id", "sbx-1", "do_things", "--ratio", "x", "x"}, "ratio must be a finite number"},
		{[]string{"--sandbox-id", "sbx-1", "do_things", "--items", "[", "x"}, "items must be an array"},
	} {
		r := runCLI(catalog.Runtime, synthRuntime, c.args...)
		if r.code != 2 || r.stdout != "" {
			t.Errorf("%v: %+v", c.args, r)
			continue
		}
		if _, msg := errorOf(t, r.stderr); msg != c.msg {
			t.Errorf("%v: message %q, want %q", c.args, msg, c.msg)
		}
	}
	if len(sup.Requests()) != 1 {
		t.Fatal("a usage error reached the supervisor")
	}
}

func TestUsageErrors(t *testing.T) {
	sup := clitest.NewUnix(t, clitest.Echo)
	isolate(t, sup.Path)
	M, R, O := catalog.Management, catalog.Runtime, catalog.Observability
	cases := []struct {
		g      catalog.Group
		args   []string
		kind   string
		msg    string
		prefix bool
	}{
		{M, []string{"bogus"}, "invalid_request", "unknown operation: bogus", false},
		{M, []string{"--endpoint", "/x", "bogus", "--flag"}, "invalid_request", "unknown operation: bogus", false},
		{M, []string{}, "invalid_request", "an operation is required; run `sandbox-manager-cli help`", false},
		{M, []string{"help", "bogus"}, "invalid_request", "unknown operation: bogus", false},
		{M, []string{"completion", "bash"}, "invalid_request", "unknown operation: completion", false},
		{M, []string{"file_read"}, "invalid_request", "unknown operation: file_read", false},
		{M, []string{"create_sandbox"}, "invalid_request", "workspace_root is required for create_sandbox", false},
		{M, []string{"create_sandbox", "--workspace-root", "/w", "--count", "1.5"}, "invalid_request", "count must be an unsigned integer", false},
		{M, []string{"create_sandbox", "--workspace-root", "/w", "--count", "-1"}, "invalid_request", "count must be an unsigned integer", false},
		{M, []string{"create_sandbox", "--workspace-root", "/w", "--count", "0"}, "invalid_request", "count must be at least 1", false},
		{M, []string{"create_sandbox", "--workspace-bind-root", "/w", "--overlay", "zfs"}, "invalid_request", "overlay must be one of auto, kernel, fuse", false},
		{M, []string{"create_sandbox", "--workspace-root", "/w", "--nope"}, "invalid_request", "unknown flag: --nope", true},
		{M, []string{"create_sandbox", "--workspace-root"}, "invalid_request", "flag needs an argument", true},
		{M, []string{"list_sandboxes", "extra"}, "invalid_request", "unexpected argument for list_sandboxes: extra", true},
		{M, []string{"inspect_sandbox", "--sandbox-id", "bad id"}, "invalid_request", "sandbox_id must match [A-Za-z0-9._:-]{1,128}", false},
		{M, []string{"--request-id", "bad id", "list_sandboxes"}, "invalid_request", "--request-id must be 1-128 characters of [A-Za-z0-9._:-]", false},
		{M, []string{"--endpoint", "relative", "list_sandboxes"}, "config_error", "invalid endpoint \"relative\"", true},
		{M, []string{"--gateway-endpoint", "tcp://10.0.0.1:9", "list_sandboxes"}, "config_error", "invalid endpoint", true},
		{M, []string{"--endpoint", "tcp://127.0.0.1:9", "list_sandboxes"}, "config_error", "no gateway token", true},
		{R, []string{"file_read", "--path", "a"}, "invalid_request", "--sandbox-id is required for runtime operations", false},
		{R, []string{"file_read", "--sandbox-id", "sbx-1", "--path", "a"}, "invalid_request", "--sandbox-id must precede the operation", false},
		{R, []string{"--sandbox-id", "sbx-1", "file_read", "--sandbox-id=sbx-2", "--path", "a"}, "invalid_request", "--sandbox-id must precede the operation", false},
		{R, []string{"--sandbox-id", "", "file_read", "--path", "a"}, "invalid_request", "--sandbox-id must be non-empty", false},
		{R, []string{"--sandbox-id=  ", "file_read", "--path", "a"}, "invalid_request", "--sandbox-id must be non-empty", false},
		{R, []string{"--sandbox-id", "sbx-1", "file_read"}, "invalid_request", "path is required for file_read", false},
		{R, []string{"--sandbox-id", "sbx-1", "file_read", "--path", "a", "--limit", "5000"}, "invalid_request", "limit must be between 1 and 2000", false},
		{R, []string{"--sandbox-id", "sbx-1", "file_edit", "--path", "a", "--edits", `{"a":1}`}, "invalid_request", "edits must be an array", false},
		{R, []string{"--sandbox-id", "sbx-1", "create_sandbox"}, "invalid_request", "unknown operation: create_sandbox", false},
		{R, []string{"--sandbox-id", "sbx-1", "help", "a", "b"}, "invalid_request", "help takes at most one operation", false},
		{O, []string{"health", "--sandbox-id", "x"}, "invalid_request", "unknown flag: --sandbox-id", true},
		{O, []string{"--progress", "health"}, "invalid_request", "unknown flag: --progress", true},
	}
	for _, c := range cases {
		r := runCLI(c.g, nil, c.args...)
		if r.code != 2 || r.stdout != "" {
			t.Errorf("%s %v: code %d stdout %q stderr %q", c.g, c.args, r.code, r.stdout, r.stderr)
			continue
		}
		kind, msg := errorOf(t, r.stderr)
		if kind != c.kind || (c.prefix && !strings.HasPrefix(msg, c.msg)) || (!c.prefix && msg != c.msg) {
			t.Errorf("%s %v: got %s %q, want %s %q", c.g, c.args, kind, msg, c.kind, c.msg)
		}
	}
	if n := len(sup.Requests()); n != 0 {
		t.Fatalf("usage errors reached the supervisor %d times: %v", n, sup.RawLines())
	}
	// The exact envelope of the contract's example.
	r := runCLI(M, nil, "X")
	if r.stderr != `{"error":{"kind":"invalid_request","message":"unknown operation: X","details":{}}}`+"\n" {
		t.Fatalf("envelope %q", r.stderr)
	}
}

func TestRequestLine(t *testing.T) {
	sup := clitest.NewUnix(t, clitest.Lines(`{"id":"sbx-1","state":"ready","html":"<b>&"}`))
	isolate(t, sup.Path)

	r := runCLI(catalog.Management, nil, "create_sandbox", "--workspace-bind-root", "/w", "--name", "n")
	if r.code != 0 || r.stderr != "" {
		t.Fatalf("code %d stderr %q", r.code, r.stderr)
	}
	if r.stdout != `{"html":"<b>&","id":"sbx-1","state":"ready"}`+"\n" {
		t.Fatalf("stdout %q", r.stdout)
	}
	runCLI(catalog.Runtime, nil, "--sandbox-id", "sbx-1", "--request-id", "my.req:1", "file_read", "--path", "src/a.go")
	runCLI(catalog.Management, nil, "inspect_sandbox", "--sandbox-id", "sbx-2")
	runCLI(catalog.Observability, nil, "health")
	runCLI(catalog.Observability, synthObservability, "snap", "--sandbox-id", "sbx-3")
	runCLI(catalog.Observability, synthObservability, "snap")

	reqs := sup.Requests()
	if len(reqs) != 6 {
		t.Fatalf("%d requests: %v", len(reqs), sup.RawLines())
	}
	sys := map[string]any{"kind": "system"}
	want := []map[string]any{
		{"op": "create_sandbox", "scope": sys, "_stream_logs": false,
			"args": map[string]any{"workspace_root": "/w", "name": "n", "image": "host", "count": json.Number("1")}},
		{"op": "file_read", "scope": map[string]any{"kind": "sandbox", "sandbox_id": "sbx-1"}, "_stream_logs": false, "request_id": "my.req:1",
			"args": map[string]any{"path": "src/a.go", "offset": json.Number("1"), "limit": json.Number("2000")}},
		{"op": "inspect_sandbox", "scope": sys, "_stream_logs": false, "args": map[string]any{"sandbox_id": "sbx-2"}},
		{"op": "health", "scope": sys, "_stream_logs": false, "args": map[string]any{}},
		{"op": "snap", "scope": map[string]any{"kind": "sandbox", "sandbox_id": "sbx-3"}, "_stream_logs": false, "args": map[string]any{"sandbox_id": "sbx-3"}},
		{"op": "snap", "scope": sys, "_stream_logs": false, "args": map[string]any{}},
	}
	for i, req := range reqs {
		id, _ := req["request_id"].(string)
		if _, given := want[i]["request_id"]; !given {
			if !uuidV4.MatchString(id) {
				t.Errorf("request %d: request_id %q is not a UUIDv4", i, id)
			}
			want[i]["request_id"] = id
		}
		if !reflect.DeepEqual(req, want[i]) {
			t.Errorf("request %d:\n got %v\nwant %v", i, req, want[i])
		}
	}
	if reqs[0]["request_id"] == reqs[2]["request_id"] {
		t.Error("request ids repeat")
	}
}

func TestProgress(t *testing.T) {
	sup := clitest.NewUnix(t, clitest.Lines(`cli_log("snapshotting workspace")`, `cli_log("done \"ok\"")`, `{"id":"sbx-1"}`))
	isolate(t, sup.Path)
	r := runCLI(catalog.Management, nil, "--progress", "create_sandbox", "--workspace-root", "/w")
	if r.code != 0 || r.stdout != `{"id":"sbx-1"}`+"\n" {
		t.Fatalf("%+v", r)
	}
	lines := strings.Split(strings.TrimSuffix(r.stderr, "\n"), "\n")
	re := regexp.MustCompile(`^\[progress \d+\.\ds\] (.*)$`)
	if len(lines) != 2 || re.FindStringSubmatch(lines[0]) == nil || re.FindStringSubmatch(lines[0])[1] != "snapshotting workspace" ||
		re.FindStringSubmatch(lines[1]) == nil || re.FindStringSubmatch(lines[1])[1] != `done "ok"` {
		t.Fatalf("stderr %q", r.stderr)
	}
	if got := sup.Requests()[0]["_stream_logs"]; got != true {
		t.Fatalf("_stream_logs = %v", got)
	}
}

func TestSupervisorErrorsAndTransport(t *testing.T) {
	env := `{"error":{"kind":"not_found","message":"sandbox not found: sbx-9","details":{"sandbox_id":"sbx-9"}}}`
	sup := clitest.NewUnix(t, clitest.Lines(env))
	isolate(t, sup.Path)
	r := runCLI(catalog.Management, nil, "inspect_sandbox", "--sandbox-id", "sbx-9")
	if r.code != 1 || r.stdout != "" || !reflect.DeepEqual(decodeLine(t, r.stderr), decodeLine(t, env+"\n")) {
		t.Fatalf("error envelope: %+v", r)
	}

	for _, c := range []struct {
		reply clitest.Reply
		kind  string
	}{
		{clitest.Lines("not json"), catalog.ProtocolError},
		{clitest.Lines(`{"a":1} {"b":2}`), catalog.ProtocolError},
		{clitest.Lines(), catalog.ConnectionError},
	} {
		s := clitest.NewUnix(t, c.reply)
		r := runCLI(catalog.Management, nil, "--endpoint", s.Endpoint, "list_sandboxes")
		if kind, _ := errorOf(t, r.stderr); r.code != 1 || r.stdout != "" || kind != c.kind {
			t.Errorf("want %s exit 1, got %+v", c.kind, r)
		}
	}
}

func TestConnectionRefused(t *testing.T) {
	dir, err := os.MkdirTemp("", "esbx-refused-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "supervisor.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	ln.Close() // the socket file stays: connect is refused
	isolate(t, sock)
	for _, args := range [][]string{{"list_sandboxes"}, {"--endpoint", sock, "list_sandboxes"}} {
		r := runCLI(catalog.Management, nil, args...)
		kind, msg := errorOf(t, r.stderr)
		if r.code != 1 || r.stdout != "" || kind != catalog.ConnectionError || !strings.Contains(msg, "refused") {
			t.Errorf("%v: %+v", args, r)
		}
	}
}

func TestEndpointAndToken(t *testing.T) {
	home := isolate(t, "")
	c, err := NewConn("", false, "")
	if err != nil || c.Endpoint().Address != filepath.Join(home, "run", "supervisor.sock") || !c.Autostart() {
		t.Fatalf("default endpoint: %+v %v", c, err)
	}
	if c, err := NewConn("unix:///tmp/x.sock", true, ""); err != nil || c.Autostart() || c.Endpoint().Address != "/tmp/x.sock" {
		t.Fatalf("--endpoint unix: %+v %v", c, err)
	}
	t.Setenv("SANDBOX_SUPERVISOR_SOCKET", "tcp://127.0.0.1:1")
	if c, err := NewConn("", false, ""); err != nil || c.Autostart() {
		t.Fatalf("tcp default must not autostart: %+v %v", c, err)
	}
	t.Setenv("SANDBOX_SUPERVISOR_SOCKET", "")

	tcp := clitest.NewTCP(t, clitest.Echo)
	if r := runCLI(catalog.Management, nil, "--endpoint", tcp.Endpoint, "--auth-token", "flagtok", "list_sandboxes"); r.code != 0 {
		t.Fatalf("%+v", r)
	}
	t.Setenv(TokenEnv, "envtok")
	if r := runCLI(catalog.Management, nil, "--endpoint", tcp.Endpoint, "list_sandboxes"); r.code != 0 {
		t.Fatalf("%+v", r)
	}
	t.Setenv(TokenEnv, "")
	if err := os.MkdirAll(filepath.Join(home, "config"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(home, "config", "gateway.token"), []byte("filetok\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if r := runCLI(catalog.Management, nil, "--endpoint", tcp.Endpoint, "list_sandboxes"); r.code != 0 {
		t.Fatalf("%+v", r)
	}
	var toks []any
	for _, req := range tcp.Requests() {
		toks = append(toks, req[catalog.TokenField])
	}
	if !reflect.DeepEqual(toks, []any{"flagtok", "envtok", "filetok"}) {
		t.Fatalf("tokens %v", toks)
	}

	unix := clitest.NewUnix(t, clitest.Echo)
	runCLI(catalog.Management, nil, "--endpoint", unix.Endpoint, "--auth-token", "flagtok", "list_sandboxes")
	if _, sent := unix.Requests()[0][catalog.TokenField]; sent {
		t.Fatal("token sent on a Unix endpoint")
	}
}

// --max-output-tokens bounds the output the CLI prints (head, marker with
// the omitted offsets, tail) and is never sent to the supervisor; without
// it the output is printed whole.
func TestMaxOutputTokens(t *testing.T) {
	var rows []string
	for i := range 100 {
		rows = append(rows, fmt.Sprintf("row %02d", i))
	}
	b, _ := json.Marshal(map[string]any{"status": "ok", "command_session_id": "cmd-1", "start_offset": 10, "end_offset": 110,
		"total_lines": 110, "output": strings.Join(rows, "\n")})
	sup := clitest.NewUnix(t, clitest.Lines(string(b)))
	isolate(t, sup.Path)
	r := runCLI(catalog.Runtime, nil, "--sandbox-id", "sbx-1", "read_command_lines", "--command-session-id", "cmd-1", "--max-output-tokens", "20")
	if r.code != 0 {
		t.Fatalf("%+v", r)
	}
	m := decodeLine(t, r.stdout)
	out := m["output"].(string)
	tr, _ := m["output_truncated"].(map[string]any)
	// 80 characters: 5 rows of 7 from each end, offsets shifted by start_offset.
	if tr == nil || tr["omitted_start_offset"] != json.Number("15") || tr["omitted_end_offset"] != json.Number("105") ||
		!strings.HasPrefix(out, "row 00\n") || !strings.HasSuffix(out, "\nrow 99") || !strings.Contains(out, "start_offset=15") {
		t.Fatalf("bounded output: %v", m)
	}
	if a := sup.Requests()[0]["args"].(map[string]any); a["max_output_tokens"] != nil {
		t.Fatalf("client-side argument sent: %v", a)
	}
	r = runCLI(catalog.Runtime, nil, "--sandbox-id", "sbx-1", "read_command_lines", "--command-session-id", "cmd-1")
	if m := decodeLine(t, r.stdout); m["output"] != strings.Join(rows, "\n") || m["output_truncated"] != nil {
		t.Fatalf("unbounded output: %v", m)
	}
}

func TestStripANSI(t *testing.T) {
	for in, want := range map[string]string{
		"\x1b[31mred\x1b[0m":                    "red",
		"a\x1b]8;;http://x\x07link\x1b]8;;\x07": "alink",
		"\x1b[2K\x1b[1Gdone":                    "done",
		"plain\ttext":                           "plain\ttext",
		"lone \x1b":                             "lone ",
	} {
		if got := StripANSI(in); got != want {
			t.Errorf("StripANSI(%q) = %q, want %q", in, got, want)
		}
	}
}

// --output text renders for people: tables for lists, the command output
// with a status line, a publish summary, diffs, errors; json stays the default.
func TestOutputText(t *testing.T) {
	cases := []struct {
		name, reply string
		args        []string
		want        []string // substrings of stdout, in order
	}{
		{"list", `{"sandboxes":[{"id":"sbx-1","state":"ready"},{"id":"sbx-2","state":"stopped"}]}`,
			[]string{"list_sandboxes"}, []string{"sandboxes:", "ID     STATE", "sbx-1  ready", "sbx-2  stopped"}},
		{"command", `{"status":"ok","exit_code":0,"output":"hello\nworld","command_session_id":"cmd-1","workspace_session_id":"ws-1","start_offset":0,"end_offset":2,"total_lines":2}`,
			[]string{"--sandbox-id", "sbx-1", "exec_command", "echo"}, []string{"hello\nworld\n", "[ok, exit 0; rows 0-2 of 2; command cmd-1; session ws-1]"}},
		{"publish", `{"workspace_session_id":"ws-1","dry_run":false,"destroyed":true,"publish":{"layer_id":"L2-ab","summary":{"result":"published","published_paths":3,"changed_paths":3,"merged_paths":1,"kept_head_paths":0,"conflict_paths":0}}}`,
			[]string{"--sandbox-id", "sbx-1", "publish_workspace_session", "--workspace-session-id", "ws-1"}, []string{"published 3 of 3 changed paths (1 merged) as layer L2-ab", "session ws-1 closed"}},
		{"publish with git state", `{"workspace_session_id":"ws-1","dry_run":false,"destroyed":true,"publish":{"layer_id":"L3-ab","summary":{"result":"published","published_paths":1,"changed_paths":4,"merged_paths":0,"kept_head_paths":0,"conflict_paths":0,"git_private_paths":2,"git_protected_paths":1}}}`,
			[]string{"--sandbox-id", "sbx-1", "publish_workspace_session", "--workspace-session-id", "ws-1"}, []string{"published 1 of 4 changed paths (0 merged) as layer L3-ab", "kept 3 paths of the git directory in the session"}},
		{"publish with commits", `{"workspace_session_id":"ws-1","dry_run":false,"destroyed":true,"publish":{"layer_id":"L4-ab","summary":{"result":"published","published_paths":2,"changed_paths":3,"merged_paths":0,"kept_head_paths":0,"conflict_paths":0},"git_refs":[{"git_dir":".git","ref":"refs/heads/main","action":"merge","new":"0123456789abcdef0123456789abcdef01234567","session_commits":[{"commit":"89abcdef0123456789abcdef0123456789abcdef","author":"Agent <a@x>","subject":"A edits f1"}]}]}}`,
			[]string{"--sandbox-id", "sbx-1", "publish_workspace_session", "--workspace-session-id", "ws-1"}, []string{"git refs/heads/main: merge → 0123456789ab", "  commit 89abcdef0123 A edits f1 (Agent <a@x>)"}},
		{"publish keep", `{"workspace_session_id":"ws-1","dry_run":false,"destroyed":false,"kept":true,"base_revision":{"manifest_version":7},"publish":{"layer_id":"L7-ab","summary":{"result":"published","published_paths":1,"changed_paths":1,"merged_paths":0,"kept_head_paths":0,"conflict_paths":0}}}`,
			[]string{"--sandbox-id", "sbx-1", "publish_workspace_session", "--workspace-session-id", "ws-1", "--keep"}, []string{"published 1 of 1 changed paths (0 merged) as layer L7-ab", "session ws-1 continues on the new head (manifest version 7)"}},
		{"sync", `{"workspace_session_id":"ws-1","dry_run":false,"sync":{"result":"synced","no_op":false,"base_revision":{"manifest_version":9},"kept_paths":2,"changed_paths":3,"merged_paths":1,"kept_head_paths":1,"conflict_paths":0}}`,
			[]string{"--sandbox-id", "sbx-1", "sync_workspace_session", "--workspace-session-id", "ws-1"}, []string{"synced onto manifest version 9: kept 2 of 3 changed paths (1 merged)", "took the head's version of 1 paths (theirs)", "session ws-1"}},
		{"diff", `{"against":"base","files":[{"path":"a.txt","status":"modified","diff":"--- a/a.txt\n+++ b/a.txt\n@@ -1 +1 @@\n-a\n+b\n"}]}`,
			[]string{"--sandbox-id", "sbx-1", "diff_workspace_session", "--workspace-session-id", "ws-1"}, []string{"modified a.txt", "-a\n+b\n"}},
		{"blame", `{"path":"a.txt","view":"head","line_count":3,"ranges":[{"start_line":1,"line_count":2,"owner":"original"},{"start_line":3,"line_count":1,"owner":"workspace_session:ws-1","command_session_id":"cmd-1"}]}`,
			[]string{"--sandbox-id", "sbx-1", "file_blame", "--path", "a.txt"}, []string{"a.txt (3 lines, head view)", "1-2    original", "3-3    workspace_session:ws-1  cmd-1"}},
	}
	for _, tc := range cases {
		sup := clitest.NewUnix(t, clitest.Lines(tc.reply))
		isolate(t, sup.Path)
		g := catalog.Runtime
		if tc.name == "list" {
			g = catalog.Management
		}
		r := runCLI(g, nil, append([]string{"--output", "text"}, tc.args...)...)
		if r.code != 0 {
			t.Fatalf("%s: %+v", tc.name, r)
		}
		rest := r.stdout
		for _, w := range tc.want {
			i := strings.Index(rest, w)
			if i < 0 {
				t.Errorf("%s: %q not in (the rest of) %q", tc.name, w, r.stdout)
				break
			}
			rest = rest[i+len(w):]
		}
	}
	sup := clitest.NewUnix(t, clitest.Lines(`{"error":{"kind":"not_found","message":"sandbox not found: sbx-9","details":{"sandbox_id":"sbx-9"}}}`))
	isolate(t, sup.Path)
	r := runCLI(catalog.Management, nil, "--output", "text", "inspect_sandbox", "--sandbox-id", "sbx-9")
	if r.code != 1 || r.stdout != "" || r.stderr != "error: not_found: sandbox not found: sbx-9\n  sandbox_id: sbx-9\n" {
		t.Fatalf("error text: %+v", r)
	}
	r = runCLI(catalog.Management, nil, "--output", "yaml", "list_sandboxes")
	if k, msg := errorOf(t, r.stderr); r.code != 2 || k != "invalid_request" || msg != `--output must be json or text, not "yaml"` {
		t.Fatalf("bad --output: %+v", r)
	}
}

// --completion prints a script for bash, zsh or fish; the script's
// requests (cobra's hidden __complete) complete operations and their flags
// from the catalog, and no operation name is taken by it.
func TestCompletion(t *testing.T) {
	isolate(t, "")
	for _, sh := range []string{"bash", "zsh", "fish"} {
		r := runCLI(catalog.Management, nil, "--completion", sh)
		if r.code != 0 || !strings.Contains(r.stdout, "sandbox-manager-cli") || !strings.Contains(r.stdout, "__complete") {
			t.Errorf("%s: %d %.200q %q", sh, r.code, r.stdout, r.stderr)
		}
	}
	if r := runCLI(catalog.Management, nil, "--completion", "tcsh"); r.code != 2 {
		t.Errorf("tcsh: %+v", r)
	}
	for _, c := range []struct {
		g    catalog.Group
		args []string
		want string
	}{
		{catalog.Management, []string{"__complete", "cre"}, "create_sandbox\t"},
		{catalog.Management, []string{"__complete", "create_sandbox", "--ov"}, "--overlay\t"},
		{catalog.Runtime, []string{"__complete", "--sandbox-id", "sbx-1", "file_r"}, "file_read\t"},
	} {
		r := runCLI(c.g, nil, c.args...)
		if r.code != 0 || !strings.HasPrefix(r.stdout, c.want) {
			t.Errorf("%v: %+v", c.args, r)
		}
	}
	for _, op := range catalog.Ops() {
		if strings.HasPrefix(op.ID, "__") || op.ID == "completion" {
			t.Errorf("operation %s collides with completion", op.ID)
		}
	}
}
