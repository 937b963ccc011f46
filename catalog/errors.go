package catalog

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// Error kinds of the contract (§2.7).
const (
	InvalidRequest     = "invalid_request"
	NotFound           = "not_found"
	OperationFailed    = "operation_failed"
	OperationConflict  = "operation_conflict"
	ServerBusy         = "server_busy"
	ServerShuttingDown = "server_shutting_down"
	InternalError      = "internal_error"
	UnknownOp          = "unknown_op"
	BadJSON            = "bad_json"
	RequestTooLarge    = "request_too_large"
	Unauthorized       = "unauthorized"
	ConnectionError    = "connection_error"
	ProtocolError      = "protocol_error"
	ConfigError        = "config_error"
)

// Error is the contract's error envelope body. It is the only error type that
// crosses the wire; handlers return it to choose the kind a client sees.
// Cause is the domain error it stands for, kept for errors.Is/As on the
// supervisor's side and never sent.
type Error struct {
	Kind    string         `json:"kind"`
	Message string         `json:"message"`
	Details map[string]any `json:"details"`
	Cause   error          `json:"-"`
}

func (e *Error) Error() string { return e.Kind + ": " + e.Message }

// Unwrap returns the cause, so errors.Is and errors.As see through the
// wire error to the domain error it was made from.
func (e *Error) Unwrap() error { return e.Cause }

// Errorf builds an *Error with empty details. A %w verb in format makes
// the wrapped error its Cause, as fmt.Errorf would.
func Errorf(kind, format string, a ...any) *Error {
	wrapped := fmt.Errorf(format, a...)
	return &Error{Kind: kind, Message: wrapped.Error(), Details: map[string]any{}, Cause: errors.Unwrap(wrapped)}
}

// Wrap builds an *Error of kind whose Cause is err; the message is format's
// (err is not appended to it).
func Wrap(kind string, err error, format string, a ...any) *Error {
	e := Errorf(kind, format, a...)
	e.Cause = err
	return e
}

// With returns e with one more detail set; it mutates and returns e so calls chain.
func (e *Error) With(key string, value any) *Error {
	if e.Details == nil {
		e.Details = map[string]any{}
	}
	e.Details[key] = value
	return e
}

// Envelope is the error response object {"error":{...}} with its keys in
// the contract's order (kind, message, details; details always an object).
func (e *Error) Envelope() any {
	body := *e
	body.Cause = nil
	if body.Details == nil {
		body.Details = map[string]any{}
	}
	return struct {
		Error *Error `json:"error"`
	}{&body}
}

// MarshalEnvelope renders the error response line without the newline.
func (e *Error) MarshalEnvelope() []byte { return CompactJSON(e.Envelope()) }

// CompactJSON renders v as one line of JSON without HTML escaping and
// without a trailing newline; the wire format of every response.
func CompactJSON(v any) []byte {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return []byte(`{"error":{"kind":"internal_error","message":"cannot encode response","details":{}}}`)
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
}

// ErrorFromResponse returns the *Error of a decoded response object, or nil
// when the response is a success (it has no top-level "error" object).
// list_docker_images' success result without an Engine carries a string
// "error" (its reason, §3.2), which is not an error envelope: §2.4's
// envelope always has an object there.
func ErrorFromResponse(resp map[string]any) *Error {
	raw, ok := resp["error"]
	if _, isString := raw.(string); !ok || isString {
		return nil
	}
	m, _ := raw.(map[string]any)
	e := &Error{Details: map[string]any{}}
	if m != nil {
		e.Kind, _ = m["kind"].(string)
		e.Message, _ = m["message"].(string)
		if d, ok := m["details"].(map[string]any); ok {
			e.Details = d
		}
	}
	return e
}
