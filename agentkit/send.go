package agentkit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/subjects"
)

// Headers mirrored from the envelope so the ack monitor and operators can
// read them without decoding the body.
const (
	HeaderMsgID       = jetstream.MsgIDHeader // "Nats-Msg-Id" = message_id: broker deduplication
	HeaderType        = "Mesh-Type"
	HeaderAction      = "Mesh-Action"
	HeaderCorrelation = "Mesh-Correlation-Id"
	HeaderWorkflow    = "Mesh-Workflow-Id"
	HeaderInReplyTo   = "Mesh-In-Reply-To"
)

// SendOption sets envelope fields of an outgoing message. Values are
// checked when the envelope is validated, before anything is published.
type SendOption func(*Envelope)

// WithPriority sets the priority. Default: [PriorityNormal] (replies:
// the priority of the message answered).
func WithPriority(p Priority) SendOption { return func(e *Envelope) { e.Priority = p } }

// WithTTL sets ttl_ms: receivers drop the message, unhandled, once ttl has
// passed since its timestamp. Default: no expiry.
func WithTTL(ttl time.Duration) SendOption {
	return func(e *Envelope) { e.TTLMillis = ttl.Milliseconds() }
}

// WithCorrelationID sets correlation_id. Default: the message's own id.
func WithCorrelationID(id string) SendOption { return func(e *Envelope) { e.Correlation = id } }

// WithWorkflowID sets workflow_id.
func WithWorkflowID(id string) SendOption { return func(e *Envelope) { e.WorkflowID = id } }

// WithTaskID sets task_id.
func WithTaskID(id string) SendOption { return func(e *Envelope) { e.TaskID = id } }

// WithSessionID sets session_id.
func WithSessionID(id string) SendOption { return func(e *Envelope) { e.SessionID = id } }

// WithReceiverType sets receiver_type.
func WithReceiverType(t string) SendOption { return func(e *Envelope) { e.ReceiverType = t } }

// WithMessageID sets message_id instead of a new UUID, e.g. to resend a
// message idempotently: within the stream's duplicate window (2 minutes) a
// second publish with the same id is stored and delivered only once.
func WithMessageID(id string) SendOption { return func(e *Envelope) { e.MessageID = id } }

// WithMetadata sets one metadata entry.
func WithMetadata(key, value string) SendOption {
	return func(e *Envelope) {
		if e.Metadata == nil {
			e.Metadata = map[string]string{}
		}
		e.Metadata[key] = value
	}
}

// WithSessionContext sets the propagated session context (raw JSON).
func WithSessionContext(ctx json.RawMessage) SendOption { return func(e *Envelope) { e.Context = ctx } }

// WithMessageType sets the message type of a [Agent.Send] (default request); use
// TypeNotification for messages that expect no answer.
func WithMessageType(t MessageType) SendOption { return func(e *Envelope) { e.MessageType = t } }

// compose builds an outgoing envelope from this agent.
func (a *Agent) compose(t MessageType, action string, payload any, opts []SendOption) (*Envelope, error) {
	raw, err := encodePayload(payload)
	if err != nil {
		return nil, err
	}
	e := NewEnvelope(t, a.id, action)
	e.SenderType = a.opts.agentType
	e.Payload = raw
	for _, o := range opts {
		o(e)
	}
	if e.Correlation == "" {
		e.Correlation = e.MessageID
	}
	return e, nil
}

// Send sends a request (or, with [WithMessageType], another type) to
// agent to and returns once the stream has stored it. It does not wait for
// the receiver; see [Agent.Request] and [Agent.SendAndWait] for that.
func (a *Agent) Send(ctx context.Context, to, action string, payload any, opts ...SendOption) (*Envelope, error) {
	e, err := a.compose(TypeRequest, action, payload, opts)
	if err != nil {
		return nil, err
	}
	e.ReceiverID = to
	return e, a.SendEnvelope(ctx, e)
}

// Publish sends a notification on topic to every agent subscribed to it.
func (a *Agent) Publish(ctx context.Context, topic, action string, payload any, opts ...SendOption) (*Envelope, error) {
	e, err := a.compose(TypeNotification, action, payload, opts)
	if err != nil {
		return nil, err
	}
	e.Topic = topic
	return e, a.SendEnvelope(ctx, e)
}

// Broadcast sends a notification to every agent of the mesh (but this one).
func (a *Agent) Broadcast(ctx context.Context, action string, payload any, opts ...SendOption) (*Envelope, error) {
	e, err := a.compose(TypeNotification, action, payload, opts)
	if err != nil {
		return nil, err
	}
	return e, a.SendEnvelope(ctx, e)
}

