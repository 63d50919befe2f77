package agentkit

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/internal/bound"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// receiver is the agent's receive side. It owns what consumes and settles
// messages: the handler table and the fan-out actions, the delivery
// policies, the sources (a consumer and its reader each) and the queues
// they fill, the workers and their task lanes, the keep-alive scanner, the
// recently handled messages, each reader's connection failure, and how
// the handlers are stopped. It reads the agent's identity, connection,
// options, counters, tracing and payload store, and changes none of them;
// replies go out through the send side, which also holds the calls
// waiting for them. What else settling needs of the agent (a reroute
// through the registry, a task record) it asks of host.
type receiver struct {
	handlers map[string]Handler                // set by Handle before Start, read-only after
	fanout   map[string]bool                   // the fan-out actions handled; set by Start (see WithFanoutActions)
	policies map[wire.Priority]*DeliveryPolicy // opts.policies, for deliveries to point at
	sources  atomic.Pointer[[]*source]         // set by Start: one per direct priority, then the fan-out ones
	queues   [len(queueOrder)]chan *delivery
	// failing is, per queue in queueOrder, the error of a reader the
	// server currently turns away (see Agent.Err).
	failing  [len(queueOrder)]atomic.Pointer[error]
	quit     chan struct{} // closed when readers must give up their message
	quitOnce sync.Once
	stopping atomic.Bool   // set by Stop: cancelled handlers are NAKed for immediate redelivery
	cut      chan struct{} // closed once handlers' contexts are cancelled: the stop grace runs from here
	cutOnce  sync.Once
	crew     []worker      // the handler workers (see work, awaitWorkers)
	exits    chan struct{} // a worker returned (see left)
	runCtx   context.Context
	cancel   context.CancelFunc
	readers  sync.WaitGroup
	scanner  sync.WaitGroup // the keep-alive scanner
	scanDone chan struct{}
	idleScan sleeper      // lets the scanner sleep while the agent holds no message
	lanes    lanes        // per-task ordering
	handled  handledSet   // recently finished stream sequences
	inFlight atomic.Int64 // handlers running, for load and BUSY
	// invalidLog samples the log of invalid input.
	invalidLog *sampledLog

	id      string
	nc      *nats.Conn
	opts    *options
	stats   *counters
	tracing *tracing
	objects *payloadStore
	send    *sender // replies, and the calls waiting for them
	host    receiveHost
}

// receiveHost is what settling asks of the rest of the agent.
type receiveHost interface {
	// reroute forwards env to an agent with capability, which it finds
	// in the registry; nil once the forward is stored.
	reroute(ctx context.Context, env *wire.Envelope, capability string) error
	// queueTask hands an acked message to the task tracker.
	queueTask(env *wire.Envelope)
}

// open starts consuming sources: a reader for each, filling its queue.
func (r *receiver) open(sources []*source) {
	r.sources.Store(&sources)
	r.quit, r.cut, r.exits = make(chan struct{}), make(chan struct{}), make(chan struct{}, 1)
	r.runCtx, r.cancel = context.WithCancel(context.Background())
	for q, spec := range queueOrder {
		// An adaptive source's queue holds its largest generation besides
		// one message per worker, so its reader never leaves a message in
		// the client's buffer, where nothing keeps it alive (see
		// source.reopen). A fixed one holds a message per worker.
		depth := r.opts.concurrency
		if pol := r.opts.policies[spec.priority]; pol.MaxPrefetch > 0 && !fedByGroup(sources, q) {
			depth += max(pol.MaxPrefetch, pol.Prefetch)
		}
		r.queues[q] = make(chan *delivery, depth)
	}
	for _, src := range sources {
		r.readers.Go(func() { r.read(src, r.queues[src.queue]) })
	}
}

