package catalog

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"sort"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// MaxLineBytes is the largest request or response line, newline included (§2.4).
const MaxLineBytes = 16 << 20

// TokenField is the TCP gateway token field; it is stripped before anything else sees a request.
const TokenField = "_sandbox_gateway_auth_token"

// RequestScope is the "scope" object of a request.
type RequestScope struct {
	Kind      string `json:"kind"`
	SandboxID string `json:"sandbox_id,omitempty"`
}

// Request is a decoded, envelope-validated request (§2.3).
type Request struct {
	Op         string         `json:"op"`
	RequestID  string         `json:"request_id,omitempty"`
	Scope      RequestScope   `json:"scope"`
	Args       map[string]any `json:"args"`
	StreamLogs bool           `json:"_stream_logs"`
}

// ParseLine decodes one request line into a JSON object, keeping numbers
// exact. It is stricter than encoding/json, which takes the last of
// duplicate keys and silently turns invalid UTF-8 (raw bytes or a lone
// surrogate escape such as "\udc80") into U+FFFD: a request with either, at
// any depth, is refused — with bad_json (§2.4 step 3), except that invalid
// UTF-8 in a string value under args is invalid_request, the kind of every
// other argument a handler cannot use (issue 13 item 9) — because such a line is
// not the JSON text of RFC 8259 (§8.1 text is UTF-8; §4 names should be
// unique) and I-JSON (RFC 7493) forbids both. Refusing matters:
// {"op":"health","op":"destroy_sandbox"} must not run destroy, and a path
// must never be looked up as something its sender did not write.
//
// encoding/json decodes the line as before; a fast scan of the raw bytes
// then looks for anything that could be a duplicate key or invalid text.
// Only a line it flags is parsed again, token by token, to decide and to
// say where (the token parser alone is about three times slower on lines
// of many small values).
func ParseLine(line []byte) (map[string]any, *Error) {
	d := json.NewDecoder(bytes.NewReader(line))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, Errorf(BadJSON, "request is not valid JSON: %v", err)
	}
	if _, err := d.Token(); err != io.EOF {
		return nil, Errorf(BadJSON, "request has data after the JSON object")
	}
	if mayBeAmbiguous(line) {
		var e *Error
		if v, e = parseStrict(line); e != nil {
			return nil, e
		}
	}
	m, ok := v.(map[string]any)
	if !ok {
		return nil, Errorf(BadJSON, "request must be a JSON object")
	}
	return m, nil
}

// parseStrict parses a syntactically valid line token by token, refusing
// duplicate keys and strings that are not valid Unicode text.
func parseStrict(line []byte) (any, *Error) {
	p := &lineParser{d: json.NewDecoder(bytes.NewReader(line)), line: line}
	p.d.UseNumber()
	v, err := p.next(0)
	var ce *Error
	switch {
	case errors.As(err, &ce):
		return nil, ce
	case err != nil: // the line decoded once already; this is a guard
		return nil, Errorf(BadJSON, "request is not valid JSON: %v", err)
	}
	return v, nil
}

// mayBeAmbiguous reports whether line, valid JSON, may hold a duplicate
// object key or a string that is not valid Unicode text; false means it
// holds neither. It over-reports (keys with escapes, say) and never
// under-reports; parseStrict decides.
func mayBeAmbiguous(line []byte) bool {
	if !utf8.Valid(line) {
		return true
	}
	var objs []keySet // open containers; arrays too, as unused sets
	for i := 0; i < len(line); {
		switch line[i] {
		case '{', '[':
			if len(objs) < cap(objs) {
				objs = objs[:len(objs)+1]
				objs[len(objs)-1].reset()
			} else {
				objs = append(objs, keySet{})
			}
			i++
		case '}', ']':
			objs = objs[:len(objs)-1]
			i++
		case '"':
			end := stringEnd(line, i+1)
			body := line[i+1 : end]
			escaped := bytes.IndexByte(body, '\\') >= 0
			if escaped && bytes.Contains(body, []byte(`\u`)) && !validJSONString(line[i+1:end+1]) {
				return true
			}
			i = end + 1
			for i < len(line) && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r' || line[i] == '\n') {
				i++
			}
			if i < len(line) && line[i] == ':' && len(objs) > 0 {
				if escaped || !objs[len(objs)-1].add(body) {
					return true
				}
			}
		default:
			i++
		}
	}
	return false
}

