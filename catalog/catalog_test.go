package catalog

import (
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"reflect"
	"strings"
	"testing"
)

func TestDocsAreCurrent(t *testing.T) {
	b, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != Markdown() {
		t.Fatal("docs/operations.md is stale: run go generate ./catalog")
	}
}

func TestDeclarationsAreWellFormed(t *testing.T) {
	seen := map[string]bool{}
	fam := map[string]Family{}
	for _, f := range Families() {
		fam[string(f.Group)+"/"+f.Name] = f
	}
	for _, op := range Ops() {
		if seen[op.ID] {
			t.Errorf("%s declared twice", op.ID)
		}
		seen[op.ID] = true
		f, ok := fam[string(op.Group)+"/"+op.Family]
		if !ok || f.Capability {
			t.Errorf("%s: family %q is not an operation family of %s", op.ID, op.Family, op.Group)
		}
		if op.Group == Management && op.Scope != ScopeSystem {
			t.Errorf("%s: management operations are system-scoped", op.ID)
		}
		if op.Group == Runtime && op.Scope != ScopeSandbox {
			t.Errorf("%s: runtime operations are sandbox-scoped", op.ID)
		}
		if op.Group == Observability && !op.Cancellable {
			t.Errorf("%s: observability operations only read, so they stop with their client (Cancellable)", op.ID)
		}
		if op.Cancellable && op.Effect != ReadOnly && op.ID != "export_changes" {
			t.Errorf("%s: only reads may stop with their client; export_changes, which writes only its destination, is the one exception", op.ID)
		}
		args := map[string]bool{}
		for _, a := range op.Args {
			if args[a.Name] {
				t.Errorf("%s: argument %s twice", op.ID, a.Name)
			}
			args[a.Name] = true
			if a.Required && a.Default != nil {
				t.Errorf("%s.%s: required with a default", op.ID, a.Name)
			}
			if a.Kind == JSONArray && a.Items == nil {
				t.Errorf("%s.%s: array without an items declaration (MCP clients refuse it)", op.ID, a.Name)
			}
			if a.Items != nil && a.Kind != JSONArray {
				t.Errorf("%s.%s: items on a %s", op.ID, a.Name, a.Kind)
			}
			if a.Default != nil {
				if _, err := a.check(a.Default); err != nil {
					t.Errorf("%s.%s: default %v fails its own rules: %v", op.ID, a.Name, a.Default, err)
				}
			}
		}
	}
}

func decode(t *testing.T, s string) map[string]any {
	t.Helper()
	m, err := ParseLine([]byte(s))
	if err != nil {
		t.Fatalf("%s: %v", s, err)
	}
	return m
}

