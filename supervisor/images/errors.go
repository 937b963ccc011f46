package images

import "fmt"

// Kind classifies an image failure for the contract's error kinds.
type Kind int

const (
	BadInput    Kind = iota + 1 // invalid_request
	Unavailable                 // no Docker Engine answers: operation_failed, docker "unavailable"
	Failed                      // pull, export or unpack failed: operation_failed
)

// Error is every failure of Acquire; Reason is a short machine-readable
// cause (e.g. "unsafe_entry", "corrupt_archive", "pull_failed").
type Error struct {
	Kind   Kind
	Image  string
	Reason string
	Err    error
}

func (e *Error) Error() string { return e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

func errorf(kind Kind, image, reason, format string, a ...any) *Error {
	return &Error{Kind: kind, Image: image, Reason: reason, Err: fmt.Errorf(format, a...)}
}