// SendEnvelope publishes a complete envelope, which must name this agent as
// sender: to its receiver_id, else to its topic, else as a broadcast. It
// returns once the stream has stored it, retrying failed publishes with
// exponential backoff under the same message id, so a retry never
// duplicates. If ctx has no deadline, retries stop after the publish
// timeout ([WithPublishTimeout]).
func (a *Agent) SendEnvelope(ctx context.Context, e *Envelope) error {
	if e.SenderID != a.id {
		return fmt.Errorf("%w: sender_id %q is not this agent %q", ErrInvalidEnvelope, e.SenderID, a.id)
	}
	subject, err := a.subjectFor(e)
	if err != nil {
		return err
	}
	return a.publish(ctx, subject, e)
}

func (a *Agent) subjectFor(e *Envelope) (string, error) {
	s := a.opts.scheme
	var subject string
	var err error
	switch {
	case e.ReceiverID != "":
		subject, err = s.Direct(e.ReceiverID, string(e.Priority), e.SenderID)
	case e.Topic != "":
		subject, err = s.Topic(e.Topic, string(e.Priority), e.SenderID)
	default:
		subject, err = s.Broadcast(string(e.Priority), e.SenderID)
	}
	if errors.Is(err, subjects.ErrInvalidToken) {
		var te *subjects.InvalidTokenError
		if errors.As(err, &te) && te.Field == "priority" {
			return "", &ValidationError{Field: "priority", Reason: te.Error()}
		}
		return "", fmt.Errorf("%w: %w", ErrInvalidID, err)
	}
	return subject, err
}

func (a *Agent) sendReply(ctx context.Context, e *Envelope) error {
	if e.SenderType == "" {
		e.SenderType = a.opts.agentType
	}
	subject, err := a.subjectFor(e)
	if err != nil {
		return err
	}
	return a.publish(ctx, subject, e)
}

// message encodes e as the NATS message to publish on subject.
func (a *Agent) message(subject string, e *Envelope) (*nats.Msg, error) {
	data, err := e.Encode()
	if err != nil {
		return nil, err
	}
	if max := a.nc.MaxPayload(); max > 0 && int64(len(data)) > max {
		return nil, fmt.Errorf("%w: %d bytes, the server accepts %d", ErrPayloadTooLarge, len(data), max)
	}
	msg := &nats.Msg{Subject: subject, Data: data, Header: nats.Header{
		HeaderMsgID:  {e.MessageID},
		HeaderType:   {string(e.MessageType)},
		HeaderAction: {e.Action},
	}}
	if e.Correlation != "" {
		msg.Header[HeaderCorrelation] = []string{e.Correlation}
	}
	if e.WorkflowID != "" {
		msg.Header[HeaderWorkflow] = []string{e.WorkflowID}
	}
	if e.InReplyTo != "" {
		msg.Header[HeaderInReplyTo] = []string{e.InReplyTo}
	}
	return msg, nil
}

// publish encodes e and stores it on subject, retrying retryable failures.
func (a *Agent) publish(ctx context.Context, subject string, e *Envelope) error {
	msg, err := a.message(subject, e)
	if err != nil {
		return err
	}
	err = a.publishOnce(ctx, msg)
	if err != nil && retryablePublish(err) && ctx.Err() == nil {
		ctx, cancel := withDefaultTimeout(ctx, a.opts.publishTimeout)
		defer cancel()
		err = backoff.Retry(func() error {
			a.stats.publishRetries.Add(1)
			err := a.publishOnce(ctx, msg)
			if err != nil && !retryablePublish(err) {
				return backoff.Permanent(err)
			}
			return err
		}, backoff.WithContext(publishBackOff(), ctx))
	}
	if err != nil {
		return fmt.Errorf("%w: %s %s to %s: %w", ErrPublish, e.MessageType, e.MessageID, subject, err)
	}
	return nil
}

// publishBackOff is the retry schedule of failed publishes: exponential
// from 50ms to 2s, bounded by the caller's context.
func publishBackOff() backoff.BackOff {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval, b.MaxInterval, b.MaxElapsedTime = 50*time.Millisecond, 2*time.Second, 0
	return b
}

// NewRequest returns a request envelope from this agent to agent to,
// ready for [Agent.SendEnvelope] or [Agent.SendBatch].
func (a *Agent) NewRequest(to, action string, payload any, opts ...SendOption) (*Envelope, error) {
	e, err := a.compose(TypeRequest, action, payload, opts)
	if err != nil {
		return nil, err
	}
	e.ReceiverID = to
	return e, nil
}

// BatchError reports which envelopes of a [Agent.SendBatch] were not stored.
type BatchError struct {
	// Errs[i] is why envs[i] was not stored; nil when it was.
	Errs []error
}

