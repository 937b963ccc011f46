package fuseoverlay

import (
	"bytes"
	"log"
	"maps"
	"sync"
)

// RequestCounter counts the FUSE requests a mount serves, by opcode. It is
// a measuring instrument for tests and the bench (Options.Requests): it
// works by turning on go-fuse's debug log and reading the opcode of every
// received request from it, which costs far more than the request itself,
// so a counted mount must not be timed.
type RequestCounter struct {
	mu sync.Mutex
	m  map[string]uint64
}

// Snapshot returns the counts so far.
func (c *RequestCounter) Snapshot() map[string]uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.m)
}

// Write takes one line of go-fuse's debug log ("rx UNIQUE: OPCODE ...").
func (c *RequestCounter) Write(p []byte) (int, error) {
	line, ok := bytes.CutPrefix(p, []byte("rx "))
	if !ok {
		return len(p), nil
	}
	_, rest, ok := bytes.Cut(line, []byte(": "))
	if !ok {
		return len(p), nil
	}
	op, _, _ := bytes.Cut(rest, []byte(" "))
	c.mu.Lock()
	if c.m == nil {
		c.m = map[string]uint64{}
	}
	c.m[string(op)]++
	c.mu.Unlock()
	return len(p), nil
}

func (c *RequestCounter) logger() *log.Logger { return log.New(c, "", 0) }
