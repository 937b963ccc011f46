package supervisor

import (
	"crypto/rand"
	"strings"
	"sync"
	"time"

	"github.com/oklog/ulid/v2"
)

// idSource mints the contract's lowercase ULID-based IDs. ULIDs are monotonic
// within one millisecond so IDs of one kind sort by creation time; the
// entropy source is not safe for concurrent use, hence the mutex.
type idSource struct {
	mu      sync.Mutex
	entropy *ulid.MonotonicEntropy
}

func newIDSource() *idSource {
	return &idSource{entropy: ulid.Monotonic(rand.Reader, 0)}
}

func (s *idSource) new(prefix string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	id := ulid.MustNew(ulid.Timestamp(time.Now()), s.entropy)
	return prefix + strings.ToLower(id.String())
}
