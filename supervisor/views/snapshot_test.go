package views

import (
	"strings"
	"testing"
)

func TestViewBoundedError(t *testing.T) {
	long := strings.Repeat("é", 5000)
	got := BoundedError(long)
	if len(got) > nodeErrorMax || !strings.HasPrefix(long, got) || !strings.HasSuffix(got, "é") {
		t.Fatalf("bounded error: %d bytes", len(got))
	}
}
