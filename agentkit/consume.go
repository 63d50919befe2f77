package agentkit

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/internal/bound"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// read pulls one priority's messages and hands them to the workers, which
// decode and check them. Replies (marked by the Mesh-In-Reply-To header) are
// settled here instead, so a Request waiting in a handler never needs a free
// worker to receive its response. When an iterator of src ends its
// generation, read waits until out holds fewer messages than the handlers'
// pace calls for and opens the next generation for the difference (see
// room): out has room for all of it, so every message passes straight
// into the queue, where the scanner keeps it alive (see waiting), as it
// does a reply while read fetches its large envelope. When the server
// ends an iterator (see reopen), read opens another one.
func (a *Agent) read(src *source, out chan<- *delivery) {
	it := src.current()
	retry := reopenBackOff()
	failing := &a.failing[src.queue] // what Err reports while the server turns the reader away
	failed := false                  // the last Next failed
	for {
		msg, err := it.Next()
		switch {
		case err == nil:
			if failed {
				failed = false
				retry.Reset()
			}
			if failing.Load() != nil { // also after a failed reopen
				failing.Store(nil)
			}
		case errors.Is(err, jetstream.ErrConnectionClosed):
			return // the connection watch stops the agent
		case errors.Is(err, jetstream.ErrMsgIteratorClosed):
			n, ok := a.room(src, out)
			if !ok {
				return
			}
			if it = a.reopen(src, n, failed, retry); it == nil {
				return
			}
			continue
		default:
			err = fmt.Errorf("agentkit: %s consumer of %s: %w", src.label(), a.id, err)
			failing.Store(&err)
			a.asyncError(err)
			failed = true
			continue
		}
		h := msg.Headers()
		if h.Get(headerPinID) != "" {
			src.repin.Store(true) // nats.go took it for a pin; receive terminates the message
		}
		d := &delivery{msg: msg, priority: src.spec.priority, policy: &src.policy, src: src, task: h.Get(wire.HeaderTaskID), lastProgress: time.Now()}
		if md, err := msg.Metadata(); err == nil {
			d.delivery, d.seq = md.NumDelivered, md.Sequence.Stream
		}
		if src.spec.class != "" && !a.admitFanout(d, h) {
			continue
		}
		if h.Get(wire.HeaderInReplyTo) != "" {
			src.waiting.add(d) // kept alive while a large reply is fetched
			ok := a.receive(d)
			src.waiting.remove(d)
			if !ok {
				continue
			}
		}
		if d.task != "" && !a.lanes.enter(d) {
			continue // queued behind the running message of its task
		}
		src.waiting.add(d)
		select {
		case out <- d:
		case <-a.quit:
			// Stopping: give the message straight back for redelivery.
			a.giveBack(d)
			return
		}
	}
}

// reopen opens src's next iterator for n messages (see source.reopen).
// The server ends an iterator with an error when its consumer is deleted
// or when it rejects the pull requests (a consumer recreated with a
// priority group answers 400), and may do so again at once: after such an
// error (failed), and while opening fails, reopen first pauses for retry's
// next interval. So a reader the server turns away neither spins nor
// gives up: it reports every failure (one pulling from a deleted consumer
// reports missing heartbeats, one per pull expiry) and reads again once
// the server serves it. It returns nil once src is stopped (which ends a
// pause at once) or the connection is closing.
func (a *Agent) reopen(src *source, n int, failed bool, retry backoff.BackOff) jetstream.MessagesContext {
	for {
		if failed && !src.pause(retry.NextBackOff()) {
			return nil
		}
		ctx, cancel := context.WithTimeout(context.Background(), a.opts.attemptTimeout)
		it, err := src.reopen(ctx, n)
		cancel()
		if err == nil {
			return it
		}
		err = fmt.Errorf("agentkit: consume %s for %s: %w", src.label(), a.id, err)
		a.failing[src.queue].Store(&err)
		a.asyncError(err)
		if a.nc.IsClosed() || a.nc.IsDraining() {
			return nil // nats.go never reopens a connection
		}
		failed = true
	}
}

