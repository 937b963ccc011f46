package rpc

import (
	"context"
	"errors"
	"fmt"
	"io/fs"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
)

// ErrClientGone is the cause of a request context cancelled because its
// client closed the connection.
var ErrClientGone = errors.New("the client closed the connection")

// As adapts a translator of one domain error type T (found anywhere in the
// chain with errors.As) to Config.Errors.
func As[T error](f func(T) *catalog.Error) func(error) *catalog.Error {
	return func(err error) *catalog.Error {
		var t T
		if !errors.As(err, &t) {
			return nil
		}
		return f(t)
	}
}

// Error maps a handler's error to the contract's error. This is the one
// place where domain errors become wire errors: a *catalog.Error anywhere
// in the chain is the answer; else the first translator that recognises
// the error; else a missing file is not_found and anything else
// operation_failed. The result keeps err as its Cause (unless a translator
// chose another), so errors.Is and errors.As still see the domain error.
func (m *Mux) Error(op string, err error) *catalog.Error {
	var ce *catalog.Error
	if errors.As(err, &ce) {
		return ce
	}
	for _, tr := range m.cfg.Errors {
		if e := tr(err); e != nil {
			if e.Cause == nil {
				e.Cause = err
			}
			return e
		}
	}
	if errors.Is(err, fs.ErrNotExist) {
		return catalog.Wrap(catalog.NotFound, err, "%v", err)
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return catalog.Wrap(catalog.OperationFailed, err, "%s: %v", op, err)
	}
	m.cfg.Log.Warn("operation failed", "op", op, "err", err)
	return catalog.Wrap(catalog.OperationFailed, err, "%s failed: %v", op, err)
}

// ClientGone attributes a handler's failure to its client's disconnect when
// that cancelled the request, whatever error the interrupted work returned
// (some wrap it without %w), so the request's span says "cancelled".
func ClientGone(ctx context.Context, err error) error {
	if err == nil || !errors.Is(context.Cause(ctx), ErrClientGone) {
		return err
	}
	if errors.Is(err, ErrClientGone) {
		return err
	}
	return fmt.Errorf("%w (%w): %w", context.Canceled, ErrClientGone, err)
}
