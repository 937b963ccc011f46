package supervisor

import (
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/ephemeral-ai-lab/sandbox/supervisor/statedb"

	"github.com/ephemeral-ai-lab/sandbox/catalog"
)

// TestRegistry: every catalog operation has a handler and every handler a
// declaration (newMux refuses either gap, and so does the start), and every
// span-attribute entry names an operation that declares a span.
func TestRegistry(t *testing.T) {
	s := &Supervisor{ids: statedb.NewIDs(), log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if _, err := s.newMux(); err != nil {
		t.Fatalf("the handler table and the catalog disagree: %v", err)
	}
	for id := range opSpans {
		op, ok := catalog.Lookup(id)
		if !ok {
			t.Errorf("opSpans has attributes for %s, which the catalog does not declare", id)
			continue
		}
		if op.Span == "" {
			t.Errorf("opSpans has attributes for %s, whose declaration names no span", id)
		}
	}
	for _, op := range catalog.Ops() {
		if op.Span != "" && !strings.Contains(op.Span, ".") {
			t.Errorf("%s declares span %q: span names are <subject>.<verb> (§10.2)", op.ID, op.Span)
		}
	}
}
