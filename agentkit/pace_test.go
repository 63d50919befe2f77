package agentkit

import (
	"testing"
	"time"
)

func TestPrefetchFor(t *testing.T) {
	adaptive := DeliveryPolicy{BackOff: []time.Duration{10 * time.Second}, Prefetch: 64, MaxPrefetch: 512}
	fixed := adaptive
	fixed.MaxPrefetch = 0
	tests := []struct {
		name     string
		policy   DeliveryPolicy
		workers  int
		handling time.Duration
		want     int
	}{
		{"fixed without MaxPrefetch", fixed, 8, time.Microsecond, 64},
		{"Prefetch until the pace is known", adaptive, 8, 0, 64},
		{"fast handlers: capped at MaxPrefetch", adaptive, 8, time.Millisecond, 512},
		// 8 workers finish 8×5s/100ms = 400 in half the ack timeout; 8 of
		// them wait in the runtime's queue.
		{"in between", adaptive, 8, 100 * time.Millisecond, 392},
		{"one worker", adaptive, 1, 100 * time.Millisecond, 49},
		{"slower than the ack timeout: one", adaptive, 8, 30 * time.Second, 1},
	}
	for _, tt := range tests {
		if got := prefetchFor(tt.policy, tt.workers, tt.handling); got != tt.want {
			t.Errorf("%s: prefetchFor(%v, %d workers) = %d, want %d", tt.name, tt.handling, tt.workers, got, tt.want)
		}
	}
}

func TestPace_RisesFastFallsSlowly(t *testing.T) {
	var p pace
	p.observe(100 * time.Millisecond)
	if got := p.get(); got != 100*time.Millisecond {
		t.Fatalf("first sample: %v, want 100ms", got)
	}
	p.observe(300 * time.Millisecond)
	if got := p.get(); got != 200*time.Millisecond {
		t.Fatalf("after a slower sample: %v, want half-way, 200ms", got)
	}
	p.observe(40 * time.Millisecond)
	if got := p.get(); got != 180*time.Millisecond {
		t.Fatalf("after a faster sample: %v, want an eighth of the way, 180ms", got)
	}
	p.observe(0)
	if got := p.get(); got <= 0 {
		t.Fatalf("a zero sample made the pace %v: it must stay known (positive)", got)
	}
}