// admitFanout reports whether the fan-out message d (with headers h) goes
// on to a worker. The reader acks without decoding what is not for this
// agent: its own broadcast or topic message, and one whose Mesh-Action
// header names an action the agent does not handle (a header that lies
// about the action only gets its own sender's message ignored; a message
// without the header is checked by its envelope, in handle). d takes the
// priority its subject names, for hooks and logs, and that priority's
// processing limit and retry delays (its consumer's ack timeouts and
// attempts are those of the class's highest priority).
func (a *Agent) admitFanout(d *delivery, h nats.Header) bool {
	sub, err := a.opts.scheme.Parse(d.msg.Subject())
	if err != nil {
		return true // receive terminates it as invalid
	}
	d.subject, d.priority = sub, wire.Priority(sub.Priority)
	d.policy = a.policies[d.priority]
	switch {
	case sub.Sender == a.id:
		a.settleAck(d, OutcomeOwn)
		return false
	case h.Get(wire.HeaderAction) != "" && !a.fanout[h.Get(wire.HeaderAction)]:
		a.settleAck(d, OutcomeIgnored)
		return false
	}
	return true
}

// room waits until out holds fewer messages than src's target (see
// source.target) and returns how many more it may take, or false once the
// agent stops.
func (a *Agent) room(src *source, out chan<- *delivery) (int, bool) {
	for {
		if n := src.target() - len(out); n > 0 {
			return n, true
		}
		select {
		case <-src.taken:
		case <-a.quit:
			return 0, false
		}
	}
}

// work runs handlers for messages from queues, always preferring the
// earliest queue with a message waiting (queues are in priority order).
// w.slot publishes the running handler to the keep-alive scanner and to
// shutdown. A message stays in its source's waiting set, where the scanner
// keeps it alive, until handle has received it (see handle). A worker
// whose handler shutdown abandoned returns as soon as the handler does,
// touching nothing of the stopped agent.
func (a *Agent) work(queues []chan *delivery, w *worker) {
	defer a.left(w)
	for {
		d, ok := a.next(queues)
		if !ok {
			return
		}
		d.src.took()
		if a.stopping.Load() {
			a.giveBack(d) // Stop: queued messages go back unhandled
			continue
		}
		if !a.handle(d, &w.slot) {
			return
		}
		// The task's next message, in stream order, runs on this worker.
		for d.task != "" {
			if d = a.lanes.leave(d); d == nil {
				break
			}
			if a.stopping.Load() {
				a.giveBack(d)
				continue
			}
			if !a.handle(d, &w.slot) {
				return
			}
		}
	}
}

// worker is what the keep-alive scanner and shutdown see of one handler
// goroutine.
type worker struct {
	slot atomic.Pointer[delivery] // the delivery whose handler runs; nil between handlers
	gone atomic.Bool              // work has returned
}

// left marks w's worker as returned and wakes awaitWorkers.
func (a *Agent) left(w *worker) {
	w.gone.Store(true)
	select {
	case a.exits <- struct{}{}:
	default: // a wake-up is pending already; awaitWorkers looks at every worker
	}
}

// awaitWorkers waits for the workers to return. Once the handlers'
// contexts are cancelled (a.cut: Stop, a Drain whose ctx ended, a closed
// connection), it waits at most the stop grace; then it abandons the
// handlers still running (see abandon) and waits only for the other
// workers, which are settling or handing messages back, within the
// timeouts of those calls. It returns how many handlers it abandoned;
// their workers return when the handlers do.
func (a *Agent) awaitWorkers() int {
	cut := a.cut
	var grace <-chan time.Time
	abandoned := 0
	for !a.idle() {
		select {
		case <-a.exits:
		case <-cut:
			cut = nil
			t := time.NewTimer(a.opts.stopGrace)
			defer t.Stop()
			grace = t.C
		case <-grace:
			grace = nil
			abandoned = a.abandon()
		}
	}
	return abandoned
}

// idle reports whether every worker has returned or waits only for an
// abandoned handler.
func (a *Agent) idle() bool {
	for i := range a.crew {
		w := &a.crew[i]
		if w.gone.Load() {
			continue
		}
		if d := w.slot.Load(); d == nil || !d.abandoned() {
			return false
		}
	}
	return true
}

