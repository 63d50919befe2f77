package agentkit

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/agentkit/wire"
)

// source is one priority's consumer and the iterator reading it. With an
// adaptive policy (MaxPrefetch set) what the client holds follows the
// handlers' pace: each iterator is one generation that ends after the
// messages it was opened for (nats.go's StopAfter, which also sizes the
// pull requests so none is left at the server), and the next generation
// opens once the workers' queue holds fewer messages than the pace calls
// for, for the difference (see target and receiver.room). Ending a generation
// only once everything it asked for has arrived is what keeps a resize
// from stranding a message: unsubscribing with a pull request still open
// at the server could lose a message it was delivering into the client's
// closing subscription until its ack timeout. The server ends iterators
// too, fixed ones included: when their consumer is deleted, or when it
// rejects their pull requests (see receiver.reopen). Stop and Drain act on
// the current iterator and keep a next one from opening.
type source struct {
	spec    queueSpec
	queue   int // the index of spec in queueOrder: its queue and failing slot
	cons    jetstream.Consumer
	bind    func(context.Context) (jetstream.Consumer, error) // a fresh handle on the same consumer
	repin   atomic.Bool                                       // a message carried Nats-Pin-Id: reopen on a fresh handle
	policy  DeliveryPolicy
	workers int
	pace    pace
	waiting waiting       // received, and no handler started yet
	taken   chan struct{} // a worker took a message of this source off the queue
	// inbox is set when a group reads the consumer (see Group): the
	// source then reads what the group routes to it, and cons is nil.
	inbox *inbox
	// until is set on a catch-up (see Group): the stream sequence after
	// which the group delivers.
	until uint64
	// turns is set when the agent's instances take turns: the source
	// fetches only while this instance consumes.
	turns *turns

	mu      sync.Mutex
	it      jetstream.MessagesContext
	opened  bool          // an iterator was opened: this instance has read the consumer
	stopped bool          // Stop or Drain was called: no new iterator opens
	done    chan struct{} // closed with stopped set: ends the reader's pause
}

// openSource returns the source reading cons. It opens no iterator while
// another instance consumes (see turns): the reader opens one when this
// instance's turn comes.
func openSource(cons jetstream.Consumer, bind func(context.Context) (jetstream.Consumer, error), spec queueSpec, queue int, policy DeliveryPolicy, workers int, turns *turns, scanner *sleeper) (*source, error) {
	s := &source{spec: spec, queue: queue, cons: cons, bind: bind, policy: policy, workers: workers, turns: turns,
		waiting: waiting{m: map[*delivery]struct{}{}, scanner: scanner}, taken: make(chan struct{}, 1), done: make(chan struct{})}
	if turns != nil && !turns.consuming() {
		return s, nil
	}
	it, err := s.open(policy.Prefetch)
	if err != nil {
		return s, err
	}
	s.it, s.opened = it, true
	return s, nil
}

// inboxSource returns the source of a priority whose messages a group
// routes to the agent.
func inboxSource(spec queueSpec, queue int, policy DeliveryPolicy, workers int, scanner *sleeper) *source {
	s := &source{spec: spec, queue: queue, policy: policy, workers: workers,
		waiting: waiting{m: map[*delivery]struct{}{}, scanner: scanner}, taken: make(chan struct{}, 1), done: make(chan struct{})}
	s.inbox = &inbox{src: s, wake: make(chan struct{}, 1)}
	return s
}

// deliveryOf returns the delivery of msg, read from s.
func (s *source) deliveryOf(msg jetstream.Msg) *delivery {
	d := &delivery{msg: msg, priority: s.spec.priority, policy: &s.policy, src: s, task: msg.Headers().Get(wire.HeaderTaskID), lastProgress: time.Now()}
	if md, err := msg.Metadata(); err == nil {
		d.delivery, d.seq = md.NumDelivered, md.Sequence.Stream
	}
	return d
}

// label names the source in errors: its priority, or its fan-out class.
func (s *source) label() string {
	if s.spec.class != "" {
		return s.spec.class + " fan-out"
	}
	return string(s.spec.priority)
}

func (s *source) open(size int) (jetstream.MessagesContext, error) {
	opts := []jetstream.PullMessagesOpt{jetstream.PullMaxMessages(size), jetstream.PullExpiry(s.policy.pullExpiry())}
	if s.policy.MaxPrefetch > 0 {
		opts = append(opts, jetstream.StopAfter(size))
	}
	return s.cons.Messages(opts...)
}

// hasOpened reports whether this instance ever read the source's consumer.
func (s *source) hasOpened() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.opened
}

// consumer returns the handle of the source's consumer.
func (s *source) consumer() jetstream.Consumer {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cons
}

