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
//	Busy / retryable / panic    NAK, redelivered after the delay asked for, else on
//	                            the priority's backoff; on the last attempt the
//	                            sender also gets the error
//	Reject / non-retryable      TermWithReason; error (or NACK) envelope to the sender
//	Reroute(capability)         forward to a READY agent with it, then Ack; none: as Reject
//
// Acked, terminated and rerouted messages are remembered (see handledSet),
// so a redelivery after a lost ack is acked without running the handler.
func (r *receiver) settle(d *delivery, err error, elapsed time.Duration) {
	kind, code, delay := classify(err)
	env := d.env
	r.logOutcome(d, kind, err, elapsed)
	switch kind {
	case outcomeAck:
		r.handled.add(d.seq)
		var berr error
		if r.opts.doubleAck {
			ctx, cancel := context.WithTimeout(context.Background(), r.opts.attemptTimeout)
			berr = r.brokerErr(d.msg.DoubleAck(ctx), d, "double ack")
			cancel()
		} else {
			berr = r.brokerErr(d.msg.Ack(), d, "ack")
		}
		r.stats.add(OutcomeAck)
		r.settled(d, SettleEvent{Outcome: OutcomeAck, Elapsed: elapsed, BrokerErr: berr})
		r.release(d)
		if env.RequiresAck && r.answers(d) {
			r.reply(d, env.NewAck(r.id, nil, elapsed))
		}
		r.host.queueTask(env) // recorded later, off this worker
	case outcomeRetry:
		if r.stopping.Load() && errors.Is(err, context.Canceled) {
			berr := r.brokerErr(d.msg.Nak(), d, "nak") // cut short by Stop: not the handler's error
			r.stats.add(OutcomeNak)
			r.settled(d, SettleEvent{Outcome: OutcomeNak, Elapsed: elapsed, Err: err, BrokerErr: berr})
			return
		}
		attempt := d.attempt()
		berr := r.brokerErr(r.nak(d, delay, attempt), d, "nak")
		r.stats.add(OutcomeNak)
		r.settled(d, SettleEvent{Outcome: OutcomeNak, Elapsed: elapsed, Err: err, Code: code, BrokerErr: berr})
		if attempt >= uint64(d.src.policy.MaxDeliver) && r.answers(d) {
			e := wire.NewError(code, "giving up after %d attempts: %v", attempt, err)
			r.reply(d, r.failureReply(env, e, elapsed))
		}
	case outcomeReroute:
		var rr *rerouteError
		errors.As(err, &rr)
		if rerr := r.reroute(d, rr.capability); rerr != nil {
			// Nobody else can take it: the sender hears CAPABILITY_MISSING.
			r.settle(d, Reject(wire.CodeCapabilityMissing, rerr.Error()), elapsed)
			return
		}
		r.handled.add(d.seq)
		berr := r.brokerErr(d.msg.Ack(), d, "ack")
		r.stats.add(OutcomeReroute)
		r.settled(d, SettleEvent{Outcome: OutcomeReroute, Elapsed: elapsed, Err: err, BrokerErr: berr})
	case outcomeTerm:
		e := &wire.Error{Code: code, Message: err.Error(), Retryable: false}
		var ae *wire.Error
		if errors.As(err, &ae) {
			e = ae
		}
		if code == wire.CodeCapabilityMissing {
			r.stats.add(OutcomeCapabilityMissing)
		}
		if r.answers(d) {
			r.reply(d, r.failureReply(env, e, elapsed))
		}
		r.handled.add(d.seq)
		reason := bound.Clip(string(e.Code)+": "+e.Message, maxReasonBytes)
		berr := r.brokerErr(d.msg.TermWithReason(reason), d, "term")
		r.stats.add(OutcomeTerm)
		r.settled(d, SettleEvent{Outcome: OutcomeTerm, Elapsed: elapsed, Err: err, Code: code, Reason: reason, BrokerErr: berr})
	}
}

// nak NAKs d's message after its attempt-th delivery failed. Without a
// delay of the handler's (Busy, Retry, an error's retry_after_ms), the
// NAK's delay is the priority's backoff for the attempt. With one, the
// message comes back after that delay, on every attempt: the server
// times a NAK's delay from the attempt's ack timeout, redelivering once
// the consumer's BackOff entry for the attempt has passed since now −
// AckWait + delay. From the second attempt on, that entry exceeds
// AckWait (BackOff[0]), and NakWithDelay(wait) would wait the difference
// as well; nak takes it off, with a negative delay when the difference
// exceeds the wait, which nats.go's NakWithDelay turns into a plain NAK
// (immediate redelivery), so that NAK is published as the server reads
// it.
func (r *receiver) nak(d *delivery, wait time.Duration, attempt uint64) error {
	if wait <= 0 {
		return d.msg.NakWithDelay(d.policy.retryDelay(attempt))
	}
	cons := &d.src.policy // the consumer's schedule, which the server applies
	delay := wait - (cons.retryDelay(attempt) - cons.BackOff[0])
	if delay > 0 {
		return d.msg.NakWithDelay(delay)
	}
	return r.nc.Publish(d.msg.Reply(), fmt.Appendf(nil, "-NAK {\"delay\": %d}", delay.Nanoseconds()))
}