// abandon gives up the handlers still running: it NAKs their messages for
// immediate redelivery, as Stop does those not started, and returns how
// many. The broker may redeliver one to another instance while its
// handler here still runs (delivery is at least once); what the handler
// returns is dropped (see delivery.finish). A handler that starts after
// this is not missed: shutdown set stopping before, and handle hands a
// message back when it finds stopping set once its slot is published.
func (a *Agent) abandon() int {
	n := 0
	for i := range a.crew {
		d := a.crew[i].slot.Load()
		if d == nil || !d.abandon() {
			continue
		}
		err := fmt.Errorf("%w: %s handler of %s message %d still running %v after its context was cancelled",
			ErrHandlersAbandoned, d.env.Action, a.id, d.seq, a.opts.stopGrace)
		berr := a.brokerErr(d.msg.Nak(), d, "nak")
		a.stats.add(OutcomeNak)
		a.settled(d, SettleEvent{Outcome: OutcomeNak, Elapsed: time.Since(d.start), Err: err, BrokerErr: berr})
		n++
	}
	return n
}

// giveBack takes d, which no handler will run, off the waiting set and
// NAKs it for redelivery.
func (a *Agent) giveBack(d *delivery) {
	d.src.waiting.remove(d)
	a.handBack(d)
}

// handBack NAKs d, which no handler ran, for immediate redelivery: the
// agent is stopping.
func (a *Agent) handBack(d *delivery) {
	a.settled(d, SettleEvent{Outcome: OutcomeNak, BrokerErr: a.brokerErr(d.msg.Nak(), d, "nak")})
}

// next returns the highest-priority waiting delivery, blocking until one
// arrives; ok is false once the agent is shutting down and the queues are
// empty.
func (a *Agent) next(queues []chan *delivery) (*delivery, bool) {
	if d := poll(queues); d != nil {
		return d, true
	}
	if len(queues) == 2 {
		select {
		case d := <-queues[0]:
			return d, true
		case d := <-queues[1]:
			return d, true
		case <-a.quit:
		}
	} else {
		select {
		case d := <-queues[0]:
			return d, true
		case d := <-queues[1]:
			return d, true
		case d := <-queues[2]:
			return d, true
		case d := <-queues[3]:
			return d, true
		case d := <-queues[4]:
			return d, true
		case d := <-queues[5]:
			return d, true
		case d := <-queues[6]:
			return d, true
		case <-a.quit:
		}
	}
	// Shutting down, and select may pick quit over a message that arrived
	// with it: take what the readers left (Drain handles it, Stop NAKs it).
	d := poll(queues)
	return d, d != nil
}

// poll returns the first message waiting in queues, or nil.
func poll(queues []chan *delivery) *delivery {
	for _, q := range queues {
		select {
		case d := <-q:
			return d
		default:
		}
	}
	return nil
}