func TestValidate(t *testing.T) {
	cases := []struct {
		op, args, want string // want: "" = ok, else the exact message
		check          func(Args) bool
	}{
		{"file_read", `{"path":"a"}`, "", func(a Args) bool { return a.Uint("offset") == 1 && a.Uint("limit") == 2000 }},
		{"file_read", `{}`, "path is required for file_read", nil},
		{"file_read", `{"path":"a","bogus":1}`, "unknown argument for file_read: bogus", nil},
		{"file_read", `{"path":5}`, "path must be a string", nil},
		{"file_read", `{"path":"a","limit":-1}`, "limit must be an unsigned integer", nil},
		{"file_read", `{"path":"a","limit":1.5}`, "limit must be an unsigned integer", nil},
		{"file_read", `{"path":"a","limit":"7"}`, "limit must be an unsigned integer", nil},
		{"file_read", `{"path":"a","limit":0}`, "limit must be between 1 and 2000", nil},
		{"file_read", `{"path":"a","limit":2001}`, "limit must be between 1 and 2000", nil},
		{"file_read", `{"path":"a","limit":18446744073709551616}`, "limit must be an unsigned integer", nil},
		{"file_read", `{"path":"a","offset":null}`, "", func(a Args) bool { return a.Uint("offset") == 1 }},
		{"file_list", `{"limit":5000}`, "", func(a Args) bool { return a.Uint("limit") == 2000 }},
		{"file_list", `{"limit":0}`, "limit must be between 1 and 2000", nil},
		{"file_read", `{"path":"a","workspace_session_id":"bad id"}`, "workspace_session_id must match [A-Za-z0-9._:-]{1,128}", nil},
		{"create_sandbox", `{"workspace_root":"/x","overlay":"zfs"}`, "overlay must be one of auto, kernel, fuse", nil},
		{"create_sandbox", `{"workspace_root":"/x","name":"a\u0007b"}`, "name must not contain control characters", nil},
		{"create_sandbox", `{"workspace_root":"/x","name":"` + strings.Repeat("é", 129) + `"}`, "name must be at most 128 characters", nil},
		{"create_sandbox", `{"workspace_root":"/x","name":"` + strings.Repeat("é", 128) + `"}`, "", nil},
		{"create_sandbox", `{"workspace_root":"/x","count":0}`, "count must be at least 1", nil},
		{"create_sandbox", `{"workspace_root":"/x"}`, "", func(a Args) bool { return a.String("image") == "host" && a.Uint("count") == 1 && !a.Has("overlay") }},
		{"file_edit", `{"path":"a","edits":{}}`, "edits must be an array", nil},
		{"file_edit", `{"path":"a","edits":"[{\"old_string\":\"a\",\"new_string\":\"b\"}]"}`, "", func(a Args) bool { return len(a.Array("edits")) == 1 }},
		{"file_edit", `{"path":"a","edits":"not json"}`, "edits must be an array", nil},
		{"file_write", `{"path":"a","content":true}`, "content must be a string", nil},
		// Integer-valued numbers are integers (JSON Schema says so; Python sends 2.0).
		{"file_read", `{"path":"a","limit":2.0}`, "", func(a Args) bool { return a.Uint("limit") == 2 }},
		{"file_read", `{"path":"a","limit":1e3}`, "", func(a Args) bool { return a.Uint("limit") == 1000 }},
		{"file_read", `{"path":"a","offset":18446744073709551615.000}`, "", func(a Args) bool { return a.Uint("offset") == 1<<64-1 }},
		{"file_read", `{"path":"a","offset":1e999}`, "offset must be an unsigned integer", nil},
		{"file_read", `{"path":"a","limit":-2.0}`, "limit must be an unsigned integer", nil},
		// Array elements are checked against the declared items.
		{"file_edit", `{"path":"a","edits":[{"old_string":"a","new_string":"b","replace_all":true}]}`, "", nil},
		{"file_edit", `{"path":"a","edits":[{"old_string":"a","new_string":"b","replace_all":null}]}`, "", nil},
		{"file_edit", `{"path":"a","edits":[1]}`, "edits[0] must be an object {old_string, new_string, replace_all?}", nil},
		{"file_edit", `{"path":"a","edits":[{"old_string":"a","new_string":"b"},{"old_string":"a"}]}`, "edits[1].new_string is required", nil},
		{"file_edit", `{"path":"a","edits":[{"old_string":"a","new_string":"b","x":1}]}`, "edits[0] has an unknown field: x", nil},
		{"file_edit", `{"path":"a","edits":[{"old_string":1,"new_string":"b"}]}`, "edits[0].old_string must be a string", nil},
		{"file_edit", `{"path":"a","edits":[{"old_string":"a","new_string":"b","replace_all":"yes"}]}`, "edits[0].replace_all must be a boolean", nil},
		{"publish_workspace_session", `{"workspace_session_id":"ws-1","resolutions":[{"path":"a","strategy":"mine"}]}`, "resolutions[0].strategy must be one of merge, ours, theirs, reject", nil},
		{"diff_workspace_session", `{"workspace_session_id":"ws-1","paths":["a",2]}`, "paths[1] must be a string", nil},
	}
	// What a client holds before it encodes: strings that are not UTF-8.
	op, _ := Lookup("file_write")
	for _, raw := range []map[string]any{{"path": "a\xff", "content": "x"}, {"path": "a", "content": "\xc3("}} {
		if _, err := op.Validate(raw); err == nil || err.Kind != InvalidRequest || !strings.HasSuffix(err.Message, " must be valid UTF-8") {
			t.Errorf("Validate(%q): %v, want invalid_request ... must be valid UTF-8", raw, err)
		}
	}
	for _, tc := range cases {
		op, ok := Lookup(tc.op)
		if !ok {
			t.Fatalf("no op %s", tc.op)
		}
		args, err := op.Validate(decode(t, tc.args))
		got := ""
		if err != nil {
			got = err.Message
			if err.Kind != InvalidRequest {
				t.Errorf("%s %s: kind %s", tc.op, tc.args, err.Kind)
			}
		}
		if got != tc.want {
			t.Errorf("%s %s: got %q, want %q", tc.op, tc.args, got, tc.want)
			continue
		}
		if err == nil && tc.check != nil && !tc.check(args) {
			t.Errorf("%s %s: unexpected args %v", tc.op, tc.args, args)
		}
	}
}