// fedByGroup reports whether queue q is filled only from a group's inbox:
// the group's buffer then bounds what waits (see Group.room), and a
// message per worker in the queue is enough.
func fedByGroup(sources []*source, q int) bool {
	fed := false
	for _, s := range sources {
		if s.queue == q {
			if s.inbox == nil {
				return false // a catch-up's generations need the room
			}
			fed = true
		}
	}
	return fed
}

// startWorkers starts the handler workers and the keep-alive scanner.
func (r *receiver) startWorkers() {
	r.crew = make([]worker, r.opts.concurrency+1)
	// The workers are owned through crew: shutdown waits for them with
	// awaitWorkers, which may leave a stuck handler's worker behind.
	go r.work(r.queues[:2], &r.crew[0]) // critical's own worker: direct, then urgent fan-out
	for i := range r.opts.concurrency {
		go r.work(r.queues[:], &r.crew[i+1])
	}
	r.scanDone = make(chan struct{})
	r.idleScan.wake = make(chan struct{}, 1) // before the scanner first sleeps: poke reads it only then
	r.scanner.Go(func() { r.scan(r.crew, r.keepAliveTick(), r.scanDone) })
}

// standDown stops the sources' fetching: another instance's turn began
// (see turns).
func (r *receiver) standDown() {
	if p := r.sources.Load(); p != nil {
		for _, s := range *p {
			s.standDown()
		}
	}
}

// drain is Drain's part of shutdown: the readers stop fetching and hand
// the workers what the client holds, then give up.
func (r *receiver) drain() {
	for _, s := range *r.sources.Load() {
		s.stop(true)
	}
	r.readers.Wait()
	r.closeQuit()
}

// stopScanner stops the keep-alive scanner, once the workers are done.
func (r *receiver) stopScanner() {
	close(r.scanDone)
	r.scanner.Wait()
}

// handBackStranded gives back, for redelivery, the messages no worker
// took: queued behind a task that was cut short, or handed to a queue as
// the workers stopped.
func (r *receiver) handBackStranded() {
	stranded := r.lanes.drop()
	for _, s := range *r.sources.Load() {
		stranded = append(stranded, s.waiting.drop()...)
	}
	for _, d := range stranded {
		r.handBack(d)
	}
}

// keepAliveTick is the scanner's period: half the shortest progress
// interval of any priority, so InProgress is never later than 3/8 of an ack
// timeout after the previous one.
func (r *receiver) keepAliveTick() time.Duration {
	tick := time.Duration(math.MaxInt64)
	for _, p := range r.opts.policies {
		tick = min(tick, p.progressInterval()/2)
	}
	return max(tick, time.Millisecond)
}

// fanoutActions returns the actions the agent handles when they come as
// a broadcast or topic message: those of WithFanoutActions that have a
// handler, or every handled action.
func (r *receiver) fanoutActions() map[string]bool {
	out := map[string]bool{}
	for action := range r.handlers {
		if r.opts.fanoutActions == nil || slices.Contains(r.opts.fanoutActions, action) {
			out[action] = true
		}
	}
	return out
}

// stopNow ends consuming at once: nothing more is fetched or started and
// the running handlers' contexts are cancelled, which starts the stop
// grace (see awaitWorkers). It is Stop's part of shutdown, and Drain's
// once its ctx has ended; it runs once.
func (r *receiver) stopNow() {
	r.cutOnce.Do(func() {
		r.stopping.Store(true)
		for _, s := range *r.sources.Load() {
			s.stop(false)
		}
		r.awaitUnsubscribed()
		r.closeQuit()
		r.cancel()
		close(r.cut)
	})
}

// closeQuit closes quit once: Drain closes it when the readers have
// emptied the client's buffer, stopNow at once.
func (r *receiver) closeQuit() { r.quitOnce.Do(func() { close(r.quit) }) }

