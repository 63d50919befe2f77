package agentkit

import (
	"fmt"
	"runtime"
	"testing"
	"time"
)

// A handled sequence is remembered for one to two windows, a running one
// cannot begin twice, and a zero window remembers nothing.
func TestHandledSet(t *testing.T) {
	t.Parallel()
	var h handledSet
	h.init(time.Minute)
	t0 := h.rotated
	for _, seq := range []uint64{7, 1 << 40, 70_000} {
		h.add(seq)
	}
	for _, seq := range []uint64{7, 1 << 40, 70_000} {
		if !h.seen(seq) {
			t.Errorf("seen(%d) = false right after add", seq)
		}
	}
	if h.seen(8) {
		t.Error("seen(8) = true, never added")
	}
	h.rotate(t0.Add(30 * time.Second)) // within the window: nothing moves
	h.rotate(t0.Add(time.Minute))      // one window: the set becomes the old generation
	if !h.seen(7) {
		t.Error("forgotten after one window, want kept until the second")
	}
	h.add(9)
	h.rotate(t0.Add(2 * time.Minute)) // two windows: the first generation goes
	if h.seen(7) || !h.seen(9) {
		t.Errorf("after two windows seen(7) = %v, seen(9) = %v; want false, true", h.seen(7), h.seen(9))
	}

	first, redelivery := &delivery{seq: 5, delivery: 1}, &delivery{seq: 5, delivery: 2}
	if got, again := h.begin(first), h.begin(redelivery); got != startRun || again != startRunning {
		t.Errorf("begin(5) twice = %v, %v; want a run, then running", got, again)
	}
	if got := first.attempt(); got != 2 {
		t.Errorf("running delivery's attempt = %d after a redelivery overtook it, want 2", got)
	}
	h.end(5) // NAKed: not added, so a redelivery runs again
	if got := h.begin(&delivery{seq: 5, delivery: 3}); got != startRun {
		t.Errorf("begin(5) after a run that ended unsettled = %v, want a run", got)
	}
	// Settled (added) and ended: a redelivery that passed seen before the
	// run ended finds it done.
	h.add(5)
	h.end(5)
	if got := h.begin(&delivery{seq: 5, delivery: 4}); got != startDone {
		t.Errorf("begin(5) after its run settled = %v, want done", got)
	}

	var off handledSet
	off.init(0)
	off.add(7)
	if off.seen(7) || off.begin(&delivery{seq: 7}) != startRun || off.begin(&delivery{seq: 7}) != startRun {
		t.Error("a zero window must remember nothing")
	}
}

// BenchmarkHandledSet records b.N handled messages and reports the heap
// they hold, for an agent taking every message of the stream and one
// taking one in a hundred.
func BenchmarkHandledSet(b *testing.B) {
	for _, stride := range []uint64{1, 100} {
		b.Run(fmt.Sprintf("stride-%d", stride), func(b *testing.B) {
			var h handledSet
			h.init(time.Hour)
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			b.ResetTimer()
			for i := range uint64(b.N) {
				seq := (i + 1) * stride
				if h.add(seq); !h.seen(seq) {
					b.Fatalf("seen(%d) = false after add", seq)
				}
			}
			b.StopTimer()
			runtime.GC()
			runtime.ReadMemStats(&after)
			b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/float64(b.N), "heap-B/msg")
			runtime.KeepAlive(&h)
		})
	}
}