func TestWorkspacePath(t *testing.T) {
	cases := []struct {
		in        string
		allowRoot bool
		want      string
		bad       bool
	}{
		{"src/x", false, "src/x", false},
		{"./src/x", false, "src/x", false},
		{"/workspace/src/x", false, "src/x", false},
		{`src\x`, false, "src/x", false},
		{"src//x/./y/", false, "src/x/y", false},
		{"a/../p", false, "", true},
		{"..", false, "", true},
		{"/etc/passwd", false, "", true},
		{"/workspacex/a", false, "", true},
		{"", false, "", true},
		{".", false, "", true},
		{"/workspace", false, "", true},
		{"", true, "", false},
		{"/", true, "", false},
		{"/workspace", true, "", false},
		{"a\x00b", false, "", true},
		{"a\xffb", false, "", true},
		{"\xed\xa0\x80", true, "", true},
		{"\ufffd/é", false, "\ufffd/é", false},
		{strings.Repeat("a", 256), false, "", true},
		{strings.Repeat("a/", 2049), false, "", true},
	}
	for _, tc := range cases {
		got, err := WorkspacePath(tc.in, tc.allowRoot)
		if (err != nil) != tc.bad || got != tc.want {
			t.Errorf("WorkspacePath(%q, %v) = %q, %v", tc.in, tc.allowRoot, got, err)
		}
		if err != nil && err.Message != "invalid path: "+tc.in {
			t.Errorf("message %q", err.Message)
		}
	}
}

func TestDecodeRequest(t *testing.T) {
	cases := []struct{ line, want string }{
		{`{"op":"x","scope":{"kind":"system"}}`, ""},
		{`{"op":"x","scope":{"kind":"sandbox","sandbox_id":"sbx-1"},"args":{"a":1},"request_id":"r-1","_stream_logs":true}`, ""},
		{`{"op":"x","scope":{"kind":"system"},"extra":1}`, "unknown request field: extra"},
		{`{"scope":{"kind":"system"}}`, "op is required and must be a non-empty string"},
		{`{"op":"x"}`, "scope is required and must be an object"},
		{`{"op":"x","scope":{"kind":"sandbox"}}`, "scope.sandbox_id is required for a sandbox scope"},
		{`{"op":"x","scope":{"kind":"sandbox","sandbox_id":"  "}}`, "scope.sandbox_id is required for a sandbox scope"},
		{`{"op":"x","scope":{"kind":"other"}}`, `scope.kind must be "system" or "sandbox"`},
		{`{"op":"x","scope":{"kind":"system"},"args":[]}`, "args must be an object"},
		{`{"op":"x","scope":{"kind":"system"},"request_id":"has space"}`, "request_id must be 1-128 characters of [A-Za-z0-9._:-]"},
		{`{"op":"x","scope":{"kind":"system"},"_stream_logs":"yes"}`, "_stream_logs must be a boolean"},
	}
	for _, tc := range cases {
		_, err := DecodeRequest(decode(t, tc.line))
		got := ""
		if err != nil {
			got = err.Message
		}
		if got != tc.want {
			t.Errorf("%s: got %q, want %q", tc.line, got, tc.want)
		}
	}
	for _, bad := range []string{`not json`, `[1]`, `"s"`, `{"a":1} {"b":2}`, ``, `{"a":1,}`, `{"a":[1,]}`} {
		if _, err := ParseLine([]byte(bad)); err == nil || err.Kind != BadJSON {
			t.Errorf("%s: want bad_json, got %v", bad, err)
		}
	}
}

