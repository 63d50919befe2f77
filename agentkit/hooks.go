package agentkit

import (
	"fmt"
	"time"

	"github.com/agentmesh-io/agentmesh/agentkit/wire"
)

// Hook is a value that watches an agent's runtime: it implements one or
// more of [NewAgentHook], [AgentStoppedHook], [SettleHook], [PublishHook],
// [RequestHook] and [BreakerHook], and is attached with [WithHooks].
//
// The runtime calls hooks synchronously, on the goroutine where the event
// happens (a handler worker, a sender, the circuit breaker's state change
// under its lock), so a hook must be cheap and must never block: count,
// observe, hand the event to a channel it never waits on. A hook that does
// I/O holds up message handling. Hooks are called concurrently and must be
// safe for that; one value may be attached to many agents. Events carry
// the agent's id, and envelopes the hook must not modify or keep beyond
// the call.
type Hook any

// NewAgentHook is called at the end of [New] with the new agent, before
// New returns it: to keep a handle on the agent (its [Agent.Stats], its
// consumers) until [AgentStoppedHook] says it stopped.
type NewAgentHook interface{ OnNewAgent(a *Agent) }

// AgentStoppedHook is called once the agent has stopped ([Agent.Stop],
// [Agent.Drain], a closed connection), also if it was never started.
type AgentStoppedHook interface{ OnAgentStopped(a *Agent) }

// SettleHook is called after the runtime told the broker what became of
// a received message: acked, NAKed for redelivery or terminated.
type SettleHook interface{ OnSettle(SettleEvent) }

// PublishHook is called after each envelope the agent publishes (sends,
// replies, forwards, batches) is stored by the stream or finally failed.
type PublishHook interface{ OnPublish(PublishEvent) }

// RequestHook is called when a [Agent.Request] or [Agent.SendAndWait]
// ends: answered, timed out, refused by the circuit breaker or failed to
// publish. The registry's health marks (degraded, UNAVAILABLE; see
// [BreakerSettings]) are kept by a request hook of the runtime's own,
// called before those of [WithHooks].
type RequestHook interface{ OnRequest(RequestEvent) }

// BreakerHook is called when the circuit breaker to a destination changes
// state. It runs under the breaker's lock: it must not send through the
// agent.
type BreakerHook interface{ OnBreakerChange(BreakerEvent) }

// SettleEvent is what happened to one received message.
type SettleEvent struct {
	// Agent is the receiving agent's id.
	Agent string
	// Outcome is the broker action and why: [OutcomeAck], [OutcomeNak],
	// [OutcomeTerm], [OutcomeReroute] (forwarded, then acked) for handled
	// messages; [OutcomeInvalid] (terminated), [OutcomeExpired],
	// [OutcomeOwn], [OutcomeReply], [OutcomeLateReply] and
	// [OutcomeDuplicate] (acked) for messages no handler saw. A message
	// handed back unhandled because the agent stops is an [OutcomeNak]
	// with no Err, which [Stats] does not count; one whose handler a stop
	// abandoned (see [WithStopGrace]) an [OutcomeNak] with an Err matching
	// [ErrHandlersAbandoned], reported when the message is handed back.
	Outcome Outcome
	// Envelope is the decoded message; nil when it was not a valid
	// envelope (OutcomeInvalid) or was not decoded (a duplicate).
	Envelope *wire.Envelope
	// Action is the envelope's action; empty when Envelope is nil.
	Action string
	// Priority is the priority of the consumer that delivered it.
	Priority wire.Priority
	// Delivery is the delivery attempt, 1 on the first.
	Delivery uint64
	// StreamSeq is the message's sequence in the stream.
	StreamSeq uint64
	// Elapsed is how long the handler ran; 0 when none did.
	Elapsed time.Duration
	// Err is the handler's error (a recovered panic matches
	// [ErrHandlerPanic]), or why a message no handler saw was NAKed.
	Err error
	// Code is the error code the handler's error maps to, on a NAK or
	// TERM it caused; empty otherwise.
	Code wire.ErrorCode
	// Reason is the reason a TERM gave the broker (starting "INVALID: "
	// for OutcomeInvalid); empty otherwise.
	Reason string
	// BrokerErr is the broker call's failure, if it failed (the error
	// handler hears it too).
	BrokerErr error
}

