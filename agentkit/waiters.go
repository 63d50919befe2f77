package agentkit

import "github.com/agentmesh-io/agentmesh/agentkit/wire"

// waiter is a pending Request or SendAndWait.
type waiter struct {
	ch     chan *wire.Envelope // capacity 1
	accept func(*wire.Envelope) bool
}

// addWaiter registers a waiter for the reply to message id. It returns nil
// once the agent has stopped (failWaiters ran).
func (a *Agent) addWaiter(id string, accept func(*wire.Envelope) bool) *waiter {
	a.waitMu.Lock()
	defer a.waitMu.Unlock()
	if a.waiters == nil {
		return nil
	}
	w := &waiter{ch: make(chan *wire.Envelope, 1), accept: accept}
	a.waiters[id] = w
	return w
}

func (a *Agent) removeWaiter(id string) {
	a.waitMu.Lock()
	delete(a.waiters, id)
	a.waitMu.Unlock()
}

// takeWaiter removes and returns the waiter of the message env answers,
// if there is one and it accepts env.
func (a *Agent) takeWaiter(env *wire.Envelope) *waiter {
	a.waitMu.Lock()
	defer a.waitMu.Unlock()
	w, ok := a.waiters[env.InReplyTo]
	if !ok || !w.accept(env) {
		return nil
	}
	delete(a.waiters, env.InReplyTo)
	return w
}

// failWaiters wakes every waiter with nil once the agent stops, and every
// later one at once.
func (a *Agent) failWaiters() {
	a.waitMu.Lock()
	defer a.waitMu.Unlock()
	for _, w := range a.waiters {
		close(w.ch)
	}
	a.waiters = nil
}