// TestParseLineStrict: what encoding/json would take silently (the last of
// duplicate keys, U+FFFD for invalid UTF-8) is refused at any depth (bad_json; invalid_request for invalid UTF-8
// in an argument's value), and a line that only looks similar is accepted unchanged.
func TestParseLineStrict(t *testing.T) {
	const head = `{"op":"file_read","scope":{"kind":"sandbox","sandbox_id":"s"},`
	for _, tc := range []struct{ line, want string }{ // want "" = accepted
		{`{"op":"health","op":"destroy_sandbox","scope":{"kind":"system"}}`, `request is not valid JSON: duplicate key "op" in the request`},
		{`{"op":"health","scope":{"kind":"system","kind":"sandbox"}}`, `request is not valid JSON: duplicate key "kind" in scope`},
		{head + `"args":{"path":"a","path":"b"}}`, `request is not valid JSON: duplicate key "path" in args`},
		{head + `"args":{"edits":[{"old_string":"a","old_string":"b"}]}}`, `request is not valid JSON: duplicate key "old_string" in args.edits[0]`},
		{head + `"args":{"x":[[{"k":{"d":1,"d":1}}]]}}`, `request is not valid JSON: duplicate key "d" in args.x[0][0].k`},
		{head + `"args":{"path":"a\u0070","pat\u0068":"b"}}`, `request is not valid JSON: duplicate key "path" in args`},
		{head + "\"args\":{\"path\":\"bad\xffname\"}}", `string at args.path is not valid UTF-8`},
		{head + "\"args\":{\"path\":\"\xc3\"}}", `string at args.path is not valid UTF-8`},
		{head + "\"args\":{\"path\":\"\xed\xa0\x80\"}}", `string at args.path is not valid UTF-8`},
		{head + `"args":{"path":"x\udc80"}}`, `string at args.path is not valid UTF-8`},
		{head + `"args":{"path":"\ud800"}}`, `string at args.path is not valid UTF-8`},
		{head + `"args":{"path":"\ud800\u0041"}}`, `string at args.path is not valid UTF-8`},
		{head + `"args":{"path":"\ud800\ud800"}}`, `string at args.path is not valid UTF-8`},
		{head + `"args":{"edits":[{"old_string":"a","new_string":"\udfff"}]}}`, `string at args.edits[0].new_string is not valid UTF-8`},
		{head + "\"args\":{\"p\xffth\":\"a\"}}", `request is not valid JSON: an object key in args is not valid UTF-8`},
		{`{"op":"\udc80","scope":{"kind":"system"}}`, `request is not valid JSON: string at op is not valid UTF-8`},
		// Accepted: distinct keys, valid text that merely contains U+FFFD or
		// escapes, a surrogate pair, the same key in sibling objects.
		{head + `"args":{"path":"a","Path":"b"}}`, ""},
		{head + `"args":{"path":"\ud83d\ude00 \ufffd \u00e9 \\udc80"}}`, ""},
		{head + "\"args\":{\"path\":\"\xef\xbf\xbd\xf0\x9f\x98\x80\"}}", ""},
		{head + `"args":{"edits":[{"old_string":"a"},{"old_string":"b"}]}}`, ""},
		// Flagged by the fast scan (an escaped key), then accepted by the
		// token parser with the same value encoding/json builds.
		{head + `"args":{"p\u0061th":"\ufffd\ud83d\ude00","edits":[{"x":[1,2.5e3,true,null,{}]},[]]}}`, ""},
	} {
		m, err := ParseLine([]byte(tc.line))
		got := ""
		if err != nil {
			got = err.Message
			want := BadJSON
			if !strings.HasPrefix(tc.want, "request is not valid JSON") {
				want = InvalidRequest // invalid UTF-8 in an argument's value
			}
			if err.Kind != want {
				t.Errorf("%q: kind %s, want %s", tc.line, err.Kind, want)
			}
		}
		if got != tc.want {
			t.Errorf("%q:\n got %q\nwant %q", tc.line, got, tc.want)
			continue
		}
		if tc.want == "" { // accepted exactly as encoding/json reads it
			var std map[string]any
			d := json.NewDecoder(strings.NewReader(tc.line))
			d.UseNumber()
			if derr := d.Decode(&std); derr != nil || !reflect.DeepEqual(std, m) {
				t.Errorf("%q: built %v, encoding/json reads %v (%v)", tc.line, m, std, derr)
			}
		}
	}
}