func (e *BatchError) Error() string {
	n, first := 0, error(nil)
	for _, err := range e.Errs {
		if err != nil {
			if first == nil {
				first = err
			}
			n++
		}
	}
	return fmt.Sprintf("agentkit: %d of %d messages not stored; first: %v", n, len(e.Errs), first)
}

// Unwrap returns the individual failures, so errors.Is(err, ErrPublish) works.
func (e *BatchError) Unwrap() []error {
	var errs []error
	for _, err := range e.Errs {
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// SendBatch publishes envs, which must all name this agent as sender, in
// one pipelined burst and returns once the stream has stored every one of
// them. Every envelope is checked before anything is published. Failed
// publishes are retried with exponential backoff under their own message
// ids, so a retry never duplicates; what still fails when ctx (or the
// publish timeout) ends is reported per envelope in a [*BatchError].
// SendBatch is the bulk path: one goroutine can keep the stream busy
// without waiting for each ack in turn.
func (a *Agent) SendBatch(ctx context.Context, envs []*Envelope) error {
	msgs := make([]*nats.Msg, len(envs))
	for i, e := range envs {
		if e.SenderID != a.id {
			return fmt.Errorf("%w: batch item %d: sender_id %q is not this agent %q", ErrInvalidEnvelope, i, e.SenderID, a.id)
		}
		subject, err := a.subjectFor(e)
		if err == nil {
			msgs[i], err = a.message(subject, e)
		}
		if err != nil {
			return fmt.Errorf("agentkit: batch item %d: %w", i, err)
		}
	}
	ctx, cancel := withDefaultTimeout(ctx, a.opts.publishTimeout)
	defer cancel()
	errs := make([]error, len(envs))
	todo := make([]int, len(envs))
	for i := range todo {
		todo[i] = i
	}
	futures := make([]jetstream.PubAckFuture, len(envs))
	b := publishBackOff()
	for {
		for _, i := range todo {
			futures[i], errs[i] = a.js.PublishMsgAsync(msgs[i])
		}
		retry := todo[:0]
		for _, i := range todo {
			if errs[i] == nil {
				select {
				case <-futures[i].Ok():
				case errs[i] = <-futures[i].Err():
				case <-ctx.Done():
					errs[i] = ctx.Err()
				}
			}
			if errs[i] != nil && retryablePublish(errs[i]) && ctx.Err() == nil {
				retry = append(retry, i)
			}
		}
		if len(retry) == 0 {
			break
		}
		select {
		case <-time.After(b.NextBackOff()):
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break // errs keeps each message's last failure
		}
		a.stats.publishRetries.Add(uint64(len(retry)))
		todo = retry
	}
	failed := false
	for i, err := range errs {
		if err != nil {
			errs[i] = fmt.Errorf("%w: %s %s to %s: %w", ErrPublish, envs[i].MessageType, envs[i].MessageID, msgs[i].Subject, err)
			failed = true
		}
	}
	if failed {
		return &BatchError{Errs: errs}
	}
	return nil
}

// publishOnce makes one attempt. It publishes asynchronously and waits for
// the stream's ack: the jetstream context bounds the wait by the attempt
// timeout with one timer, and many concurrent senders share one reply
// subscription instead of a request each.
func (a *Agent) publishOnce(ctx context.Context, msg *nats.Msg) error {
	f, err := a.js.PublishMsgAsync(msg)
	if err != nil {
		return err
	}
	select {
	case <-f.Ok():
		return nil
	case err := <-f.Err():
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// retryablePublish reports whether a failed publish may succeed if repeated:
// timeouts, missing responders and a temporarily unavailable JetStream, but
// not a closed connection, an oversize message or a stream's refusal.
func retryablePublish(err error) bool {
	var apiErr *jetstream.APIError
	switch {
	case errors.As(err, &apiErr):
		return apiErr.Code == 503
	case errors.Is(err, nats.ErrConnectionClosed), errors.Is(err, nats.ErrMaxPayload),
		errors.Is(err, nats.ErrBadSubject), errors.Is(err, nats.ErrInvalidMsg):
		return false
	}
	return true
}

func withDefaultTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, d)
}

// waiter is a pending Request or SendAndWait.
type waiter struct {
	ch     chan *Envelope // capacity 1
	accept func(*Envelope) bool
}

func (a *Agent) addWaiter(id string, accept func(*Envelope) bool) *waiter {
	w := &waiter{ch: make(chan *Envelope, 1), accept: accept}
	a.waitMu.Lock()
	a.waiters[id] = w
	a.waitMu.Unlock()
	return w
}

func (a *Agent) removeWaiter(id string) {
	a.waitMu.Lock()
	delete(a.waiters, id)
	a.waitMu.Unlock()
}

// deliverReply hands env to the waiter of the message it answers, if any.
func (a *Agent) deliverReply(env *Envelope) bool {
	a.waitMu.Lock()
	w, ok := a.waiters[env.InReplyTo]
	if ok && w.accept(env) {
		delete(a.waiters, env.InReplyTo)
	} else {
		ok = false
	}
	a.waitMu.Unlock()
	if ok {
		w.ch <- env
	}
	return ok
}

// failWaiters wakes every waiter with nil once the agent stops.
func (a *Agent) failWaiters() {
	a.waitMu.Lock()
	defer a.waitMu.Unlock()
	for id, w := range a.waiters {
		close(w.ch)
		delete(a.waiters, id)
	}
}

// await sends e and waits for the reply accept admits.
func (a *Agent) await(ctx context.Context, e *Envelope, accept func(*Envelope) bool) (*Envelope, error) {
	if !a.started() {
		return nil, fmt.Errorf("%w: waiting for a reply needs a started agent", ErrNotStarted)
	}
	ctx, cancel := withDefaultTimeout(ctx, a.opts.requestTimeout)
	defer cancel()
	w := a.addWaiter(e.MessageID, accept)
	defer a.removeWaiter(e.MessageID)
	if err := a.SendEnvelope(ctx, e); err != nil {
		return nil, err
	}
	select {
	case r, ok := <-w.ch:
		if !ok {
			return nil, fmt.Errorf("%w: while waiting for a reply to %s", ErrClosed, e.MessageID)
		}
		return r, nil
	case <-ctx.Done():
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return nil, fmt.Errorf("%w: %s %s to %s: %w", ErrTimeout, e.Action, e.MessageID, e.ReceiverID, ctx.Err())
		}
		return nil, ctx.Err()
	}
}

// remoteError returns the error carried by a reply, marked remote.
func remoteError(r *Envelope) error {
	if r.Error == nil {
		return &Error{Code: CodeInternal, Message: "reply with status " + r.Status + " and no error", remote: true}
	}
	e := *r.Error
	e.remote = true
	return &e
}

// Request sends a request to agent to and waits for its response (matched
// by in_reply_to). An error reply is returned as an [*Error] (IsRemote is
// true) together with the reply envelope; no reply before ctx's deadline (or
// the request timeout, [WithRequestTimeout]) is [ErrTimeout]. A response
// arriving after that is acked, dropped and counted as [OutcomeLateReply].
// The agent must be started.
func (a *Agent) Request(ctx context.Context, to, action string, payload any, opts ...SendOption) (*Envelope, error) {
	e, err := a.compose(TypeRequest, action, payload, opts)
	if err != nil {
		return nil, err
	}
	e.ReceiverID = to
	r, err := a.await(ctx, e, func(r *Envelope) bool {
		return r.MessageType == TypeResponse || r.MessageType == TypeError || r.MessageType == TypeAck && r.Status == StatusNACK
	})
	if err != nil {
		return nil, err
	}
	if r.MessageType != TypeResponse {
		return r, remoteError(r)
	}
	return r, nil
}

// Ack is the receiver's acknowledgment of a message sent with
// [Agent.SendAndWait] (seed 000).
type Ack struct {
	// MessageID is the id of the acknowledged message.
	MessageID string
	// OK is true for ACK, false for NACK.
	OK bool
	// ProcessingTime is the time the receiver reported spending on the message.
	ProcessingTime time.Duration
	// Error is the NACK's code and reason; nil on ACK.
	Error *Error
	// Envelope is the ack (or error) envelope itself.
	Envelope *Envelope
}

// SendAndWait sends a request with requires_ack set and waits for the
// receiver's ack envelope: an [*Ack] with OK set, or, on NACK, the Ack and an
// [*Error] carrying the code and reason. Busy receivers do not NACK: the
// broker redelivers on the priority's backoff and the ACK comes when the
// message is finally handled, so ctx should allow for the retries. The
// agent must be started.
func (a *Agent) SendAndWait(ctx context.Context, to, action string, payload any, opts ...SendOption) (*Ack, error) {
	e, err := a.compose(TypeRequest, action, payload, opts)
	if err != nil {
		return nil, err
	}
	e.ReceiverID = to
	e.RequiresAck = true
	r, err := a.await(ctx, e, func(r *Envelope) bool { return r.MessageType == TypeAck || r.MessageType == TypeError })
	if err != nil {
		return nil, err
	}
	ack := &Ack{MessageID: e.MessageID, OK: r.MessageType == TypeAck && r.Status == StatusACK, Envelope: r}
	if ms, err := strconv.ParseInt(r.Metadata[metaProcessingTime], 10, 64); err == nil {
		ack.ProcessingTime = time.Duration(ms) * time.Millisecond
	}
	if !ack.OK {
		err := remoteError(r)
		errors.As(err, &ack.Error)
		return ack, err
	}
	return ack, nil
}