// awaitUnsubscribed waits (up to the attempt timeout) until nats.go has
// removed the stopped iterators' pull subscriptions. Their UNSUB is then
// on the connection ahead of the NAKs that hand running messages back; a
// NAK that overtook it would have the server redeliver the message into
// this instance's own pull request, where nobody reads it, instead of to
// another instance (the message would wait out its ack timeout). Stop
// unsubscribes from a goroutine of nats.go's; the iterator's Closed
// channel says when it is done.
func (r *receiver) awaitUnsubscribed() {
	timeout := time.NewTimer(r.opts.attemptTimeout)
	defer timeout.Stop()
	for _, s := range *r.sources.Load() {
		c, ok := s.current().(interface{ Closed() <-chan struct{} })
		if !ok {
			continue
		}
		select {
		case <-c.Closed():
		case <-timeout.C:
			return
		}
	}
}

func (r *receiver) handler(action string) Handler {
	// handlers is immutable once started; reads need no lock.
	return r.handlers[action]
}

func (r *receiver) asyncError(err error) { r.opts.errorHandler(err) }

// read pulls one priority's messages and hands them to the workers, which
// decode and check them. Replies (marked by the Mesh-In-Reply-To header) are
// settled here instead, so a Request waiting in a handler never needs a free
// worker to receive its response. A message without the mirrored headers
// (see wire.Mirrored) is decoded here, in stream order, because only its
// envelope names its task. When an iterator of src ends its generation,
// read waits until out holds fewer messages than the handlers'
// pace calls for and opens the next generation for the difference (see
// room): out has room for all of it, so every message passes straight
// into the queue, where the scanner keeps it alive (see waiting), as it
// does a reply while read fetches its large envelope. When the server
// ends an iterator (see reopen), read opens another one.
func (r *receiver) read(src *source, out chan<- *delivery) {
	if src.inbox != nil {
		r.readInbox(src, out)
		return
	}
	it := src.current()
	retry := reopenBackOff()
	failing := &r.failing[src.queue] // what Err reports while the server turns the reader away
	failed := false                  // the last Next failed
	for {
		var msg jetstream.Msg
		var err error = jetstream.ErrMsgIteratorClosed // none opened: another instance consumed
		if it != nil {
			msg, err = it.Next()
		}
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
			n, ok := r.room(src, out)
			if !ok {
				return
			}
			if it = r.reopen(src, n, failed, retry); it == nil {
				return
			}
			continue
		default:
			err = fmt.Errorf("agentkit: %s consumer of %s: %w", src.label(), r.id, err)
			failing.Store(&err)
			r.asyncError(err)
			failed = true
			continue
		}
		if msg.Headers().Get(headerPinID) != "" {
			src.repin.Store(true) // nats.go took it for a pin; receive terminates the message
		}
		d := src.deliveryOf(msg)
		if src.until > 0 && d.seq > src.until {
			// A catch-up's message past its end: the group delivers it.
			// The ack only moves this consumer on; it samples no acks.
			r.brokerErr(msg.Ack(), d, "ack")
			continue
		}
		if !r.forward(src, d, out) {
			return
		}
	}
}

// readInbox is read for a source a group feeds: it takes the messages the
// group routed to this agent (see Group), already in the waiting set,
// until the source is stopped, or drained and empty.
func (r *receiver) readInbox(src *source, out chan<- *delivery) {
	defer src.inbox.abandon() // what no reader takes now, shutdown hands back
	for {
		d, ok := src.inbox.next(r.quit)
		if !ok {
			return
		}
		if !r.forward(src, d, out) {
			return
		}
	}
}

