package agentkit

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/subjects"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"
)

// delivery is a received message on its way through the runtime. It is
// one allocation holding everything the hot path needs: the check's
// results, the handler's Message and the keep-alive state.
type delivery struct {
	msg      jetstream.Msg
	env      *wire.Envelope
	subject  subjects.Subject
	delivery uint64
	seq      uint64
	priority wire.Priority
	policy   *DeliveryPolicy // the message's priority's: its processing limit and retry delays
	src      *source         // the consumer's source: its policy (ack timeouts, attempts), and the pace that learns how long the handler took
	task     string          // Mesh-Task-Id, or task_id of an envelope the reader decoded: messages of one task are handled in order
	message  Message

	// set while the handler runs; see scan
	start  time.Time
	cancel context.CancelCauseFunc // ends the handler's ctx (errProcessingLimit at the limit)
	// span is the handle span, which the replies settle sends continue.
	span trace.Span
	// fate says who settles d once its handler started: the worker when
	// the handler returns, or shutdown when it abandons the handler (see
	// receiver.awaitWorkers). Whoever moves it from fateRunning first.
	fate atomic.Int32
	// redelivered is the count of a redelivery that arrived while the
	// handler ran (see handledSet.begin); 0 if none did.
	redelivered atomic.Uint64
	// lastProgress is when d last had InProgress (or was received): set by
	// the reader before the scanner can see d, then read and written only
	// by the scanner.
	lastProgress time.Time
}

const (
	fateRunning   int32 = iota // the handler runs, or has not started
	fateSettling               // the handler returned: its worker settles d
	fateAbandoned              // shutdown gave d's message back; the handler's result is dropped
)

// finish claims the settling of d for its worker once the handler has
// returned. It is false when shutdown has abandoned the handler: d's
// message went back for redelivery, and acking or NAKing it again, or
// replying, would settle a message another instance may be handling.
func (d *delivery) finish() bool { return d.fate.CompareAndSwap(fateRunning, fateSettling) }

// abandon claims the settling of d for shutdown, unless its handler has
// returned (then its worker settles it, soon).
func (d *delivery) abandon() bool { return d.fate.CompareAndSwap(fateRunning, fateAbandoned) }

// abandoned reports whether shutdown has abandoned d's handler.
func (d *delivery) abandoned() bool { return d.fate.Load() == fateAbandoned }

// attempt is the delivery count the server has reached for d's message:
// d's own, or a redelivery's that overtook d's handler.
func (d *delivery) attempt() uint64 { return max(d.delivery, d.redelivered.Load()) }

// keepAlive calls progress for d (to send InProgress) when a progress
// interval has passed since the last one. Only the scanner calls it, so
// d.lastProgress needs no lock of its own.
func keepAlive(now time.Time, d *delivery, progress func(*delivery)) {
	if now.Sub(d.lastProgress) >= d.src.policy.progressInterval() {
		progress(d)
		d.lastProgress = now
	}
}