// stringEnd returns the index of the quote closing the string whose body
// starts at i.
func stringEnd(line []byte, i int) int {
	for {
		j := bytes.IndexByte(line[i:], '"')
		if j < 0 {
			return len(line) - 1 // not reached for valid JSON
		}
		q := i + j
		n := 0
		for k := q - 1; k >= i && line[k] == '\\'; k-- {
			n++
		}
		if n%2 == 0 {
			return q
		}
		i = q + 1
	}
}

// keySet holds the raw keys of one object seen so far: a short list, a
// map once the object is large.
type keySet struct {
	list [][]byte
	m    map[string]struct{}
}

func (k *keySet) reset() {
	k.list, k.m = k.list[:0], nil
}

// add records key and reports whether it was new.
func (k *keySet) add(key []byte) bool {
	if k.m != nil {
		if _, dup := k.m[string(key)]; dup {
			return false
		}
		k.m[string(key)] = struct{}{}
		return true
	}
	for _, have := range k.list {
		if bytes.Equal(have, key) {
			return false
		}
	}
	k.list = append(k.list, key)
	if len(k.list) > 32 {
		k.m = make(map[string]struct{}, 2*len(k.list))
		for _, have := range k.list {
			k.m[string(have)] = struct{}{}
		}
	}
	return true
}

// maxNesting bounds nesting as encoding/json's Decode does; Token alone
// has no bound, and the builder recurses.
const maxNesting = 10000

// lineParser builds a request value from encoding/json's tokens, refusing
// what Decode would accept silently (see ParseLine).
type lineParser struct {
	d    *json.Decoder
	line []byte
	at   []string // where the current value is, for messages
}

func (p *lineParser) where() string {
	if len(p.at) == 0 {
		return "the request"
	}
	return strings.Join(p.at, "")
}

// next reads and builds one value at depth.
func (p *lineParser) next(depth int) (any, error) {
	start := p.d.InputOffset()
	tok, err := p.d.Token()
	if err != nil {
		return nil, err
	}
	switch t := tok.(type) {
	case string:
		// An argument's value is the caller's data, not the JSON's shape:
		// invalid UTF-8 there is a bad argument (invalid_request, as for any
		// other argument a handler cannot use), elsewhere a bad line.
		kind := BadJSON
		if len(p.at) > 0 && p.at[0] == "args" {
			kind = InvalidRequest
		}
		if err := p.checkString(t, start, "string at "+p.where(), kind); err != nil {
			return nil, err
		}
		return t, nil
	case json.Delim:
		if depth >= maxNesting {
			return nil, Errorf(BadJSON, "request is not valid JSON: nested deeper than %d levels", maxNesting)
		}
		if t == '[' {
			return p.array(depth)
		}
		return p.object(depth)
	}
	return tok, nil // json.Number, bool or nil
}

func (p *lineParser) object(depth int) (any, error) {
	m := map[string]any{}
	for p.d.More() {
		start := p.d.InputOffset()
		tok, err := p.d.Token()
		if err != nil {
			return nil, err
		}
		k, ok := tok.(string)
		if !ok { // Token reports misplaced delimiters itself; this is a guard
			return nil, Errorf(BadJSON, "request is not valid JSON: object key at %s is not a string", p.where())
		}
		if err := p.checkString(k, start, "an object key in "+p.where(), BadJSON); err != nil {
			return nil, err
		}
		if _, dup := m[k]; dup {
			return nil, Errorf(BadJSON, "request is not valid JSON: duplicate key %q in %s", k, p.where()).With("key", k)
		}
		if depth == 0 {
			p.at = append(p.at, k)
		} else {
			p.at = append(p.at, "."+k)
		}
		v, err := p.next(depth + 1)
		p.at = p.at[:len(p.at)-1]
		if err != nil {
			return nil, err
		}
		m[k] = v
	}
	_, err := p.d.Token() // '}'
	return m, err
}

func (p *lineParser) array(depth int) (any, error) {
	a := []any{}
	for i := 0; p.d.More(); i++ {
		p.at = append(p.at, "["+strconv.Itoa(i)+"]")
		v, err := p.next(depth + 1)
		p.at = p.at[:len(p.at)-1]
		if err != nil {
			return nil, err
		}
		a = append(a, v)
	}
	_, err := p.d.Token() // ']'
	return a, err
}