// forward takes d, just read from src, on to a worker's queue out: it
// settles here what is not for a worker (see admitFanout, receive),
// decodes what must be decoded in stream order, and queues a task's
// message behind the running one of its task. It is false once the agent
// stops.
func (r *receiver) forward(src *source, d *delivery, out chan<- *delivery) bool {
	h := d.msg.Headers()
	if src.spec.class != "" && !r.admitFanout(d, h) {
		return true
	}
	if h.Get(wire.HeaderInReplyTo) != "" || !wire.Mirrored(h) && !r.handled.seen(d.seq) {
		// A reply, or a message whose sender mirrors no header: its
		// envelope is decoded here, in stream order, so a reply
		// without the header is matched here too and a task without
		// the header takes its lane below. A duplicate goes on to a
		// worker undecoded: handle acks it, and its large envelope
		// may be gone.
		src.waiting.add(d) // kept alive while a large envelope is fetched
		ok := r.receive(d)
		src.waiting.remove(d)
		if !ok {
			return true
		}
		d.task = d.env.TaskID // equal to the header, if any (receive checks)
	}
	if d.task != "" {
		src.waiting.remove(d) // a group's inbox put it there; the lane keeps it alive
		if !r.lanes.enter(d) {
			r.idleScan.poke()
			return true // queued behind the running message of its task
		}
	}
	src.waiting.add(d)
	select {
	case out <- d:
		return true
	case <-r.quit:
		// Stopping: give the message straight back for redelivery.
		r.giveBack(d)
		return false
	}
}

// watchCatchUp ends the catch-up src (see Group) once it is done: every
// message of the agent up to src.until is acked (so none waits for a
// redelivery) and nothing is left pending, or a message past until was
// acked. It then stops src and deletes its consumer, which only the group
// delivers for from then on. A catch-up cut short by shutdown continues
// when the agent next starts.
func (r *receiver) watchCatchUp(src *source, g *Group) {
	r.readers.Go(func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-src.done:
				return
			case <-t.C:
			}
			ctx, cancel := context.WithTimeout(context.Background(), r.opts.attemptTimeout)
			info, err := src.consumer().Info(ctx)
			cancel()
			if err != nil {
				r.asyncError(fmt.Errorf("agentkit: catch-up of %s at %s: %w", r.id, src.spec.priority, err))
				continue
			}
			if info.NumAckPending > 0 || info.AckFloor.Stream < src.until && info.NumPending > 0 {
				continue
			}
			src.stop(false)
			ctx, cancel = context.WithTimeout(context.Background(), r.opts.attemptTimeout)
			err = g.js.DeleteConsumer(ctx, g.scheme.Stream(), info.Name)
			cancel()
			if err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
				r.asyncError(fmt.Errorf("agentkit: delete %s's finished catch-up: %w", r.id, err))
				return
			}
			g.catchUpDone(info.Name)
			r.opts.logger.Info("catch-up done: the group delivers", "agent", r.id, "priority", src.spec.priority, "group", g.name)
			return
		}
	})
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
func (r *receiver) reopen(src *source, n int, failed bool, retry backoff.BackOff) jetstream.MessagesContext {
	for {
		if failed && !src.pause(retry.NextBackOff()) {
			return nil
		}
		if src.turns != nil && !src.turns.await(src.done) {
			return nil
		}
		if src.turns != nil && !src.hasOpened() && src.turns.reclaiming() {
			r.reclaim(src)
		}
		ctx, cancel := context.WithTimeout(context.Background(), r.opts.attemptTimeout)
		it, err := src.reopen(ctx, n)
		cancel()
		if errors.Is(err, errStandingBy) {
			failed = false
			continue
		}
		if err == nil {
			return it
		}
		err = fmt.Errorf("agentkit: consume %s for %s: %w", src.label(), r.id, err)
		r.failing[src.queue].Store(&err)
		r.asyncError(err)
		if r.nc.IsClosed() || r.nc.IsDraining() {
			return nil // nats.go never reopens a connection
		}
		failed = true
	}
}

// maxReclaim bounds the stream sequences reclaim NAKs per consumer: the
// latest ones delivered, where a crashed instance's in-flight messages
// are. Older pending ones return after their ack timeout.
const maxReclaim = 1 << 14

// nakBody is the body of a NAK without a delay.
var nakBody = []byte("-NAK")

