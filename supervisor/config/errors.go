package config

import (
	"fmt"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
)

// Error is a configuration that cannot be used: the file could not be
// read, did not decode, or a key failed validation (Err names it). It
// unwraps to its cause, so errors.Is sees e.g. fs.ErrPermission, and to the
// contract's config_error, so the one place that writes envelopes finds a
// *catalog.Error with errors.As.
type Error struct {
	Err error
}

func errorf(format string, a ...any) *Error {
	return &Error{Err: fmt.Errorf(format, a...)}
}

func (e *Error) Error() string { return e.wire().Error() }

// Unwrap yields the cause and its wire form; the wire form is built on
// demand so a caller that changes it does not change e.
func (e *Error) Unwrap() []error { return []error{e.Err, e.wire()} }

func (e *Error) wire() *catalog.Error {
	return catalog.Errorf(catalog.ConfigError, "%s", e.Err.Error())
}