// receive decodes and checks d's message. It returns false when the
// message has been settled without a handler: bad input, expired, our own
// broadcast, or a reply. It is idempotent, so a reply checked by the reader
// passes the worker's check again at no cost.
func (a *Agent) receive(d *delivery) bool {
	if d.env != nil {
		return true
	}
	msg := d.msg
	data := msg.Data()
	if len(data) > a.opts.maxEnvelope {
		a.terminateInvalid(d, fmt.Sprintf("envelope of %d bytes exceeds the %d byte limit", len(data), a.opts.maxEnvelope))
		return false
	}
	var env *wire.Envelope
	var err error
	if msg.Headers().Get(headerPinID) != "" {
		// The server's header, on consumers that pin a client; the
		// agent's pin none, so the sender wrote it (see source.reopen).
		a.terminateInvalid(d, headerPinID+" is the server's header, and this consumer pins no client")
		return false
	}
	if ref := msg.Headers().Get(wire.HeaderEnvelopeRef); ref != "" {
		// The ref names an object, so a subject: checked before any request is built from it.
		if reason := checkRef(ref, msg.Headers().Get(wire.HeaderMsgID)); reason != "" {
			a.terminateInvalid(d, reason)
			return false
		}
		var reason string
		env, reason, err = a.claim(ref, msg)
		if err != nil { // the store is unreachable: try again later
			err = fmt.Errorf("agentkit: fetch large envelope %s: %w", ref, err)
			a.asyncError(err)
			berr := a.brokerErr(msg.NakWithDelay(d.policy.retryDelay(d.delivery)), d, "nak")
			a.stats.add(OutcomeNak)
			a.settled(d, SettleEvent{Outcome: OutcomeNak, Err: err, BrokerErr: berr})
			return false
		}
		if reason != "" {
			a.terminateInvalid(d, reason)
			return false
		}
	} else if env, err = wire.Decode(data); err != nil {
		a.terminateInvalid(d, err.Error())
		return false
	}
	sub := d.subject // parsed already by a fan-out reader (admitFanout)
	if sub.Kind == "" {
		if sub, err = a.opts.scheme.Parse(msg.Subject()); err != nil {
			a.terminateInvalid(d, err.Error())
			return false
		}
	}
	if reason := a.checkRouting(env, sub); reason != "" {
		a.terminateInvalid(d, reason)
		return false
	}
	if d.task != "" && env.TaskID != d.task {
		a.terminateInvalid(d, fmt.Sprintf("task_id %q does not match the %s header %s", env.TaskID, wire.HeaderTaskID, bound.Quote(d.task)))
		return false
	}
	d.env, d.subject = env, sub
	if sub.Kind != subjects.KindDirect && env.SenderID == a.id {
		// Our own broadcast or topic message: not for us to handle.
		a.settleAck(d, OutcomeOwn)
		return false
	}
	if env.Expired(time.Now()) {
		a.settleAck(d, OutcomeExpired)
		if env.RequiresAck {
			a.reply(d, env.NewAck(a.id, wire.NewError(wire.CodeExpired, "ttl of %dms passed before handling", env.TTLMillis), 0))
		}
		return false
	}
	if sub.Kind == subjects.KindDirect && env.InReplyTo != "" && env.MessageType != wire.TypeRequest && env.MessageType != wire.TypeNotification {
		// Only a direct message answers: a broadcast or topic message that
		// names a request in in_reply_to is anybody's guess at its id.
		if w := a.send.takeWaiter(env); w != nil {
			a.settleAck(d, OutcomeReply)
			w.ch <- env // after counting, so the woken caller sees the count
			return false
		}
		if a.handler(env.Action) == nil {
			a.settleAck(d, OutcomeLateReply)
			return false
		}
	}
	return true
}

// headerPinID carries the pinned client's id on messages of a consumer
// with a pinned-client priority group.
const headerPinID = "Nats-Pin-Id"

// checkRouting returns why env may not arrive on sub, or "".
func (a *Agent) checkRouting(env *wire.Envelope, sub subjects.Subject) string {
	switch {
	case env.SenderID != sub.Sender:
		return fmt.Sprintf("sender_id %q does not match the subject's sender %q", env.SenderID, sub.Sender)
	case string(env.Priority) != sub.Priority:
		return fmt.Sprintf("priority %q does not match the subject's priority %q", env.Priority, sub.Priority)
	}
	switch sub.Kind {
	case subjects.KindDirect:
		if env.ReceiverID != a.id {
			return fmt.Sprintf("receiver_id %q is not this agent %q", env.ReceiverID, a.id)
		}
	case subjects.KindTopic:
		if env.Topic != sub.Topic {
			return fmt.Sprintf("topic %q does not match the subject's topic %q", env.Topic, sub.Topic)
		}
	case subjects.KindBroadcast:
		if env.ReceiverID != "" || env.Topic != "" {
			return "a broadcast must name neither receiver_id nor topic"
		}
	default:
		return fmt.Sprintf("subject kind %q is not deliverable to agents", sub.Kind)
	}
	return ""
}