// current returns the iterator to read.
func (s *source) current() jetstream.MessagesContext {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.it
}

// prefetch returns the buffer size the pace calls for (Prefetch until it
// is known, or always with a fixed policy).
func (s *source) prefetch() int { return prefetchFor(s.policy, s.workers, s.pace.get()) }

// target is how many messages the source should hold in the workers'
// queue: the buffer the handlers' pace calls for plus one per worker,
// which is what the workers finish within half the ack timeout.
func (s *source) target() int { return s.prefetch() + s.workers }

// took records that a worker picked a message off the queue, waking a
// reader waiting for room.
func (s *source) took() {
	select {
	case s.taken <- struct{}{}:
	default:
	}
}

// reopen is called by the reader when the current iterator has closed and
// the workers' queue has room for n more messages (see receiver.room). It
// returns the next iterator: an adaptive source's next generation, of n
// messages, or, after the server ended a fixed source's iterator, a new
// one of Prefetch; nil once the source is stopped. Opening does not reach
// the server: it fails only on a closed or draining connection (err says
// why).
//
// As the queue has room for the whole generation, the reader never waits
// for it while the iterator still buffers messages, so however the
// handlers' pace changes within a generation, no received message sits
// where InProgress cannot reach it.
//
// Once a message carried Nats-Pin-Id (repin), the iterator opens on a
// fresh handle of the consumer: nats.go keeps a pinned-client id on the
// handle, taken from that header of any message it delivers, and sends it
// with every later pull; a sender who forges the header on a consumer that
// pins no client would otherwise have every pull refused (400) for good.
func (s *source) reopen(ctx context.Context, n int) (jetstream.MessagesContext, error) {
	var cons jetstream.Consumer
	if s.repin.Swap(false) { // before the lock: Stop does not wait for the server
		var err error
		if cons, err = s.bind(ctx); err != nil {
			s.repin.Store(true) // the next try rebinds again
			return nil, err
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return nil, nil
	}
	if cons != nil {
		s.cons = cons
	}
	// Checked under mu, which standDown takes: an iterator opened just
	// before this instance's turn ended is one standDown drains.
	if s.turns != nil && !s.turns.consuming() {
		return nil, errStandingBy
	}
	if s.policy.MaxPrefetch == 0 {
		n = s.policy.Prefetch
	}
	it, err := s.open(n)
	if err != nil {
		return nil, err
	}
	s.it, s.opened = it, true
	return it, nil
}

// pause waits d before the reader reopens after a failure, and reports
// whether it did: Stop and Drain end it at once.
func (s *source) pause(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-s.done:
		return false
	}
}

// reopenBackOff is the schedule of a reader's pauses between failed
// iterators: doubling from 100ms to 5s, for as long as they fail.
func reopenBackOff() backoff.BackOff {
	return backoff.NewExponentialBackOff(backoff.WithInitialInterval(100*time.Millisecond),
		backoff.WithMultiplier(2), backoff.WithMaxInterval(5*time.Second), backoff.WithMaxElapsedTime(0))
}

// stop discards the buffer (Stop) or lets it drain (Drain), keeps a next
// iterator from opening and ends the reader's pause.
func (s *source) stop(drain bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.stopped {
		s.stopped = true
		close(s.done)
	}
	if s.inbox != nil {
		s.inbox.close(drain)
		return
	}
	switch {
	case s.it == nil: // never opened: another instance consumed
	case drain:
		s.it.Drain()
	default:
		s.it.Stop()
	}
}

// standDown ends fetching when another instance's turn begins: the
// iterator hands the reader what the client already holds, which this
// instance handles, and the reader opens no next one until its turn comes
// again (see receiver.reopen).
func (s *source) standDown() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.stopped && s.it != nil {
		s.it.Drain()
	}
}

// pace is a running estimate of how long a priority's handlers take. It
// rises fast (half-way to a slower sample) and falls slowly (an eighth of
// the way to a faster one), so a shift to slow handlers shrinks the buffer
// after a few messages while one fast message does not grow it.
type pace struct{ nanos atomic.Int64 }

func (p *pace) observe(d time.Duration) {
	sample := max(int64(d), 1)
	for {
		old := p.nanos.Load()
		next := sample
		switch {
		case old == 0:
		case sample > old:
			next = old + (sample-old)/2
		default:
			next = old - (old-sample)/8
		}
		if p.nanos.CompareAndSwap(old, max(next, 1)) {
			return
		}
	}
}

func (p *pace) get() time.Duration { return time.Duration(p.nanos.Load()) }

