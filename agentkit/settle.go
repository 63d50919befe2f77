package agentkit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"

	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/internal/bound"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// classify maps a handler's error to an outcome.
func classify(err error) (kind outcome, code wire.ErrorCode, delay time.Duration) {
	if err == nil {
		return outcomeAck, "", 0
	}
	var rr *rerouteError
	if errors.As(err, &rr) {
		return outcomeReroute, "", 0
	}
	var re *retryError
	if errors.As(err, &re) {
		return outcomeRetry, re.code, re.delay
	}
	var e *wire.Error
	if errors.As(err, &e) && !e.Retryable {
		return outcomeTerm, e.Code, 0
	}
	if errors.As(err, &e) {
		return outcomeRetry, e.Code, e.RetryAfter()
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return outcomeRetry, wire.CodeTimeout, 0
	}
	return outcomeRetry, wire.CodeInternal, 0
}

// settle turns a handler's result into the broker action and the sender's
// reply. It is the one place implementing the outcome table:
//
//	nil                         Ack (DoubleAck if configured); ACK envelope if requires_ack
//	Busy / retryable / panic    NakWithDelay on the priority's backoff; on the last
//	                            attempt the sender also gets the error
//	Reject / non-retryable      TermWithReason; error (or NACK) envelope to the sender
//	Reroute(capability)         forward to a READY agent with it, then Ack; none: as Reject
//
// Acked, terminated and rerouted messages are remembered (see handledSet),
// so a redelivery after a lost ack is acked without running the handler.
func (a *Agent) settle(d *delivery, err error, elapsed time.Duration) {
	kind, code, delay := classify(err)
	env := d.env
	a.logOutcome(d, kind, err, elapsed)
	switch kind {
	case outcomeAck:
		a.handled.add(d.seq)
		var berr error
		if a.opts.doubleAck {
			ctx, cancel := context.WithTimeout(context.Background(), a.opts.attemptTimeout)
			berr = a.brokerErr(d.msg.DoubleAck(ctx), d, "double ack")
			cancel()
		} else {
			berr = a.brokerErr(d.msg.Ack(), d, "ack")
		}
		a.stats.add(OutcomeAck)
		a.settled(d, SettleEvent{Outcome: OutcomeAck, Elapsed: elapsed, BrokerErr: berr})
		a.release(d)
		if env.RequiresAck && a.answers(d) {
			a.reply(d, env.NewAck(a.id, nil, elapsed))
		}
		a.queueTask(env) // recorded later, off this worker
	case outcomeRetry:
		if a.stopping.Load() && errors.Is(err, context.Canceled) {
			berr := a.brokerErr(d.msg.Nak(), d, "nak") // cut short by Stop: not the handler's error
			a.stats.add(OutcomeNak)
			a.settled(d, SettleEvent{Outcome: OutcomeNak, Elapsed: elapsed, Err: err, BrokerErr: berr})
			return
		}
		attempt := d.attempt()
		if delay <= 0 {
			delay = d.policy.retryDelay(attempt)
		}
		berr := a.brokerErr(d.msg.NakWithDelay(delay), d, "nak")
		a.stats.add(OutcomeNak)
		a.settled(d, SettleEvent{Outcome: OutcomeNak, Elapsed: elapsed, Err: err, Code: code, BrokerErr: berr})
		if attempt >= uint64(d.src.policy.MaxDeliver) && a.answers(d) {
			e := wire.NewError(code, "giving up after %d attempts: %v", attempt, err)
			a.reply(d, a.failureReply(env, e, elapsed))
		}
	case outcomeReroute:
		var rr *rerouteError
		errors.As(err, &rr)
		if rerr := a.reroute(d, rr.capability); rerr != nil {
			// Nobody else can take it: the sender hears CAPABILITY_MISSING.
			a.settle(d, Reject(wire.CodeCapabilityMissing, rerr.Error()), elapsed)
			return
		}
		a.handled.add(d.seq)
		berr := a.brokerErr(d.msg.Ack(), d, "ack")
		a.stats.add(OutcomeReroute)
		a.settled(d, SettleEvent{Outcome: OutcomeReroute, Elapsed: elapsed, Err: err, BrokerErr: berr})
	case outcomeTerm:
		e := &wire.Error{Code: code, Message: err.Error(), Retryable: false}
		var ae *wire.Error
		if errors.As(err, &ae) {
			e = ae
		}
		if code == wire.CodeCapabilityMissing {
			a.stats.add(OutcomeCapabilityMissing)
		}
		if a.answers(d) {
			a.reply(d, a.failureReply(env, e, elapsed))
		}
		a.handled.add(d.seq)
		reason := bound.Clip(string(e.Code)+": "+e.Message, maxReasonBytes)
		berr := a.brokerErr(d.msg.TermWithReason(reason), d, "term")
		a.stats.add(OutcomeTerm)
		a.settled(d, SettleEvent{Outcome: OutcomeTerm, Elapsed: elapsed, Err: err, Code: code, Reason: reason, BrokerErr: berr})
	}
}