// handle checks d, runs its handler and settles the message. d comes in
// the waiting set, so the scanner keeps it alive while receive fetches a
// large envelope, which can take longer than the ack timeout; from the
// handler's start, the slot does. It returns false when shutdown
// abandoned the handler (see Agent.abandon): the message is not settled
// here, and the worker must return.
func (a *Agent) handle(d *delivery, slot *atomic.Pointer[delivery]) bool {
	if a.handled.seen(d.seq) {
		// Before receive: a large envelope is not fetched again, and once
		// acked it is gone from the object store.
		d.src.waiting.remove(d)
		a.settleAck(d, OutcomeDuplicate)
		return true
	}
	ok := a.receive(d)
	d.src.waiting.remove(d)
	if !ok {
		return true
	}
	if !a.handled.begin(d) {
		a.stats.add(OutcomeDuplicate) // the run in progress settles it, and reports it to the hooks
		return true
	}
	defer a.handled.end(d.seq)
	h := a.handler(d.env.Action)
	if d.subject.Kind != subjects.KindDirect && !a.fanout[d.env.Action] {
		// Broadcasts and topics reach every agent that listens: one not
		// meant for this agent's handlers is no failure of anyone's.
		a.settleAck(d, OutcomeIgnored)
		return true
	}
	if h == nil {
		a.settle(d, Reject(wire.CodeCapabilityMissing, fmt.Sprintf("agent %s has no handler for action %q", a.id, d.env.Action)), 0)
		return true
	}
	ctx, span := a.tracing.startHandle(withHandling(a.runCtx, d.env), d)
	ctx, cancel := context.WithCancelCause(ctx)
	d.start, d.cancel, d.span = time.Now(), cancel, span
	d.message = Message{Envelope: d.env, Subject: d.msg.Subject(), Delivery: d.delivery, StreamSeq: d.seq, agent: a, msg: d.msg}
	slot.Store(d)
	if a.stopping.Load() {
		// Stop began while receive ran: the message goes back unstarted,
		// like those queued. Checked after the slot is published, so
		// shutdown, which sets stopping before it looks for handlers to
		// abandon, sees every handler that starts.
		slot.Store(nil)
		cancel(nil)
		endSpan(span, ErrClosed)
		a.handBack(d)
		return true
	}
	a.inFlight.Add(1)
	err := a.call(ctx, h, &d.message)
	a.inFlight.Add(-1)
	slot.Store(nil)
	limited := context.Cause(ctx) == errProcessingLimit
	cancel(nil)
	if !d.finish() {
		// Abandoned by shutdown, which handed the message back: another
		// instance may be handling it now.
		endSpan(span, err)
		return false
	}
	if err != nil && limited && errors.Is(err, context.Canceled) {
		err = fmt.Errorf("%w: processing limit %v reached", context.DeadlineExceeded, d.policy.ProcessingLimit)
	}
	elapsed := time.Since(d.start)
	d.src.pace.observe(elapsed)
	a.settle(d, err, elapsed)
	endSpan(span, err)
	return true
}

// scan is the agent's one keep-alive goroutine. Every tick it sends
// InProgress for every message the runtime holds, running or waiting for a
// worker, that has gone a progress interval (a quarter of the shortest ack
// timeout) without one, so neither a slow handler nor the queue behind it
// is taken for a dead consumer; and it cancels handlers that reached their
// processing limit. One scanner instead of a timer per message keeps the
// hot path cheap.
func (a *Agent) scan(crew []worker, tick time.Duration, done <-chan struct{}) {
	t := time.NewTicker(tick)
	defer t.Stop()
	progress := func(d *delivery) { a.brokerErr(d.msg.InProgress(), d, "in progress") }
	for {
		select {
		case <-done:
			return
		case now := <-t.C:
			for i := range crew {
				d := crew[i].slot.Load()
				if d == nil {
					continue
				}
				if now.Sub(d.start) >= d.policy.ProcessingLimit {
					d.cancel(errProcessingLimit) // no more InProgress: the broker will see a timeout unless the handler returns
					continue
				}
				keepAlive(now, d, progress)
			}
			for _, s := range *a.sources.Load() {
				s.waiting.keepAlive(now, progress)
			}
			a.lanes.keepAlive(now, progress)
			a.handled.rotate(now)
		}
	}
}

// call runs h, turning a panic into an error.
func (a *Agent) call(ctx context.Context, h Handler, m *Message) (err error) {
	defer func() {
		if r := recover(); r != nil {
			a.stats.add(OutcomePanic)
			a.opts.logger.Error("handler panicked", "agent", a.id, "action", m.Action, "message_id", m.MessageID, "panic", r, "stack", string(debug.Stack()))
			err = &retryError{code: wire.CodeInternal, err: fmt.Errorf("%w: %v", ErrHandlerPanic, r)}
		}
	}()
	return h.Handle(ctx, m)
}
