package statedb

import (
	"crypto/rand"
	"strings"
	"sync"
	"time"

	"github.com/oklog/ulid/v2"
)

// IDs mints the contract's lowercase ULID-based IDs. ULIDs are monotonic
// within one millisecond so IDs of one kind sort by creation time; the
// entropy source is not safe for concurrent use, hence the mutex.
type IDs struct {
	mu      sync.Mutex
	entropy *ulid.MonotonicEntropy
}

// NewIDs returns an ID source; one per supervisor.
func NewIDs() *IDs {
	return &IDs{entropy: ulid.Monotonic(rand.Reader, 0)}
}

// New returns prefix followed by a fresh lowercase ULID.
func (s *IDs) New(prefix string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	id := ulid.MustNew(ulid.Timestamp(time.Now()), s.entropy)
	return prefix + strings.ToLower(id.String())
}