// answers reports whether the sender of d expects to hear about failures:
// a direct request, and a request or notification that asked for an ack.
// A notification asks for no reply, so without requires_ack its sender
// hears nothing, its failure included: an error envelope would reach a
// sender that waits for none.
func (a *Agent) answers(d *delivery) bool {
	switch d.env.MessageType {
	case wire.TypeRequest:
		return d.subject.Kind == subjects.KindDirect || d.env.RequiresAck
	case wire.TypeNotification:
		return d.env.RequiresAck
	}
	return false
}

// failureReply is the NACK ack envelope when the sender asked for an ack,
// else an error envelope.
func (a *Agent) failureReply(env *wire.Envelope, e *wire.Error, elapsed time.Duration) *wire.Envelope {
	if env.RequiresAck {
		return env.NewAck(a.id, e, elapsed)
	}
	return env.NewErrorReply(a.id, e)
}

// terminateInvalid terminates a message that is not a valid envelope for
// this agent. It never reaches a handler. The reason, which may quote what
// the sender wrote, is bounded, and so is the log volume a sender can
// cause (see invalidLog).
func (a *Agent) terminateInvalid(d *delivery, reason string) {
	reason = bound.Clip(reason, maxReasonBytes-len(invalidPrefix))
	a.invalidLog.record(a.opts.logger, "invalid message terminated", "agent", a.id, "subject", bound.Clip(d.msg.Subject(), 2*bound.MaxQuotedBytes), "reason", reason)
	berr := a.brokerErr(d.msg.TermWithReason(invalidPrefix+reason), d, "term")
	a.stats.add(OutcomeInvalid)
	a.settled(d, SettleEvent{Outcome: OutcomeInvalid, Reason: invalidPrefix + reason, BrokerErr: berr})
}

// invalidPrefix starts the TERM reason of every message terminated as not
// a valid envelope; the ack monitor attributes those to their sender.
const invalidPrefix = "INVALID: "

// settleAck acks d, which no handler ran, for outcome o.
func (a *Agent) settleAck(d *delivery, o Outcome) {
	berr := a.brokerErr(d.msg.Ack(), d, "ack")
	a.stats.add(o)
	a.settled(d, SettleEvent{Outcome: o, BrokerErr: berr})
}

// brokerErr reports the failure err of a broker call op on d to the error
// handler, and returns it, nil if it only says the message was settled
// already.
func (a *Agent) brokerErr(err error, d *delivery, op string) error {
	if err == nil || errors.Is(err, jetstream.ErrMsgAlreadyAckd) {
		return nil
	}
	err = fmt.Errorf("agentkit: %s of %s message %d: %w", op, a.id, d.seq, err)
	a.asyncError(err)
	return err
}

// errProcessingLimit is the cause of a handler ctx the scanner ends.
var errProcessingLimit = errors.New("agentkit: processing limit reached")

// reply publishes a reply to d from the settle path, reporting failures to
// the error handler.
func (a *Agent) reply(d *delivery, env *wire.Envelope) {
	ctx, cancel := a.settleContext(d)
	defer cancel()
	if err := a.send.sendReply(ctx, env); err != nil {
		a.asyncError(err)
	}
}

// settleContext is the context of what settling d publishes: bounded by
// the publish timeout, and in the trace of d's handle span, if it ran.
func (a *Agent) settleContext(d *delivery) (context.Context, context.CancelFunc) {
	ctx := context.Background()
	if d.span != nil {
		ctx = trace.ContextWithSpan(ctx, d.span)
	}
	return context.WithTimeout(ctx, a.opts.publishTimeout)
}

var outcomeNames = [...]string{outcomeAck: "ack", outcomeRetry: "nak", outcomeTerm: "term", outcomeReroute: "reroute"}

// logOutcome logs what happens to a handled message at debug level, with
// the payload only when WithPayloadLogging is on. It costs nothing when
// debug logging is off (the default logger discards everything).
func (a *Agent) logOutcome(d *delivery, kind outcome, err error, elapsed time.Duration) {
	if !a.opts.logger.Enabled(context.Background(), slog.LevelDebug) {
		return
	}
	attrs := []any{"agent", a.id, "message_id", d.env.MessageID, "correlation_id", d.env.Correlation, "action", d.env.Action,
		"sender", d.env.SenderID, "priority", d.env.Priority, "delivery", d.delivery, "outcome", outcomeNames[kind], "elapsed", elapsed}
	if err != nil {
		attrs = append(attrs, "err", err)
	}
	if a.opts.logPayloads {
		attrs = append(attrs, "payload", string(d.env.Payload))
	}
	a.opts.logger.Debug("message handled", attrs...)
}
