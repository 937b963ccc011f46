package catalog

import (
	"bytes"
	"encoding/json"
	"io"
	"sort"
	"strings"
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

// ParseLine decodes one request line into a JSON object, keeping numbers exact.
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
	m, ok := v.(map[string]any)
	if !ok {
		return nil, Errorf(BadJSON, "request must be a JSON object")
	}
	return m, nil
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
