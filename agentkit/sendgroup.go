package agentkit

import (
	"context"
	"errors"
	"slices"
	"sync"
)

// Concurrent Sends share fast batches (group commit). Up to sendSlots
// publishes of an agent are in flight at a time, each on its own; a Send
// that finds them all busy joins the line. When a publish finishes, its
// slot passes to the first in line, which publishes the whole line, itself
// included, as one fast batch (batchpub.go) and hands each member its
// outcome. So a few senders never wait for each other, while many
// (handlers sending from their workers) pay one stream ack per batch
// instead of one per message, which costs less CPU per message at the
// same rate or more. A closed loop of senders is bound by each Send's
// round trip, which the line does not lengthen: the wait in line replaces
// the wait for the stream behind everybody else's messages.
//
// Only the first attempt goes through the line; a member whose message
// the batch did not store retries on its own (sender.publish), under the
// same message id. A member whose ctx ends returns at once, in line or in
// a batch; only the leader sees its batch through, for its members. In
// line, its message was never published; in a batch, it may be stored,
// and its error says so. A fast batch stores nothing for a duplicate
// message id without saying so: Stats.PublishDuplicates does not count
// those.

// sendSlots is how many of an agent's publishes may be in flight before
// the next Send joins the line.
const sendSlots = 4

// errLead tells a Send in line that the slot is its own: it publishes
// the line.
var errLead = errors.New("agentkit: lead the send line")

// sendLine is an agent's send group.
type sendLine struct {
	mu    sync.Mutex
	busy  int          // slots in use
	queue []*lineEntry // waiting for a slot, oldest first
}

// lineEntry is one Send waiting in line.
type lineEntry struct {
	msg  outMsg
	done chan error // buffered: the publish's outcome, or errLead
	// leads is set, under the line's lock, when the entry leaves the line
	// to lead it (passSlot) rather than as a member of a batch (lead).
	leads bool
}

// publishFirst makes the first attempt to publish msg: on its own if a
// slot is free, else in line.
func (s *sender) publishFirst(ctx context.Context, msg outMsg) error {
	l := &s.line
	l.mu.Lock()
	if l.busy < sendSlots {
		l.busy++
		l.mu.Unlock()
		err := s.publishOnce(ctx, msg)
		s.passSlot()
		return err
	}
	e := &lineEntry{msg: msg, done: make(chan error, 1)}
	l.queue = append(l.queue, e)
	l.mu.Unlock()
	var err error
	select {
	case err = <-e.done:
	case <-ctx.Done():
		l.mu.Lock()
		i := slices.Index(l.queue, e)
		if i >= 0 {
			l.queue = slices.Delete(l.queue, i, i+1)
		}
		leads := e.leads
		l.mu.Unlock()
		if i >= 0 {
			return unsent(ctx.Err()) // never published
		}
		if !leads {
			// Taken into a batch, which goes on without its caller: the
			// message may be stored or not, as when a lone publish's ctx
			// ends before its ack.
			return ctx.Err()
		}
		err = <-e.done // given the slot: lead the line, whose members wait
	}
	if err == errLead {
		err = s.lead(e)
	}
	return err
}

// passSlot gives a finished publish's slot to the first in line, or frees
// it.
func (s *sender) passSlot() {
	l := &s.line
	l.mu.Lock()
	if len(l.queue) == 0 {
		l.busy--
		l.mu.Unlock()
		return
	}
	next := l.queue[0]
	l.queue = slices.Delete(l.queue, 0, 1)
	next.leads = true
	l.mu.Unlock()
	next.done <- errLead
}

// lead publishes e and the line behind it (up to maxFastBatch in all) in
// e's slot, hands every other member its outcome and returns e's.
func (s *sender) lead(e *lineEntry) error {
	l := &s.line
	l.mu.Lock()
	n := min(len(l.queue), maxFastBatch-1)
	group := append([]*lineEntry{e}, l.queue[:n]...)
	l.queue = slices.Delete(l.queue, 0, n)
	l.mu.Unlock()
	msgs := make([]outMsg, len(group))
	for i, m := range group {
		msgs[i] = m.msg
	}
	errs := make([]error, len(msgs))
	tried := make([]attempts, len(msgs))
	// The batch is everybody's: no one caller's ctx bounds it, the publish
	// attempt timeout does.
	ctx := context.Background()
	fast := s.publishFast(ctx, msgs, tried)
	s.publishEach(ctx, msgs, seq(fast, len(msgs)), errs)
	for i, err := range errs {
		tried[i].add(err)
		if err != nil && tried[i].unsure {
			// The fast batch may have stored it though this attempt did
			// not: its sender must not think it was not stored.
			errs[i] = &attemptError{err: err, outcome: pubUnknown}
		}
	}
	for i, m := range group[1:] {
		m.done <- errs[i+1]
	}
	s.passSlot()
	return errs[0]
}

// seq returns the integers from lo up to hi, not included.
func seq(lo, hi int) []int {
	s := make([]int, 0, max(hi-lo, 0))
	for i := lo; i < hi; i++ {
		s = append(s, i)
	}
	return s
}
