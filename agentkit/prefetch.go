package agentkit

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// source is one priority's consumer and the iterator reading it. With an
// adaptive policy (MaxPrefetch set) the iterator's buffer follows the
// handlers' pace: each iterator is one generation that ends after as many
// messages as its buffer holds (nats.go's StopAfter, which also sizes the
// pull requests so none is left at the server), and the next generation
// opens with the size the pace calls for (see prefetchFor). Ending a
// generation only once everything it asked for has arrived is what keeps a
// resize from stranding a message: unsubscribing with a pull request still
// open at the server could lose a message it was delivering into the
// client's closing subscription until its ack timeout. Stop and Drain act
// on the current iterator and keep a next generation from opening.
type source struct {
	cons    jetstream.Consumer
	policy  DeliveryPolicy
	workers int
	pace    pace
	size    atomic.Int64 // the current iterator's PullMaxMessages
	waiting waiting      // handed to the workers' queue, not yet picked up

	mu      sync.Mutex
	it      jetstream.MessagesContext
	stopped bool // Stop or Drain was called: no new iterator opens
}

func openSource(cons jetstream.Consumer, policy DeliveryPolicy, workers int) (*source, error) {
	s := &source{cons: cons, policy: policy, workers: workers, waiting: waiting{m: map[*delivery]struct{}{}}}
	it, err := s.open(policy.Prefetch)
	if err != nil {
		return nil, err
	}
	s.it = it
	return s, nil
}

func (s *source) open(size int) (jetstream.MessagesContext, error) {
	opts := []jetstream.PullMessagesOpt{jetstream.PullMaxMessages(size)}
	if s.policy.MaxPrefetch > 0 {
		opts = append(opts, jetstream.StopAfter(size))
	}
	it, err := s.cons.Messages(opts...)
	if err != nil {
		return nil, err
	}
	s.size.Store(int64(size))
	return it, nil
}

// current returns the iterator to read.
func (s *source) current() jetstream.MessagesContext {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.it
}

// prefetch returns the current buffer size.
func (s *source) prefetch() int { return int(s.size.Load()) }

// observe records that a handler took d.
func (s *source) observe(d time.Duration) { s.pace.observe(d) }

// reopen is called by the reader when the current iterator has closed. It
// returns the next generation's iterator, or nil when the source is done:
// stopped, not adaptive (the iterator only closes when the connection
// does), or the new iterator could not open (err says why).
func (s *source) reopen() (jetstream.MessagesContext, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped || s.policy.MaxPrefetch == 0 {
		return nil, nil
	}
	it, err := s.open(prefetchFor(s.policy, s.workers, s.pace.get()))
	if err != nil {
		return nil, err
	}
	s.it = it
	return it, nil
}

// stop discards the buffer (Stop) or lets it drain (Drain) and keeps a
// next generation from opening.
func (s *source) stop(drain bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopped = true
	if drain {
		s.it.Drain()
	} else {
		s.it.Stop()
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

// waiting holds the deliveries a reader has taken from its iterator and a
// worker has not picked up yet: the one the reader holds while the queue
// is full and those in the queue. The ack clock runs from the moment the
// server delivers, so behind handlers slower than the ack timeout these
// would time out and come back as redeliveries, burning attempts, unless
// the keep-alive scanner sends them InProgress as it does running ones.
type waiting struct {
	mu sync.Mutex
	m  map[*delivery]struct{}
}

func (w *waiting) add(d *delivery) {
	w.mu.Lock()
	d.lastProgress = time.Now()
	w.m[d] = struct{}{}
	w.mu.Unlock()
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
