package bucket_test

import (
	"testing"
	"time"

	"github.com/agentmesh-io/agentmesh/agentkit/bucket"
)

// The server keeps whole seconds of a per-key TTL: keyTTL rounds up, so a
// key lives at least as long as asked (three heartbeats).
func TestKeyTTL(t *testing.T) {
	for d, want := range map[time.Duration]time.Duration{
		3900 * time.Millisecond: 4 * time.Second,
		1200 * time.Millisecond: 2 * time.Second,
		3 * time.Second:         3 * time.Second,
		100 * time.Millisecond:  time.Second,
	} {
		if got := bucket.KeyTTL(d); got != want {
			t.Errorf("KeyTTL(%v) = %v, want %v", d, got, want)
		}
	}
}