// BenchmarkParseLine16MiB: a file_write of (almost) the largest request,
// content heavy with escapes and multi-byte text.
func BenchmarkParseLine16MiB(b *testing.B) {
	text := strings.Repeat("line \"quoted\" \\ tab\t é ü 😀 \ufffd\n", (15<<20)/40)
	content, err := json.Marshal(text)
	if err != nil {
		b.Fatal(err)
	}
	line := []byte(`{"op":"file_write","scope":{"kind":"sandbox","sandbox_id":"s"},"args":{"path":"a","content":` + string(content) + `}}` + "\n")
	b.SetBytes(int64(len(line)))
	for b.Loop() {
		if _, err := ParseLine(line); err != nil {
			b.Fatal(err)
		}
	}
}

func TestParseEndpoint(t *testing.T) {
	good := []string{"/run/x.sock", "unix:///run/x.sock", "tcp://127.0.0.1:80", "tcp://127.1.2.3:0", "tcp://[::1]:9"}
	bad := []string{"run/x.sock", "unix://run", "/a//b", "/a/./b", "/a/../b", "tcp://10.0.0.1:80", "tcp://localhost:80", "tcp://127.0.0.1", "tcp://127.0.0.1:99999", "http://x", "/" + strings.Repeat("a", 107)}
	for _, s := range good {
		if _, err := ParseEndpoint(s); err != nil {
			t.Errorf("%s: %v", s, err)
		}
	}
	for _, s := range bad {
		if _, err := ParseEndpoint(s); err == nil {
			t.Errorf("%s: accepted", s)
		}
	}
}

func TestErrorEnvelope(t *testing.T) {
	e := Errorf(RequestTooLarge, "too big").With("limit", 5)
	var m map[string]any
	if err := json.Unmarshal(e.MarshalEnvelope(), &m); err != nil {
		t.Fatal(err)
	}
	back := ErrorFromResponse(m)
	if back == nil || back.Kind != RequestTooLarge || back.Message != "too big" || back.Details["limit"] != float64(5) {
		t.Fatalf("round trip: %+v", back)
	}
	if ErrorFromResponse(map[string]any{"ok": true}) != nil {
		t.Fatal("success taken for an error")
	}
}

// TestErrorCause: the wire error keeps the domain error it stands for,
// visible to errors.Is and errors.As, and never sends it.
func TestErrorCause(t *testing.T) {
	cause := &fs.PathError{Op: "open", Path: "a", Err: fs.ErrNotExist}
	for _, e := range []*Error{
		Wrap(NotFound, cause, "file not found: %s", "a"),
		Errorf(NotFound, "file not found: %w", cause),
	} {
		var pe *fs.PathError
		if !errors.Is(e, fs.ErrNotExist) || !errors.As(e, &pe) || pe != cause {
			t.Fatalf("%v: the cause is not visible", e)
		}
		if strings.Contains(string(e.MarshalEnvelope()), "open") && !strings.Contains(e.Message, "open") {
			t.Fatalf("the cause leaked into the envelope: %s", e.MarshalEnvelope())
		}
		var m map[string]map[string]any
		if err := json.Unmarshal(e.MarshalEnvelope(), &m); err != nil || len(m["error"]) != 3 {
			t.Fatalf("envelope %s", e.MarshalEnvelope())
		}
	}
	if e := Wrap(NotFound, cause, "file not found: %s", "a"); e.Message != "file not found: a" {
		t.Fatalf("Wrap's message %q", e.Message)
	}
	if e := Errorf(InvalidRequest, "plain %d", 1); e.Cause != nil || e.Message != "plain 1" {
		t.Fatalf("Errorf without %%w: %+v", e)
	}
}
