package agentkit

import "github.com/agentmesh-io/agentmesh/agentkit/wire"

// waiter is a pending Request or SendAndWait, or, once its call has
// ended, the record of the answers that came for its message id. The
// record is what tells a call retried under the same id (WithMessageID)
// that the answer it waits for already went to an earlier call, so that
// it fails at once instead of waiting out its deadline.
type waiter struct {
	ch     chan *wire.Envelope       // capacity 1; nil in a record
	accept func(*wire.Envelope) bool // nil in a record
	// live is set while the call waits and no answer has been handed to
	// it: only a live waiter takes an answer, and takes one at most.
	live bool
	// answers are the kinds of the answers that came for the id, newest
	// last, at most maxAnswers, including those of earlier calls.
	answers []answerKind
}

// answerKind is what a waiter's accept looks at in an answer.
type answerKind struct {
	typ    wire.MessageType
	status string
}

const (
	// maxAnswers bounds the answers remembered for one message id: a
	// response and an ACK are the most a request legitimately gets.
	maxAnswers = 4
	// maxAnswered bounds the message ids whose answers are remembered
	// after their call ended, so that a peer sending answers to ids of
	// its choosing cannot grow the map without end. Past it, some are
	// forgotten: a call retried under a forgotten id waits for an answer
	// that already came, as if it had come before the agent started.
	maxAnswered = 4096
)

// note records that an answer of env's kind came for w's id.
func (w *waiter) note(env *wire.Envelope) {
	if len(w.answers) == maxAnswers {
		w.answers = append(w.answers[:0], w.answers[1:]...)
	}
	w.answers = append(w.answers, answerKind{env.MessageType, env.Status})
}

// addWaiter registers a waiter for the reply to message id, keeping what
// is known of answers that came for it before. It fails with
// [ErrDuplicateRequest] when another call waits on id: one answer comes,
// and it would go to one of them. It returns nil and no error once the
// agent has stopped (failWaiters ran).
func (s *sender) addWaiter(id string, accept func(*wire.Envelope) bool) (*waiter, error) {
	s.waitMu.Lock()
	defer s.waitMu.Unlock()
	if s.waiters == nil {
		return nil, nil
	}
	w := &waiter{ch: make(chan *wire.Envelope, 1), accept: accept, live: true}
	switch old := s.waiters[id]; {
	case old == nil:
		s.forgetAnswers()
	case old.live:
		return nil, ErrDuplicateRequest
	default:
		w.answers = old.answers
	}
	s.waiters[id] = w
	return w, nil
}

// removeWaiter ends w's call: the answers that came for id are kept for a
// retry, if there were any, in a record of their own, so that nothing
// keeps w's channel and what it may still hold.
func (s *sender) removeWaiter(id string, w *waiter) {
	s.waitMu.Lock()
	defer s.waitMu.Unlock()
	if s.waiters[id] != w {
		return // stopped, or a later call under the same id took over
	}
	w.live = false
	if len(w.answers) == 0 {
		delete(s.waiters, id)
	} else {
		s.waiters[id] = &waiter{answers: w.answers}
	}
}

// answeredBefore reports whether an answer w accepts came for id before w
// was added: it went to an earlier call, and no other will come. An
// answer handed to w itself (now in w.ch) is not one.
func (s *sender) answeredBefore(id string, w *waiter) bool {
	s.waitMu.Lock()
	defer s.waitMu.Unlock()
	if s.waiters[id] != w || !w.live {
		return false
	}
	// Whatever w has noted since it was added, it did not accept.
	for _, k := range w.answers {
		if w.accept(&wire.Envelope{MessageType: k.typ, Status: k.status}) {
			return true
		}
	}
	return false
}

// takeWaiter notes env as an answer to the message it names in
// in_reply_to, and returns the waiter of that message if one waits and
// accepts env.
func (s *sender) takeWaiter(env *wire.Envelope) *waiter {
	s.waitMu.Lock()
	defer s.waitMu.Unlock()
	if s.waiters == nil {
		return nil
	}
	w := s.waiters[env.InReplyTo]
	if w == nil {
		s.forgetAnswers()
		w = &waiter{}
		s.waiters[env.InReplyTo] = w
	}
	w.note(env)
	if !w.live || !w.accept(env) {
		return nil
	}
	w.live = false
	return w
}

// forgetAnswers makes room for one more record of answers once there are
// maxAnswered entries: it drops records of ended calls, in the map's
// (random) order, down to three quarters of that, so that it runs once
// per many answers.
func (s *sender) forgetAnswers() {
	if len(s.waiters) < maxAnswered {
		return
	}
	for id, w := range s.waiters {
		if len(s.waiters) <= maxAnswered*3/4 {
			return
		}
		if !w.live {
			delete(s.waiters, id)
		}
	}
}

// failWaiters wakes every waiting call with nil once the agent stops, and
// every later one at once.
func (s *sender) failWaiters() {
	s.waitMu.Lock()
	defer s.waitMu.Unlock()
	for _, w := range s.waiters {
		if w.live {
			close(w.ch)
		}
	}
	s.waiters = nil
}
