package catalog

// Fuzz targets for the request boundary: the wire parser and envelope
// decoder (§2.3, §2.4), argument validation (§2.6) and workspace paths
// (§7.2). Their seed corpora live in testdata/fuzz/<FuzzName>/ and run on
// every plain `go test`; `go test -run=^$ -fuzz=FuzzX ./catalog/` explores
// further.

import (
	"bytes"
	"encoding/json"
	"math"
	"path"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"
)

// trailingGarbage reports whether line holds more than one JSON value plus
// surrounding whitespace (json.Valid accepts exactly one value).
func trailingGarbage(line []byte) bool { return !json.Valid(line) }

// FuzzParseRequest feeds arbitrary bytes through the supervisor's request
// path up to argument validation: it never panics, every refusal is
// bad_json (parse) or invalid_request (envelope, args), and an accepted
// request re-encodes to a line that decodes to the same request and args.
func FuzzParseRequest(f *testing.F) {
	for _, s := range []string{
		`{"op":"health","scope":{"kind":"system"}}`,
		`{"op":"file_read","scope":{"kind":"sandbox","sandbox_id":"sbx-1"},"args":{"path":"a","offset":1,"limit":2}}`,
		`{"op":"exec_command","scope":{"kind":"sandbox","sandbox_id":"sbx-1"},"args":{"command":"echo \u0000 hi","yield_time_ms":1e400}}`,
		`{"op":"destroy_workspace_session","scope":{"kind":"sandbox","sandbox_id":"s"},"args":{"workspace_session_id":"ws-1","grace_s":-0}}`,
		`{"op":"health","scope":{"kind":"system"},"_sandbox_gateway_auth_token":"x"}`,
		`{"op":"health","scope":{"kind":"system"},"request_id":null,"args":null}`,
		`{"op":"\ud800","scope":{"kind":"system"}}`,
		`{"op":"health","scope":{"kind":"system"}}` + "\n",
		`{"op":"health","op":"file_read","scope":{"kind":"system"}}`,
		`{"op":"file_read","scope":{"kind":"sandbox","sandbox_id":"s"},"args":{"path":"a","pa\u0074h":"b"}}`,
		`{"op":"file_edit","scope":{"kind":"sandbox","sandbox_id":"s"},"args":{"path":"a","edits":[{"old_string":"x","old_string":"y","new_string":"z"}]}}`,
		"{\"op\":\"file_read\",\"scope\":{\"kind\":\"sandbox\",\"sandbox_id\":\"s\"},\"args\":{\"path\":\"a\xff\"}}",
		`{"op":"file_read","scope":{"kind":"sandbox","sandbox_id":"s"},"args":{"path":"a\udc80"}}`,
		`{"op":"file_read","scope":{"kind":"sandbox","sandbox_id":"s"},"args":{"path":"\ud83d\ude00\ufffd\\ud800"}}`,
		`{"op":"health","scope":{"kind":"system"},"args":{"a":` + strings.Repeat("[", 20000) + strings.Repeat("]", 20000) + `}}`,
		`{"op":"file_write","scope":{"kind":"sandbox","sandbox_id":"x"},"args":{"path":"/workspace/../x","content":"","mode":18446744073709551616}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		// The fast scan may over-report but must never miss what the
		// token parser refuses.
		if json.Valid(line) {
			if _, e := parseStrict(line); e != nil && !mayBeAmbiguous(line) {
				t.Fatalf("fast scan missed %v in %q", e, line)
			}
		}
		m, perr := ParseLine(line)
		if perr != nil {
			argUTF8 := perr.Kind == InvalidRequest && strings.HasPrefix(perr.Message, "string at args") && strings.HasSuffix(perr.Message, "is not valid UTF-8")
			if perr.Kind != BadJSON && !argUTF8 {
				t.Fatalf("ParseLine: kind %s, want bad_json (or invalid_request for an argument's invalid UTF-8): %v", perr.Kind, perr)
			}
			return
		}
		if trailingGarbage(line) {
			t.Fatalf("ParseLine accepted a line that is not exactly one JSON value: %q", line)
		}
		if !utf8.Valid(line) {
			t.Fatalf("ParseLine accepted a line that is not UTF-8: %q", line)
		}
		delete(m, TokenField)
		req, derr := DecodeRequest(m)
		if derr != nil {
			if derr.Kind != InvalidRequest {
				t.Fatalf("DecodeRequest: kind %s, want invalid_request: %v", derr.Kind, derr)
			}
			return
		}
		if req.Op == "" || req.Args == nil || (req.Scope.Kind != "system" && req.Scope.Kind != "sandbox") {
			t.Fatalf("accepted a malformed envelope: %+v", req)
		}
		if req.Scope.Kind == "sandbox" && strings.TrimSpace(req.Scope.SandboxID) == "" {
			t.Fatalf("sandbox scope without id: %+v", req)
		}
		if req.RequestID != "" && !ValidID(req.RequestID) {
			t.Fatalf("accepted request_id %q", req.RequestID)
		}
		// Round trip: what a client would send for this request.
		wire, err := json.Marshal(req)
		if err != nil {
			t.Fatalf("re-encode %+v: %v", req, err)
		}
		m2, perr := ParseLine(append(wire, '\n'))
		if perr != nil {
			t.Fatalf("re-encoded line %s: %v", wire, perr)
		}
		req2, derr := DecodeRequest(m2)
		if derr != nil {
			t.Fatalf("re-encoded line %s: %v", wire, derr)
		}
		if !reflect.DeepEqual(req, req2) {
			t.Fatalf("round trip changed the request:\n%#v\n%#v", req, req2)
		}
		op, ok := Lookup(req.Op)
		if !ok {
			return // unknown_op is the router's answer
		}
		args, verr := op.Validate(req.Args)
		if verr != nil {
			if verr.Kind != InvalidRequest {
				t.Fatalf("Validate(%s): kind %s, want invalid_request: %v", op.ID, verr.Kind, verr)
			}
			return
		}
		checkArgs(t, op, req.Args, args)
		args2, verr := op.Validate(req2.Args)
		if verr != nil || !reflect.DeepEqual(args, args2) {
			t.Fatalf("Validate(%s) differs after the round trip: %v %v / %v", op.ID, args, args2, verr)
		}
	})
}

// FuzzWorkspacePath checks the §7.2 path rules: an accepted path is clean
// and relative (no "..", ".", empty segments, leading "/", backslash or
// NUL), at most 4096 bytes with components of at most 255, stays beneath
// the workspace when joined to it, and normalizes idempotently; the
// "/workspace/x" spelling agrees with "x".
func FuzzWorkspacePath(f *testing.F) {
	for _, s := range []string{
		"src/x", "./src/x", "/workspace/src/x", `src\x`, "src//x/./y/", "", ".", "/", "/workspace", "/workspace/",
		"..", "../x", "a/..", "a/../b", "/workspace/../x", "/workspace/./../x", `..\x`, `a\..\..\etc`, `\workspace\..\x`,
		"/workspacex/a", "/etc/passwd", "/proc/self/root/etc/passwd", "//workspace/x", "/./workspace/x", "...", "..../x",
		"a\x00b", "\x00", "a/\u00e9", "\u2215etc", "a\u202e/b", "\xff\xfe", strings.Repeat("a", 255), strings.Repeat("a", 256),
		strings.Repeat("a/", 2048), strings.Repeat("a/", 2049), "/workspace/" + strings.Repeat("b", 4086), strings.Repeat("./", 2048) + "x",
	} {
		f.Add(s, false)
		f.Add(s, true)
	}
	f.Fuzz(func(t *testing.T, p string, allowRoot bool) {
		out, err := WorkspacePath(p, allowRoot)
		if err != nil {
			if err.Kind != InvalidRequest || err.Message != "invalid path: "+p {
				t.Fatalf("WorkspacePath(%q): %v", p, err)
			}
		} else {
			checkClean(t, p, out, allowRoot)
			again, err2 := WorkspacePath(out, allowRoot)
			if err2 != nil || again != out {
				t.Fatalf("not idempotent: %q -> %q -> %q, %v", p, out, again, err2)
			}
		}
		// "x" and "/workspace/x" name the same thing.
		if strings.HasPrefix(p, "/") || strings.HasPrefix(p, `\`) || len(p)+len("/workspace/") > 4096 {
			return
		}
		abs, aerr := WorkspacePath("/workspace/"+p, allowRoot)
		if (err == nil) != (aerr == nil) || abs != out {
			t.Fatalf("%q -> %q, %v but /workspace/%s -> %q, %v", p, out, err, p, abs, aerr)
		}
	})
}

func checkClean(t *testing.T, in, out string, allowRoot bool) {
	t.Helper()
	if out == "" {
		if !allowRoot {
			t.Fatalf("%q: empty result without allowRoot", in)
		}
		return
	}
	if len(out) > 4096 || strings.ContainsAny(out, "\x00\\") || strings.HasPrefix(out, "/") {
		t.Fatalf("%q -> %q: not a clean relative path", in, out)
	}
	for _, seg := range strings.Split(out, "/") {
		if seg == "" || seg == "." || seg == ".." || len(seg) > 255 {
			t.Fatalf("%q -> %q: bad segment %q", in, out, seg)
		}
	}
	if j := path.Join("/workspace", out); j != "/workspace/"+out {
		t.Fatalf("%q -> %q: joins to %q", in, out, j)
	}
}

// FuzzValidateArgs runs arbitrary JSON argument values through every
// operation's Validate: it never panics, refuses only with invalid_request,
// and on success every required argument is present, every value has the Go
// type of its kind and satisfies its declared rules, and validating the
// typed result again is a no-op. The input is either an args object (used
// as is for every operation) or an array whose i-th value is given to each
// operation's i-th declared argument (so the values reach real names).
func FuzzValidateArgs(f *testing.F) {
	for _, s := range []string{
		`{}`, `{"path":"a","content":"x"}`, `{"unknown":1}`, `{"path":null}`,
		`["a","b","c","d","e","f","g","h"]`,
		`[1,2,3,4,5,6,7,8]`,
		`[18446744073709551615,18446744073709551616,-1,-0,0.0,1e2,1e400,-1e400]`,
		`[1.5,0,60,60.0000001,-0,1e-400,4.9e-324,1.7976931348623157e308]`,
		`[true,false,null,[],{},"[]","[1]]","null"]`,
		`["\u0000","\u001f","\ud800","\u202e","sbx-1","ws-1","a b",""]`,
		`["[{\"old_string\":\"a\",\"new_string\":\"b\"}]","[1] x","[1]}","","   ","auto","kernel","fuse"]`,
		`[` + strings.Repeat("[", 500) + strings.Repeat("]", 500) + `]`,
		`[00,01,"1",+1,0x10,1E2,9007199254740993,1.0]`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		d := json.NewDecoder(bytes.NewReader(data))
		d.UseNumber()
		var v any
		if d.Decode(&v) != nil {
			return
		}
		for i := range Ops() {
			op := &Ops()[i]
			var raw map[string]any
			switch x := v.(type) {
			case map[string]any:
				raw = x
			case []any:
				raw = map[string]any{}
				for j := range op.Args {
					if len(x) > 0 {
						raw[op.Args[j].Name] = x[(j+i)%len(x)]
					}
				}
			default:
				return
			}
			args, err := op.Validate(raw)
			if err != nil {
				if err.Kind != InvalidRequest {
					t.Fatalf("Validate(%s, %v): kind %s: %v", op.ID, raw, err.Kind, err)
				}
				continue
			}
			checkArgs(t, op, raw, args)
			again, err := op.Validate(map[string]any(args))
			if err != nil || !reflect.DeepEqual(args, again) {
				t.Fatalf("Validate(%s) is not idempotent: %v -> %v, %v", op.ID, args, again, err)
			}
		}
	})
}

// checkArgs asserts what a successful Validate promises the handlers.
func checkArgs(t *testing.T, op *Op, raw map[string]any, args Args) {
	t.Helper()
	for name := range args {
		if op.Arg(name) == nil {
			t.Fatalf("%s: result has undeclared argument %s", op.ID, name)
		}
	}
	for i := range op.Args {
		a := &op.Args[i]
		v, present := args[a.Name]
		if !present {
			if a.Required {
				t.Fatalf("%s: required %s missing from %v (raw %v)", op.ID, a.Name, args, raw)
			}
			if a.Default != nil {
				t.Fatalf("%s: default of %s not applied", op.ID, a.Name)
			}
			continue
		}
		switch a.Kind {
		case String, Path:
			s, ok := v.(string)
			if !ok {
				t.Fatalf("%s.%s: %T, want string", op.ID, a.Name, v)
			}
			if a.ID && !ValidID(s) {
				t.Fatalf("%s.%s: %q breaks the id rule", op.ID, a.Name, s)
			}
			if a.NonEmpty && strings.TrimSpace(s) == "" {
				t.Fatalf("%s.%s: blank", op.ID, a.Name)
			}
			if a.MaxLen > 0 && utf8.RuneCountInString(s) > a.MaxLen {
				t.Fatalf("%s.%s: too long", op.ID, a.Name)
			}
			if len(a.Enum) > 0 && !contains(a.Enum, s) {
				t.Fatalf("%s.%s: %q not in %v", op.ID, a.Name, s, a.Enum)
			}
		case Integer:
			n, ok := v.(uint64)
			if !ok {
				t.Fatalf("%s.%s: %T, want uint64", op.ID, a.Name, v)
			}
			if (a.Min != nil && n < *a.Min) || (a.Max != nil && n > *a.Max) {
				t.Fatalf("%s.%s: %d outside its limits", op.ID, a.Name, n)
			}
		case Float:
			x, ok := v.(float64)
			if !ok {
				t.Fatalf("%s.%s: %T, want float64", op.ID, a.Name, v)
			}
			if math.IsNaN(x) || math.IsInf(x, 0) || (a.FMin != nil && x < *a.FMin) || (a.FMax != nil && x > *a.FMax) {
				t.Fatalf("%s.%s: %v outside its limits", op.ID, a.Name, x)
			}
		case Boolean:
			if _, ok := v.(bool); !ok {
				t.Fatalf("%s.%s: %T, want bool", op.ID, a.Name, v)
			}
		case JSONArray:
			arr, ok := v.([]any)
			if !ok || arr == nil {
				t.Fatalf("%s.%s: %T, want []any", op.ID, a.Name, v)
			}
			if a.MaxItems > 0 && len(arr) > a.MaxItems {
				t.Fatalf("%s.%s: %d items", op.ID, a.Name, len(arr))
			}
			if s, isStr := raw[a.Name].(string); isStr && !json.Valid([]byte(s)) {
				t.Fatalf("%s.%s: accepted %q, which is not exactly one JSON array", op.ID, a.Name, s)
			}
		default:
			t.Fatalf("%s.%s: unknown kind %v", op.ID, a.Name, a.Kind)
		}
	}
}

func contains(list []string, s string) bool {
	for _, e := range list {
		if e == s {
			return true
		}
	}
	return false
}