// reroute forwards d's message to an agent with capability (see
// Agent.reroute), within the time and in the trace of d's settling.
func (r *receiver) reroute(d *delivery, capability string) error {
	ctx, cancel := r.settleContext(d)
	defer cancel()
	return r.host.reroute(ctx, d.env, capability)
}

// answers reports whether the sender of d expects to hear about failures:
// a direct request, and a request or notification that asked for an ack.
// A notification asks for no reply, so without requires_ack its sender
// hears nothing, its failure included: an error envelope would reach a
// sender that waits for none.
func (r *receiver) answers(d *delivery) bool {
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
func (r *receiver) failureReply(env *wire.Envelope, e *wire.Error, elapsed time.Duration) *wire.Envelope {
	if env.RequiresAck {
		return env.NewAck(r.id, e, elapsed)
	}
	return env.NewErrorReply(r.id, e)
}

// terminateInvalid terminates a message that is not a valid envelope for
// this agent. It never reaches a handler. The reason, which may quote what
// the sender wrote, is bounded, and so is the log volume a sender can
// cause (see invalidLog).
func (r *receiver) terminateInvalid(d *delivery, reason string) {
	reason = bound.Clip(reason, maxReasonBytes-len(invalidPrefix))
	r.invalidLog.record(r.opts.logger, "invalid message terminated", "agent", r.id, "subject", bound.Clip(d.msg.Subject(), 2*bound.MaxQuotedBytes), "reason", reason)
	berr := r.brokerErr(d.msg.TermWithReason(invalidPrefix+reason), d, "term")
	r.stats.add(OutcomeInvalid)
	r.settled(d, SettleEvent{Outcome: OutcomeInvalid, Reason: invalidPrefix + reason, BrokerErr: berr})
}

// invalidPrefix starts the TERM reason of every message terminated as not
// a valid envelope; the ack monitor attributes those to their sender.
const invalidPrefix = "INVALID: "

// settleAck acks d, which no handler ran, for outcome o.
func (r *receiver) settleAck(d *delivery, o Outcome) {
	berr := r.brokerErr(d.msg.Ack(), d, "ack")
	r.stats.add(o)
	r.settled(d, SettleEvent{Outcome: o, BrokerErr: berr})
}

// brokerErr reports the failure err of a broker call op on d to the error
// handler, and returns it, nil if it only says the message was settled
// already.
func (r *receiver) brokerErr(err error, d *delivery, op string) error {
	if err == nil || errors.Is(err, jetstream.ErrMsgAlreadyAckd) {
		return nil
	}
	err = fmt.Errorf("agentkit: %s of %s message %d: %w", op, r.id, d.seq, err)
	r.asyncError(err)
	return err
}

// errProcessingLimit is the cause of a handler ctx the scanner ends.
var errProcessingLimit = errors.New("agentkit: processing limit reached")

// reply publishes a reply to d from the settle path, reporting failures to
// the error handler.
func (r *receiver) reply(d *delivery, env *wire.Envelope) {
	ctx, cancel := r.settleContext(d)
	defer cancel()
	if err := r.send.sendReply(ctx, env); err != nil {
		r.asyncError(err)
	}
}

// settleContext is the context of what settling d publishes: bounded by
// the publish timeout, and in the trace of d's handle span, if it ran.
func (r *receiver) settleContext(d *delivery) (context.Context, context.CancelFunc) {
	ctx := context.Background()
	if d.span != nil {
		ctx = trace.ContextWithSpan(ctx, d.span)
	}
	return context.WithTimeout(ctx, r.opts.publishTimeout)
}

var outcomeNames = [...]string{outcomeAck: "ack", outcomeRetry: "nak", outcomeTerm: "term", outcomeReroute: "reroute"}

// logOutcome logs what happens to a handled message at debug level, with
// the payload only when WithPayloadLogging is on. It costs nothing when
// debug logging is off (the default logger discards everything).
func (r *receiver) logOutcome(d *delivery, kind outcome, err error, elapsed time.Duration) {
	if !r.opts.logger.Enabled(context.Background(), slog.LevelDebug) {
		return
	}
	attrs := []any{"agent", r.id, "message_id", d.env.MessageID, "correlation_id", d.env.Correlation, "action", d.env.Action,
		"sender", d.env.SenderID, "priority", d.env.Priority, "delivery", d.delivery, "outcome", outcomeNames[kind], "elapsed", elapsed}
	if err != nil {
		attrs = append(attrs, "err", err)
	}
	if r.opts.logPayloads {
		attrs = append(attrs, "payload", string(d.env.Payload))
	}
	r.opts.logger.Debug("message handled", attrs...)
}
