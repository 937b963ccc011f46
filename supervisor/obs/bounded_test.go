package obs

import (
	"strings"
	"testing"
)

func TestBoundedError(t *testing.T) {
	long := strings.Repeat("é", 5000)
	got := BoundedError(long)
	if len(got) > 4096 || !strings.HasPrefix(long, got) || !strings.HasSuffix(got, "é") {
		t.Fatalf("bounded error: %d bytes", len(got))
	}
	if BoundedError("short") != "short" {
		t.Fatal("a short error was changed")
	}
}