// PublishEvent is the outcome of publishing one envelope.
type PublishEvent struct {
	// Agent is the sending agent's id.
	Agent string
	// Envelope is the envelope published.
	Envelope *wire.Envelope
	// Err is nil when the stream stored the envelope, else the failure
	// the caller got (after retries).
	Err error
	// Batch says [Agent.SendBatch] published it; Fast, that a fast batch
	// publish stored it (one stream ack for the batch).
	Batch, Fast bool
}

// RequestEvent is the end of one [Agent.Request] or [Agent.SendAndWait].
type RequestEvent struct {
	// Agent is the requesting agent's id.
	Agent string
	// To is the destination: after a fallback, the agent it fell back to.
	To string
	// Request is the request envelope.
	Request *wire.Envelope
	// Reply is the reply, nil when none came.
	Reply *wire.Envelope
	// Elapsed is the time from sending to the reply; 0 when none came.
	Elapsed time.Duration
	// Err is what the caller got: nil, an error reply ([wire.IsRemote]),
	// [ErrTimeout], [ErrCircuitOpen], a failed publish...
	Err error
	// Refused says the circuit breaker refused the request and no
	// fallback took it: nothing was sent.
	Refused bool
}

// BreakerEvent is a change of the circuit breaker to one destination.
type BreakerEvent struct {
	// Agent is the sending agent's id, To the destination.
	Agent, To string
	// State is the circuit's new state.
	State BreakerState
}

// WithHooks attaches hooks to the agent (see [Hook]); each must implement
// at least one hook interface. Several WithHooks options add up, and each
// kind of hook is called in the order attached. Default: none.
func WithHooks(hooks ...Hook) Option {
	return optionFunc(func(o *options) error {
		for _, h := range hooks {
			if !o.hooks.add(h) {
				return fmt.Errorf("%w: hook %T implements no hook interface", ErrInvalidOption, h)
			}
		}
		return nil
	})
}

// hooks are the attached hooks by kind.
type hooks struct {
	newAgent []NewAgentHook
	stopped  []AgentStoppedHook
	settle   []SettleHook
	publish  []PublishHook
	request  []RequestHook
	breaker  []BreakerHook
}

// add files h under every kind it implements and reports whether there
// was one.
func (hs *hooks) add(h Hook) bool {
	n := 0
	if x, ok := h.(NewAgentHook); ok {
		hs.newAgent, n = append(hs.newAgent, x), n+1
	}
	if x, ok := h.(AgentStoppedHook); ok {
		hs.stopped, n = append(hs.stopped, x), n+1
	}
	if x, ok := h.(SettleHook); ok {
		hs.settle, n = append(hs.settle, x), n+1
	}
	if x, ok := h.(PublishHook); ok {
		hs.publish, n = append(hs.publish, x), n+1
	}
	if x, ok := h.(RequestHook); ok {
		hs.request, n = append(hs.request, x), n+1
	}
	if x, ok := h.(BreakerHook); ok {
		hs.breaker, n = append(hs.breaker, x), n+1
	}
	return n > 0
}

// settled reports d's settling to the settle hooks; ev carries the
// outcome and its details, the rest comes from d.
func (r *receiver) settled(d *delivery, ev SettleEvent) {
	if len(r.opts.hooks.settle) == 0 {
		return
	}
	ev.Agent, ev.Envelope, ev.Priority, ev.Delivery, ev.StreamSeq = r.id, d.env, d.priority, d.delivery, d.seq
	if d.env != nil {
		ev.Action = d.env.Action
	}
	for _, h := range r.opts.hooks.settle {
		h.OnSettle(ev)
	}
}

// published reports one envelope's publish to the publish hooks.
func (s *sender) published(e *wire.Envelope, err error, batch, fast bool) {
	for _, h := range s.opts.hooks.publish {
		h.OnPublish(PublishEvent{Agent: s.id, Envelope: e, Err: err, Batch: batch, Fast: fast})
	}
}

// requested reports the end of a request to the request hooks.
func (a *Agent) requested(ev RequestEvent) {
	ev.Agent = a.id
	for _, h := range a.opts.hooks.request {
		h.OnRequest(ev)
	}
}