// prefetchFor returns the buffer size for handlers that take handling
// each: as many messages as workers can finish within half the ack timeout,
// less the queued ones already waiting in the runtime (one per worker),
// within [1, MaxPrefetch]. A message buffered beyond that would wait out
// its ack timeout before a handler reached it. With MaxPrefetch 0 (or an
// unknown pace) the size is fixed at Prefetch.
func prefetchFor(pol DeliveryPolicy, workers int, handling time.Duration) int {
	if pol.MaxPrefetch == 0 || handling <= 0 {
		return pol.Prefetch
	}
	fit := float64(workers)*float64(pol.BackOff[0]/2)/float64(handling) - float64(workers)
	return int(min(max(fit, 1), float64(pol.MaxPrefetch)))
}

// waiting holds the deliveries a reader has taken from its iterator whose
// handler has not started yet: those in the queue, the one the reader
// holds while the queue is full, a reply the reader is receiving, and
// those a worker is receiving (receive may fetch a large envelope from
// the object store). The ack clock runs from the moment the server
// delivers, so behind handlers slower than the ack timeout, or during a
// slow fetch, these would time out and come back as redeliveries, burning
// attempts, unless the keep-alive scanner sends them InProgress as it
// does running ones. Messages queued in a task's lane are not here: the
// lane keeps them alive.
type waiting struct {
	mu      sync.Mutex
	m       map[*delivery]struct{}
	scanner *sleeper // the agent's keep-alive scanner, poked on add
}

func (w *waiting) add(d *delivery) {
	w.mu.Lock()
	w.m[d] = struct{}{}
	w.mu.Unlock()
	w.scanner.poke()
}

func (w *waiting) empty() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.m) == 0
}

func (w *waiting) remove(d *delivery) {
	w.mu.Lock()
	delete(w.m, d)
	w.mu.Unlock()
}

// keepAlive sends InProgress (via progress) for waiting messages due one.
func (w *waiting) keepAlive(now time.Time, progress func(*delivery)) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for d := range w.m {
		keepAlive(now, d, progress)
	}
}

// drop returns every waiting message, emptying the set.
func (w *waiting) drop() []*delivery {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]*delivery, 0, len(w.m))
	for d := range w.m {
		out = append(out, d)
		delete(w.m, d)
	}
	return out
}

// inbox holds the messages a group routed to one source of an agent, in
// the order they came, until the agent's reader takes them. They are in
// the source's waiting set from the moment they arrive, so the agent's
// keep-alive scanner keeps them alive however long the workers are busy;
// the group consumer's ack-pending window bounds how many there are.
type inbox struct {
	src  *source
	wake chan struct{} // a message arrived, or the inbox closed

	mu       sync.Mutex
	q        []*delivery
	closed   bool      // no more messages are taken
	draining bool      // closed by Drain: the reader takes what is queued
	took     func(int) // tells the group how many messages left the inbox
}

// countWith has the inbox tell took how many messages leave it: taken by
// the reader, or left behind when it closes without draining.
func (b *inbox) countWith(took func(int)) {
	b.mu.Lock()
	b.took = took
	b.mu.Unlock()
}

// push queues msg for the agent; false once the inbox is closed (the
// group then holds msg).
func (b *inbox) push(msg jetstream.Msg) bool {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return false
	}
	d := b.src.deliveryOf(msg)
	b.src.waiting.add(d)
	b.q = append(b.q, d)
	b.mu.Unlock()
	select {
	case b.wake <- struct{}{}:
	default:
	}
	return true
}

// next returns the next message, blocking until one comes; false once the
// inbox is closed (and, when draining, empty) or quit is closed. What a
// stopped inbox still holds stays in the waiting set, which shutdown hands
// back.
func (b *inbox) next(quit <-chan struct{}) (*delivery, bool) {
	for {
		b.mu.Lock()
		if len(b.q) > 0 && (!b.closed || b.draining) {
			d := b.q[0]
			b.q[0] = nil
			b.q = b.q[1:]
			took := b.took
			b.mu.Unlock()
			if took != nil {
				took(1)
			}
			return d, true
		}
		closed := b.closed
		b.mu.Unlock()
		if closed {
			return nil, false
		}
		select {
		case <-b.wake:
		case <-quit:
			b.abandon()
			return nil, false
		}
	}
}

// abandon empties the inbox, counting what it held out of the group: the
// reader will not take it, and shutdown hands it back from the waiting
// set.
func (b *inbox) abandon() {
	b.mu.Lock()
	left, took := len(b.q), b.took
	b.q = nil
	b.mu.Unlock()
	if took != nil && left > 0 {
		took(left)
	}
}

// close stops taking messages; with drain the reader still takes those
// queued.
func (b *inbox) close(drain bool) {
	b.mu.Lock()
	b.closed, b.draining = true, drain
	b.mu.Unlock()
	if !drain {
		b.abandon()
	}
	select {
	case b.wake <- struct{}{}:
	default:
	}
}
