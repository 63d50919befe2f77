package agentkit

import (
	"sync"
	"time"

	"github.com/RoaringBitmap/roaring/v2/roaring64"
)

// handledSet remembers the stream sequences of messages this agent
// instance finished (acked, terminated or rerouted), so a redelivery of one
// of them is acked without running the handler again. JetStream delivers
// at least once: when a consumer's leader fails, acks it had not yet
// replicated are lost and the new leader redelivers messages that were
// already handled. The broker's duplicate window stops a message being
// stored twice; this stops it being handled twice.
//
// Two generations of a set bounded in time: entries live between one and
// two windows. The generations are compressed bitmaps (roaring): about 3
// bytes per message handled in that time when the agent takes one message
// in a hundred of the stream, a fraction of a byte when it takes most of
// them (BenchmarkHandledSet). A hash set took 38, which at tens of
// thousands of messages a second over a window of minutes is hundreds of
// megabytes.
// It is per instance: another instance of the same agent may still see a
// redelivery, so handlers with side effects should stay idempotent.
type handledSet struct {
	mu       sync.Mutex
	cur, old *roaring64.Bitmap
	running  map[uint64]*delivery // by stream sequence: the deliveries whose handler runs now
	window   time.Duration
	rotated  time.Time
}

func (h *handledSet) init(window time.Duration) {
	h.window, h.rotated = window, time.Now()
	if window > 0 {
		h.cur, h.old, h.running = roaring64.New(), roaring64.New(), map[uint64]*delivery{}
	}
}

// start is what begin found for a delivery.
type start int

const (
	startRun     start = iota // no handler ran it: d's runs now
	startRunning              // a handler for it runs on this instance now
	startDone                 // a handler finished it (acked, terminated or rerouted)
)

// begin marks d's message as being handled and returns startRun, unless
// a handler for it already runs on this instance (startRunning: d is a
// redelivery that overtook a slow handler, whose InProgress came too
// late) or finished it (startDone). Acks, NAKs and InProgress act on the
// stream sequence, so the running handler's outcome settles the message
// and a second run is not started; the running delivery learns d's count,
// the attempt the server has reached, so it knows whether it settles the
// last one. The finished set is checked here, under the same lock as the
// running one, because settling adds a sequence before its run ends: a
// redelivery checked against the set just before its first run finished
// would otherwise find neither.
func (h *handledSet) begin(d *delivery) start {
	if h.window <= 0 || d.seq == 0 {
		return startRun
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if run, ok := h.running[d.seq]; ok {
		if d.delivery > run.redelivered.Load() {
			run.redelivered.Store(d.delivery)
		}
		return startRunning
	}
	if h.cur.Contains(d.seq) || h.old.Contains(d.seq) {
		return startDone
	}
	h.running[d.seq] = d
	return startRun
}

// end unmarks seq once its handler has been settled.
func (h *handledSet) end(seq uint64) {
	if h.window <= 0 || seq == 0 {
		return
	}
	h.mu.Lock()
	delete(h.running, seq)
	h.mu.Unlock()
}

// seen reports whether seq was handled recently.
func (h *handledSet) seen(seq uint64) bool {
	if h.window <= 0 || seq == 0 {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.cur.Contains(seq) || h.old.Contains(seq)
}

// add records seq as handled.
func (h *handledSet) add(seq uint64) {
	if h.window <= 0 || seq == 0 {
		return
	}
	h.mu.Lock()
	h.cur.Add(seq)
	h.mu.Unlock()
}

// rotate drops the older generation once a window has passed.
func (h *handledSet) rotate(now time.Time) {
	if h.window <= 0 {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if now.Sub(h.rotated) < h.window {
		return
	}
	h.old, h.cur, h.rotated = h.cur, roaring64.New(), now
}