// checkString refuses a string token that encoding/json decoded with a
// replacement: only when the decoded text holds U+FFFD is the token's raw
// text (from start, just after the previous token) looked at, so ordinary
// strings cost nothing extra.
func (p *lineParser) checkString(s string, start int64, what, kind string) *Error {
	if !strings.ContainsRune(s, utf8.RuneError) {
		return nil
	}
	raw := p.line[start:p.d.InputOffset()]
	if i := bytes.IndexByte(raw, '"'); i >= 0 && validJSONString(raw[i+1:]) {
		return nil
	}
	if kind == InvalidRequest {
		return Errorf(InvalidRequest, "%s is not valid UTF-8", what)
	}
	return Errorf(BadJSON, "request is not valid JSON: %s is not valid UTF-8", what)
}

// validJSONString reports whether the body of a JSON string (after its
// opening quote, up to and including the closing one) is UTF-8 with every
// \u escape a whole code point: a surrogate escape must be a high one
// followed by a low one.
func validJSONString(b []byte) bool {
	for i := 0; i < len(b); {
		switch c := b[i]; {
		case c == '"':
			return true
		case c == '\\':
			if i+1 < len(b) && b[i+1] == 'u' {
				r, ok := hex4(b[i+2:])
				if !ok {
					return false
				}
				i += 6
				switch {
				case utf16.IsSurrogate(r) && r < 0xdc00:
					if !bytes.HasPrefix(b[i:], []byte(`\u`)) {
						return false
					}
					lo, ok := hex4(b[i+2:])
					if !ok || utf16.DecodeRune(r, lo) == utf8.RuneError {
						return false
					}
					i += 6
				case utf16.IsSurrogate(r):
					return false
				}
				continue
			}
			i += 2
		case c < utf8.RuneSelf:
			i++
		default:
			r, n := utf8.DecodeRune(b[i:])
			if r == utf8.RuneError && n == 1 {
				return false
			}
			i += n
		}
	}
	return false
}

func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	n, err := strconv.ParseUint(string(b[:4]), 16, 16)
	return rune(n), err == nil
}

var requestFields = map[string]bool{"op": true, "request_id": true, "scope": true, "args": true, "_stream_logs": true}

// DecodeRequest validates the envelope of a parsed request (§2.3); the token
// field must already be stripped.
func DecodeRequest(m map[string]any) (*Request, *Error) {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if !requestFields[k] {
			return nil, Errorf(InvalidRequest, "unknown request field: %s", k)
		}
	}
	r := &Request{}
	op, ok := m["op"].(string)
	if !ok || op == "" {
		return nil, Errorf(InvalidRequest, "op is required and must be a non-empty string")
	}
	r.Op = op
	if v, present := m["request_id"]; present && v != nil {
		id, ok := v.(string)
		if !ok {
			return nil, Errorf(InvalidRequest, "request_id must be a string")
		}
		if id != "" && !ValidID(id) {
			return nil, Errorf(InvalidRequest, "request_id must be 1-128 characters of [A-Za-z0-9._:-]")
		}
		r.RequestID = id
	}
	sc, ok := m["scope"].(map[string]any)
	if !ok {
		return nil, Errorf(InvalidRequest, "scope is required and must be an object")
	}
	for k := range sc {
		if k != "kind" && k != "sandbox_id" {
			return nil, Errorf(InvalidRequest, "unknown scope field: %s", k)
		}
	}
	kind, _ := sc["kind"].(string)
	switch kind {
	case "system":
		if v, present := sc["sandbox_id"]; present && v != nil {
			return nil, Errorf(InvalidRequest, "a system scope takes no sandbox_id")
		}
	case "sandbox":
		id, _ := sc["sandbox_id"].(string)
		if strings.TrimSpace(id) == "" {
			return nil, Errorf(InvalidRequest, "scope.sandbox_id is required for a sandbox scope")
		}
		r.Scope.SandboxID = id
	default:
		return nil, Errorf(InvalidRequest, `scope.kind must be "system" or "sandbox"`)
	}
	r.Scope.Kind = kind
	switch a := m["args"].(type) {
	case nil:
		if _, present := m["args"]; present {
			return nil, Errorf(InvalidRequest, "args must be an object")
		}
		r.Args = map[string]any{}
	case map[string]any:
		r.Args = a
	default:
		return nil, Errorf(InvalidRequest, "args must be an object")
	}
	if v, present := m["_stream_logs"]; present {
		b, ok := v.(bool)
		if !ok {
			return nil, Errorf(InvalidRequest, "_stream_logs must be a boolean")
		}
		r.StreamLogs = b
	}
	return r, nil
}

// LogLine renders one progress line of §2.5, newline included.
func LogLine(msg string) []byte {
	b, _ := json.Marshal(msg)
	return append(append([]byte("cli_log("), b...), ")\n"...)
}