// reclaim hands back the messages src's consumer delivered and has not
// had acked, with a NAK each, so they come first to this instance's first
// fetch instead of after their ack timeout. It runs before that fetch, in
// a turn taken from an elder whose connection was gone: this instance
// has read none of them, so they were the elder's. The NAKs name only
// stream sequences, between the consumer's ack floor and its last
// delivery (see subjects.AckReply): the server ignores those not pending.
func (r *receiver) reclaim(src *source) {
	ctx, cancel := context.WithTimeout(context.Background(), r.opts.attemptTimeout)
	defer cancel()
	info, err := src.consumer().Info(ctx)
	if err != nil {
		r.asyncError(fmt.Errorf("agentkit: reclaim the messages of %s for %s: %w", src.label(), r.id, err))
		return
	}
	if info.NumAckPending == 0 {
		return
	}
	from, to := info.AckFloor.Stream+1, info.Delivered.Stream
	if to < from {
		return
	}
	if to-from >= maxReclaim {
		from = to - maxReclaim + 1
	}
	// The server takes acks and pull requests in separate queues, so a
	// fetch sent after the NAKs may be served first, with later messages.
	// It answers an ack that has a reply subject once it processed it, in
	// the order they came: the last NAK asks for that answer.
	for seq := from; seq < to && err == nil; seq++ {
		err = r.nc.Publish(subjects.AckReply(info.Stream, info.Name, seq, info.Delivered.Consumer), nakBody)
	}
	if err == nil {
		_, err = r.nc.RequestWithContext(ctx, subjects.AckReply(info.Stream, info.Name, to, info.Delivered.Consumer), nakBody)
	}
	if err != nil {
		r.asyncError(fmt.Errorf("agentkit: reclaim the messages of %s for %s: %w", src.label(), r.id, err))
		return
	}
	r.opts.logger.Info("reclaimed the messages a gone instance held", "agent", r.id, "consumer", info.Name,
		"pending", info.NumAckPending, "first", from, "last", to)
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
func (r *receiver) admitFanout(d *delivery, h nats.Header) bool {
	sub, err := r.opts.scheme.Parse(d.msg.Subject())
	if err != nil {
		return true // receive terminates it as invalid
	}
	d.subject, d.priority = sub, wire.Priority(sub.Priority)
	d.policy = r.policies[d.priority]
	switch {
	case sub.Sender == r.id:
		r.settleAck(d, OutcomeOwn)
		return false
	case h.Get(wire.HeaderAction) != "" && !r.fanout[h.Get(wire.HeaderAction)]:
		r.settleAck(d, OutcomeIgnored)
		return false
	}
	return true
}

// room waits until out holds fewer messages than src's target (see
// source.target) and returns how many more it may take, or false once the
// agent stops.
func (r *receiver) room(src *source, out chan<- *delivery) (int, bool) {
	for {
		if n := src.target() - len(out); n > 0 {
			return n, true
		}
		select {
		case <-src.taken:
		case <-r.quit:
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
func (r *receiver) work(queues []chan *delivery, w *worker) {
	defer r.left(w)
	for {
		d, ok := r.next(queues)
		if !ok {
			return
		}
		d.src.took()
		if r.stopping.Load() {
			r.giveBack(d) // Stop: queued messages go back unhandled
			continue
		}
		if !r.handle(d, &w.slot) {
			return
		}
		// The task's next message, in stream order, runs on this worker.
		for d.task != "" {
			if d = r.lanes.leave(d); d == nil {
				break
			}
			if r.stopping.Load() {
				r.giveBack(d)
				continue
			}
			if !r.handle(d, &w.slot) {
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
func (r *receiver) left(w *worker) {
	w.gone.Store(true)
	select {
	case r.exits <- struct{}{}:
	default: // a wake-up is pending already; awaitWorkers looks at every worker
	}
}

// awaitWorkers waits for the workers to return. Once the handlers'
// contexts are cancelled (a.recv.cut: Stop, a Drain whose ctx ended, a closed
// connection), it waits at most the stop grace; then it abandons the
// handlers still running (see abandon) and waits only for the other
// workers, which are settling or handing messages back, within the
// timeouts of those calls. It returns how many handlers it abandoned;
// their workers return when the handlers do.
func (r *receiver) awaitWorkers() int {
	cut := r.cut
	var grace <-chan time.Time
	abandoned := 0
	for !r.idle() {
		select {
		case <-r.exits:
		case <-cut:
			cut = nil
			t := time.NewTimer(r.opts.stopGrace)
			defer t.Stop()
			grace = t.C
		case <-grace:
			grace = nil
			abandoned = r.abandon()
		}
	}
	return abandoned
}

// idle reports whether every worker has returned or waits only for an
// abandoned handler.
func (r *receiver) idle() bool {
	for i := range r.crew {
		w := &r.crew[i]
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
func (r *receiver) abandon() int {
	n := 0
	for i := range r.crew {
		d := r.crew[i].slot.Load()
		if d == nil || !d.abandon() {
			continue
		}
		err := fmt.Errorf("%w: %s handler of %s message %d still running %v after its context was cancelled",
			ErrHandlersAbandoned, d.env.Action, r.id, d.seq, r.opts.stopGrace)
		berr := r.brokerErr(d.msg.Nak(), d, "nak")
		r.stats.add(OutcomeNak)
		r.settled(d, SettleEvent{Outcome: OutcomeNak, Elapsed: time.Since(d.start), Err: err, BrokerErr: berr})
		n++
	}
	return n
}

// giveBack takes d, which no handler will run, off the waiting set and
// NAKs it for redelivery.
func (r *receiver) giveBack(d *delivery) {
	d.src.waiting.remove(d)
	r.handBack(d)
}

// handBack NAKs d, which no handler ran, for immediate redelivery: the
// agent is stopping.
func (r *receiver) handBack(d *delivery) {
	r.settled(d, SettleEvent{Outcome: OutcomeNak, BrokerErr: r.brokerErr(d.msg.Nak(), d, "nak")})
}

// next returns the highest-priority waiting delivery, blocking until one
// arrives; ok is false once the agent is shutting down and the queues are
// empty.
func (r *receiver) next(queues []chan *delivery) (*delivery, bool) {
	if d := poll(queues); d != nil {
		return d, true
	}
	if len(queues) == 2 {
		select {
		case d := <-queues[0]:
			return d, true
		case d := <-queues[1]:
			return d, true
		case <-r.quit:
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
		case <-r.quit:
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
func (r *receiver) receive(d *delivery) bool {
	if d.env != nil {
		return true
	}
	msg := d.msg
	data := msg.Data()
	if len(data) > r.opts.maxEnvelope {
		r.terminateInvalid(d, fmt.Sprintf("envelope of %d bytes exceeds the %d byte limit", len(data), r.opts.maxEnvelope))
		return false
	}
	var env *wire.Envelope
	var err error
	if msg.Headers().Get(headerPinID) != "" {
		// The server's header, on consumers that pin a client; the
		// agent's pin none, so the sender wrote it (see source.reopen).
		r.terminateInvalid(d, headerPinID+" is the server's header, and this consumer pins no client")
		return false
	}
	if ref := msg.Headers().Get(wire.HeaderEnvelopeRef); ref != "" {
		// The ref names an object, so a subject: checked before any request is built from it.
		if reason := checkRef(ref, msg.Headers().Get(wire.HeaderMsgID)); reason != "" {
			r.terminateInvalid(d, reason)
			return false
		}
		var reason string
		env, reason, err = r.claim(ref)
		if err != nil { // the store is unreachable: try again later
			err = fmt.Errorf("agentkit: fetch large envelope %s: %w", ref, err)
			r.asyncError(err)
			berr := r.brokerErr(msg.NakWithDelay(d.policy.retryDelay(d.delivery)), d, "nak")
			r.stats.add(OutcomeNak)
			r.settled(d, SettleEvent{Outcome: OutcomeNak, Err: err, BrokerErr: berr})
			return false
		}
		if reason != "" {
			r.terminateInvalid(d, reason)
			return false
		}
	} else if env, err = wire.Decode(data); err != nil {
		r.terminateInvalid(d, err.Error())
		return false
	}
	sub := d.subject // parsed already by a fan-out reader (admitFanout)
	if sub.Kind == "" {
		if sub, err = r.opts.scheme.Parse(msg.Subject()); err != nil {
			r.terminateInvalid(d, err.Error())
			return false
		}
	}
	if reason := r.checkRouting(env, sub); reason != "" {
		r.terminateInvalid(d, reason)
		return false
	}
	if d.task != "" && env.TaskID != d.task {
		r.terminateInvalid(d, fmt.Sprintf("task_id %q does not match the %s header %s", env.TaskID, wire.HeaderTaskID, bound.Quote(d.task)))
		return false
	}
	d.env, d.subject = env, sub
	if sub.Kind != subjects.KindDirect && env.SenderID == r.id {
		// Our own broadcast or topic message: not for us to handle.
		r.settleAck(d, OutcomeOwn)
		return false
	}
	if env.Expired(time.Now()) {
		r.settleAck(d, OutcomeExpired)
		if env.RequiresAck {
			r.reply(d, env.NewAck(r.id, wire.NewError(wire.CodeExpired, "ttl of %dms passed before handling", env.TTLMillis), 0))
		}
		return false
	}
	if sub.Kind == subjects.KindDirect && env.InReplyTo != "" && env.MessageType != wire.TypeRequest && env.MessageType != wire.TypeNotification {
		// Only a direct message answers: a broadcast or topic message that
		// names a request in in_reply_to is anybody's guess at its id.
		if w := r.send.takeWaiter(env); w != nil {
			r.settleAck(d, OutcomeReply)
			w.ch <- env // after counting, so the woken caller sees the count
			return false
		}
		if r.handler(env.Action) == nil {
			r.settleAck(d, OutcomeLateReply)
			return false
		}
	}
	return true
}

// headerPinID carries the pinned client's id on messages of a consumer
// with a pinned-client priority group.
const headerPinID = "Nats-Pin-Id"

// checkRouting returns why env may not arrive on sub, or "".
func (r *receiver) checkRouting(env *wire.Envelope, sub subjects.Subject) string {
	switch {
	case env.SenderID != sub.Sender:
		return fmt.Sprintf("sender_id %q does not match the subject's sender %q", env.SenderID, sub.Sender)
	case string(env.Priority) != sub.Priority:
		return fmt.Sprintf("priority %q does not match the subject's priority %q", env.Priority, sub.Priority)
	}
	switch sub.Kind {
	case subjects.KindDirect:
		if env.ReceiverID != r.id {
			return fmt.Sprintf("receiver_id %q is not this agent %q", env.ReceiverID, r.id)
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
// abandoned the handler (see receiver.abandon): the message is not settled
// here, and the worker must return.
func (r *receiver) handle(d *delivery, slot *atomic.Pointer[delivery]) bool {
	if r.handled.seen(d.seq) {
		// Before receive: a large envelope is not fetched again, and once
		// acked it is gone from the object store.
		d.src.waiting.remove(d)
		r.settleAck(d, OutcomeDuplicate)
		return true
	}
	ok := r.receive(d)
	d.src.waiting.remove(d)
	if !ok {
		return true
	}
	switch r.handled.begin(d) {
	case startRunning:
		r.stats.add(OutcomeDuplicate) // the run in progress settles it, and reports it to the hooks
		return true
	case startDone: // finished while d was being received
		r.settleAck(d, OutcomeDuplicate)
		return true
	}
	defer r.handled.end(d.seq)
	h := r.handler(d.env.Action)
	if d.subject.Kind != subjects.KindDirect && !r.fanout[d.env.Action] {
		// Broadcasts and topics reach every agent that listens: one not
		// meant for this agent's handlers is no failure of anyone's.
		r.settleAck(d, OutcomeIgnored)
		return true
	}
	if h == nil {
		r.settle(d, Reject(wire.CodeCapabilityMissing, fmt.Sprintf("agent %s has no handler for action %q", r.id, d.env.Action)), 0)
		return true
	}
	ctx, span := r.tracing.startHandle(withHandling(r.runCtx, d.env), d)
	ctx, cancel := context.WithCancelCause(ctx)
	d.start, d.cancel, d.span = time.Now(), cancel, span
	d.message = Message{Envelope: d.env, Subject: d.msg.Subject(), Delivery: d.delivery, StreamSeq: d.seq, send: r.send, msg: d.msg}
	slot.Store(d)
	r.idleScan.poke()
	if r.stopping.Load() {
		// Stop began while receive ran: the message goes back unstarted,
		// like those queued. Checked after the slot is published, so
		// shutdown, which sets stopping before it looks for handlers to
		// abandon, sees every handler that starts.
		slot.Store(nil)
		cancel(nil)
		endSpan(span, ErrClosed)
		r.handBack(d)
		return true
	}
	r.inFlight.Add(1)
	err := r.call(ctx, h, &d.message)
	r.inFlight.Add(-1)
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
	r.settle(d, err, elapsed)
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
func (r *receiver) scan(crew []worker, tick time.Duration, done <-chan struct{}) {
	t := time.NewTicker(tick)
	defer t.Stop()
	progress := func(d *delivery) { r.brokerErr(d.msg.InProgress(), d, "in progress") }
	for {
		select {
		case <-done:
			return
		case now := <-t.C:
			if !r.sleepWhileIdle(crew, done) {
				return
			}
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
			for _, s := range *r.sources.Load() {
				s.waiting.keepAlive(now, progress)
			}
			r.lanes.keepAlive(now, progress)
			r.handled.rotate(now)
		}
	}
}

// sleepWhileIdle stops the scanner's ticks while the agent holds no
// message (none waits, runs or is queued in a lane), until one arrives
// (see sleeper). Thousands of idle agents then cost no timer wake-ups.
// It is false once done closes.
func (r *receiver) sleepWhileIdle(crew []worker, done <-chan struct{}) bool {
	// Asleep first, then looked: a message made visible after the look
	// finds the flag set and wakes the scanner.
	r.idleScan.asleep.Store(true)
	defer r.idleScan.asleep.Store(false)
	if !r.holdsNothing(crew) {
		return true
	}
	select {
	case <-r.idleScan.wake:
		return true
	case <-done:
		return false
	}
}

// holdsNothing reports whether no message of the agent waits for a
// worker, runs or is queued in a task's lane.
func (r *receiver) holdsNothing(crew []worker) bool {
	for i := range crew {
		if crew[i].slot.Load() != nil {
			return false
		}
	}
	for _, s := range *r.sources.Load() {
		if !s.waiting.empty() {
			return false
		}
	}
	return r.lanes.empty()
}

// sleeper wakes the keep-alive scanner sleeping while its agent held no
// message: whatever makes a message the scanner's to keep alive (the
// waiting set, a lane, a worker's slot) pokes it after doing so.
type sleeper struct {
	asleep atomic.Bool
	wake   chan struct{}
}

// poke wakes the scanner if it sleeps; a nil sleeper does nothing.
func (s *sleeper) poke() {
	if s == nil || !s.asleep.Load() {
		return
	}
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// call runs h, turning a panic into an error.
func (r *receiver) call(ctx context.Context, h Handler, m *Message) (err error) {
	defer func() {
		if p := recover(); p != nil {
			r.stats.add(OutcomePanic)
			r.opts.logger.Error("handler panicked", "agent", r.id, "action", m.Action, "message_id", m.MessageID, "panic", p, "stack", string(debug.Stack()))
			err = &retryError{code: wire.CodeInternal, err: fmt.Errorf("%w: %v", ErrHandlerPanic, p)}
		}
	}()
	return h.Handle(ctx, m)
}
