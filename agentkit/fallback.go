package agentkit

import (
	"context"
	"fmt"
	"maps"
	"time"

	"github.com/google/uuid"

	"github.com/agentmesh-io/agentmesh/agentkit/registry"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
)

// NoFallbackError says no READY agent with Capability could take a message.
// It matches errors.Is(err, ErrNoFallback).
type NoFallbackError struct {
	Capability string
	Cause      error // what made a fallback necessary, e.g. a *CircuitOpenError
}

func (e *NoFallbackError) Error() string {
	if e.Cause != nil {
		return fmt.Sprintf("agentkit: no READY agent with capability %q to fall back to (%v)", e.Capability, e.Cause)
	}
	return fmt.Sprintf("agentkit: no READY agent with capability %q to fall back to", e.Capability)
}

// Is reports whether target is [ErrNoFallback].
func (e *NoFallbackError) Is(target error) bool { return target == ErrNoFallback }

// Unwrap returns the cause.
func (e *NoFallbackError) Unwrap() error { return e.Cause }

// Reroute returns an error telling the runtime this agent cannot handle the
// message but another agent with capability can: the message is forwarded
// to the least loaded READY agent with it (keeping its correlation, and
// replies going to the original sender) and acked here. With no such agent
// it is rejected with CAPABILITY_MISSING.
func Reroute(capability string) error { return &rerouteError{capability: capability} }

type rerouteError struct{ capability string }

func (e *rerouteError) Error() string { return "agentkit: reroute to capability " + e.capability }

// pickFallback returns the least loaded READY agent with capability, other
// than the excluded ones and those whose circuit is open.
func (a *Agent) pickFallback(ctx context.Context, capability string, exclude ...string) (string, error) {
	reg := a.Registry()
	if reg == nil {
		return "", &NoFallbackError{Capability: capability, Cause: fmt.Errorf("%w: registration is off", ErrNotStarted)}
	}
	recs, err := reg.Find(ctx, registry.Query{Capability: capability, Status: StatusReady})
	if err != nil {
		return "", err
	}
next:
	for _, r := range recs {
		for _, x := range exclude {
			if r.ID == x {
				continue next
			}
		}
		if r.Degraded || a.BreakerState(r.ID) == BreakerOpen {
			continue
		}
		return r.ID, nil
	}
	return "", &NoFallbackError{Capability: capability}
}

// fallBack redirects o, whose receiver cannot take it (cause), to a
// fallback agent when o allows one; otherwise it returns cause.
func (a *Agent) fallBack(ctx context.Context, o *outgoing, cause error) error {
	if o.fallback == "" {
		return cause
	}
	to, err := a.pickFallback(ctx, o.fallback, o.ReceiverID, a.id)
	if err != nil {
		if nf, ok := err.(*NoFallbackError); ok {
			nf.Cause = cause
		}
		return err
	}
	a.opts.logger.Info("falling back", "agent", a.id, "from", o.ReceiverID, "to", to, "capability", o.fallback, "message_id", o.MessageID, "reason", cause)
	o.Metadata = withHandoff(o.Metadata, o.ReceiverID, "circuit open")
	a.recordHandoff(o.Envelope, o.ReceiverID, to, "circuit open")
	o.ReceiverID, o.ReceiverType = to, ""
	a.stats.add(OutcomeFallback)
	return nil
}

func withHandoff(md map[string]string, from, reason string) map[string]string {
	md = maps.Clone(md)
	if md == nil {
		md = map[string]string{}
	}
	md[wire.MetaHandoffFrom], md[wire.MetaHandoffReason] = from, reason
	return md
}

// forward returns a copy of e passed on by self to agent to: a message id
// of self's own, the same conversation ids, timestamp and ttl, and the
// original sender and message id kept for the reply. The id is derived
// from self and e's id, so forwarding e again (a redelivery) repeats it
// and the stream keeps one forward.
func forward(e *wire.Envelope, self, selfType, to, reason string) *wire.Envelope {
	f := *e
	f.MessageID = forwardID(self, e.MessageID)
	f.SenderID, f.SenderType = self, selfType
	f.ReceiverID, f.ReceiverType, f.Topic = to, "", ""
	f.Metadata = withHandoff(e.Metadata, self, reason)
	if f.Metadata[wire.MetaOriginSender] == "" {
		f.Metadata[wire.MetaOriginSender], f.Metadata[wire.MetaOriginMessageID] = e.SenderID, e.MessageID
	}
	return &f
}

// forwardID is the message id of the forward by self of message id.
func forwardID(self, id string) string {
	return uuid.NewSHA1(uuid.NameSpaceURL, []byte("agentmesh:forward:"+self+":"+id)).String()
}

// reroute forwards env to another agent with capability. It returns nil
// once the forward is stored, or why it could not be.
func (a *Agent) reroute(ctx context.Context, env *wire.Envelope, capability string) error {
	to, err := a.pickFallback(ctx, capability, a.id)
	if err != nil {
		return err
	}
	f := forward(env, a.id, a.opts.agentType, to, "reroute")
	if err := a.send.sendReply(ctx, f); err != nil {
		return err
	}
	a.opts.logger.Info("message rerouted", "agent", a.id, "to", to, "capability", capability, "message_id", env.MessageID, "forward_id", f.MessageID)
	a.recordHandoff(env, a.id, to, "reroute")
	return nil
}

// healthMark is a mark senders keep in the registry about an agent.
type healthMark int

const (
	markDegraded    healthMark = iota // repeated NACKs
	markUnavailable                   // repeated timeouts
)

// markHealth sets the mark m about agent with reason, or clears it when
// reason is empty. A failure is reported through the async error handler.
func (a *Agent) markHealth(reg *registry.View, agent string, m healthMark, reason string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var err error
	switch {
	case m == markDegraded:
		err = reg.MarkDegraded(ctx, agent, a.id, reason, reason != "")
	case reason != "":
		a.opts.logger.Warn("agent marked unavailable", "agent", a.id, "to", agent, "reason", reason)
		err = reg.MarkUnavailable(ctx, agent, a.id, reason, a.opts.breaker.OpenTimeout)
	default:
		err = reg.ClearUnavailable(ctx, agent)
	}
	if err != nil {
		a.asyncError(err)
	}
}
