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
	src      *source // the priority's source: its policy, and the pace that learns how long the handler took
	task     string  // the Mesh-Task-Id header: messages of one task are handled in order
	message  Message

	// set while the handler runs; see scan
	start  time.Time
	cancel context.CancelCauseFunc // ends the handler's ctx (errProcessingLimit at the limit)
	// span is the handle span, which the replies settle sends continue.
	span trace.Span
	// redelivered is the count of a redelivery that arrived while the
	// handler ran (see handledSet.begin); 0 if none did.
	redelivered atomic.Uint64
	// lastProgress is when d last had InProgress (or was received): set by
	// the reader before the scanner can see d, then read and written only
	// by the scanner.
	lastProgress time.Time
}

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
