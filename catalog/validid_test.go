package catalog

import (
	"regexp"
	"strings"
	"testing"
)

// TestValidID holds the hand-written ID check to the contract's rule,
// written as the regexp it replaces.
func TestValidID(t *testing.T) {
	rule := regexp.MustCompile(`^[A-Za-z0-9._:-]{1,128}$`)
	cases := []string{
		"", "a", "Z", "0", ".", "_", ":", "-", "sbx-01m8yxwmxyvvbxwch425xm6v0e", "ws.a_b:c-9",
		strings.Repeat("a", 127), strings.Repeat("a", 128), strings.Repeat("a", 129),
		"a b", "a/b", "a\x00", "é", "a\n", "\na", "a+b", "a@b", "[", "`", "{", "~", "/", "@",
		"\xff", strings.Repeat("é", 64),
	}
	for _, s := range cases {
		if got, want := ValidID(s), rule.MatchString(s); got != want {
			t.Errorf("ValidID(%q) = %v, want %v", s, got, want)
		}
	}
	for c := 0; c < 256; c++ {
		s := string([]byte{byte(c)})
		if got, want := ValidID(s), rule.MatchString(s); got != want {
			t.Errorf("ValidID(%q) = %v, want %v", s, got, want)
		}
	}
}
