package agentkit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/agentmesh-io/agentmesh/agentkit/permission"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// SendOption sets envelope fields of an outgoing message, or how it is
// sent. Values are checked when the envelope is validated, before anything
// is published.
type SendOption func(*outgoing)

// outgoing is a message being composed: the envelope and how to send it.
type outgoing struct {
	*wire.Envelope
	fallback string // capability to route by when the receiver's circuit is open
	// idGiven is set when the caller chose the message id
	// ([WithMessageID]): the stream may hold the message already.
	idGiven bool
}

// WithFallback lets a send to an agent whose circuit is open go instead to
// another READY agent with capability (least loaded first). The message
// keeps its correlation, and its metadata records the handoff
// ("handoff_from"). With no such agent the send fails with ErrNoFallback.
func WithFallback(capability string) SendOption { return func(o *outgoing) { o.fallback = capability } }

// WithPriority sets the priority. Default: [wire.PriorityNormal] (replies:
// the priority of the message answered).
func WithPriority(p wire.Priority) SendOption { return func(e *outgoing) { e.Priority = p } }

// WithTTL sets ttl_ms: receivers drop the message, unhandled, once ttl has
// passed since its timestamp. ttl is rounded away from zero to whole
// milliseconds, so it never becomes 0, which means no expiry; a negative
// one fails validation. Default: no expiry.
func WithTTL(ttl time.Duration) SendOption {
	ms := ttl.Milliseconds()
	switch {
	case ttl%time.Millisecond == 0:
	case ttl > 0:
		ms++
	default:
		ms--
	}
	return func(e *outgoing) { e.TTLMillis = ms }
}

// WithCorrelationID sets correlation_id. Default: the message's own id.
func WithCorrelationID(id string) SendOption { return func(e *outgoing) { e.Correlation = id } }

// WithWorkflowID sets workflow_id.
func WithWorkflowID(id string) SendOption { return func(e *outgoing) { e.WorkflowID = id } }

// WithTaskID sets task_id.
func WithTaskID(id string) SendOption { return func(e *outgoing) { e.TaskID = id } }

// WithSessionID sets session_id.
func WithSessionID(id string) SendOption { return func(e *outgoing) { e.SessionID = id } }

// WithReceiverType sets receiver_type.
func WithReceiverType(t string) SendOption { return func(e *outgoing) { e.ReceiverType = t } }

// WithMessageID sets message_id instead of a new UUID, e.g. to resend a
// message idempotently: within the stream's duplicate window (2 minutes) a
// second publish with the same id is stored and delivered only once. A
// [Agent.Request] or [Agent.SendAndWait] retried under the id of one whose
// publish was unconfirmed, or that timed out, receives the answer to the
// stored message if it is still to come, and fails at once with
// [ErrDuplicateRequest] if it already came to the earlier call.
func WithMessageID(id string) SendOption { return func(e *outgoing) { e.MessageID = id } }

// WithMetadata sets one metadata entry.
func WithMetadata(key, value string) SendOption {
	return func(e *outgoing) {
		if e.Metadata == nil {
			e.Metadata = map[string]string{}
		}
		e.Metadata[key] = value
	}
}

// WithSessionContext sets the propagated session context (raw JSON).
func WithSessionContext(ctx json.RawMessage) SendOption { return func(e *outgoing) { e.Context = ctx } }

// WithMessageType sets the message type of a [Agent.Send] (default request); use
// TypeNotification for messages that expect no answer.
func WithMessageType(t wire.MessageType) SendOption { return func(e *outgoing) { e.MessageType = t } }

// sender is the agent's send side. It owns what publishing needs: the
// circuit breaker of each destination, the fast batches and the send line
// that concurrent sends share, and the calls waiting for replies, with the
// answers that came for their message ids (what tells a retried request
// its answer went to an earlier call). It reads the agent's identity,
// connection, options, counters, tracing and payload store, and changes
// none of them. Agent keeps what a send decides from the rest of the
// agent: composing inside a handler, fallbacks through the registry, and
// whether the agent is started to wait for a reply.
type sender struct {
	breakers breakers    // one per destination
	fast     fastBatches // fast batch publish, and the admission of sends until the agent stops
	line     sendLine    // concurrent sends sharing fast batches
	waitMu   sync.Mutex
	waiters  map[string]*waiter // by message id; nil once the agent has stopped

	id      string
	nc      *nats.Conn
	js      jetstream.JetStream
	opts    *options
	stats   *counters
	tracing *tracing
	objects *payloadStore
}

// compose builds an outgoing envelope from this agent. Inside a handler
// (ctx derived from the handler's), the envelope inherits the handled
// message's correlation, workflow, task and session ids and its context;
// options override what is inherited.
func (a *Agent) compose(ctx context.Context, t wire.MessageType, action string, payload any, opts []SendOption) (*outgoing, error) {
	raw, err := encodePayload(payload)
	if err != nil {
		return nil, err
	}
	e := wire.NewEnvelope(t, a.id, action)
	e.SenderType = a.opts.agentType
	e.Payload = raw
	if in := handling(ctx); in != nil {
		e.Correlation, e.WorkflowID, e.TaskID, e.SessionID, e.Context = in.Correlation, in.WorkflowID, in.TaskID, in.SessionID, in.Context
	}
	o := &outgoing{Envelope: e}
	id := e.MessageID
	for _, opt := range opts {
		opt(o)
	}
	o.idGiven = e.MessageID != id
	if e.Correlation == "" {
		e.Correlation = e.MessageID
	}
	return o, nil
}

// composeTo composes a request (or, with [WithMessageType], another type)
// to agent to. An empty or invalid id is an [ErrInvalidID]: an empty
// receiver would otherwise make the message a broadcast.
func (a *Agent) composeTo(ctx context.Context, to, action string, payload any, opts []SendOption) (*outgoing, error) {
	if err := validTarget("receiver id", to); err != nil {
		return nil, err
	}
	o, err := a.compose(ctx, wire.TypeRequest, action, payload, opts)
	if err != nil {
		return nil, err
	}
	o.ReceiverID = to
	return o, nil
}

// validTarget checks an agent id or topic passed to the API.
func validTarget(field, v string) error {
	if err := subjects.ValidateToken(field, v); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidID, err)
	}
	return nil
}

// Send sends a request (or, with [WithMessageType], another type) to
// agent to and returns once the stream has stored it. It does not wait for
// the receiver; see [Agent.Request] and [Agent.SendAndWait] for that.
// Concurrent Sends of one agent share fast batches, like [Agent.SendBatch],
// once four of its publishes are waiting for the stream: fewer stream
// acks, the same guarantee. Failures are those of [Agent.SendEnvelope];
// the envelope is returned with them, so that one whose publish could not
// be confirmed ([ErrPublishUnconfirmed]) can be resent under its id with
// [Agent.Resend], or Send again with [WithMessageID](env.MessageID).
func (a *Agent) Send(ctx context.Context, to, action string, payload any, opts ...SendOption) (*wire.Envelope, error) {
	o, err := a.composeTo(ctx, to, action, payload, opts)
	if err != nil {
		return nil, err
	}
	if a.BreakerState(to) == BreakerOpen {
		if err := o.Validate(); err != nil {
			return nil, err // before the fallback reads it
		}
		if err := a.fallBack(ctx, o, &CircuitOpenError{Agent: to, State: BreakerOpen}); err != nil {
			return nil, err
		}
	}
	return o.Envelope, a.SendEnvelope(ctx, o.Envelope)
}

// Publish sends a notification on topic to every agent subscribed to it.
func (a *Agent) Publish(ctx context.Context, topic, action string, payload any, opts ...SendOption) (*wire.Envelope, error) {
	if err := validTarget("topic", topic); err != nil {
		return nil, err
	}
	o, err := a.compose(ctx, wire.TypeNotification, action, payload, opts)
	if err != nil {
		return nil, err
	}
	o.Topic = topic
	return o.Envelope, a.SendEnvelope(ctx, o.Envelope)
}

// Broadcast sends a notification to every agent of the mesh (but this one).
func (a *Agent) Broadcast(ctx context.Context, action string, payload any, opts ...SendOption) (*wire.Envelope, error) {
	o, err := a.compose(ctx, wire.TypeNotification, action, payload, opts)
	if err != nil {
		return nil, err
	}
	return o.Envelope, a.SendEnvelope(ctx, o.Envelope)
}

// SendEnvelope publishes a complete envelope, which must name this agent as
// sender: to its receiver_id, else to its topic, else as a broadcast. It
// returns once the stream has stored it, retrying failed publishes with
// exponential backoff under the same message id, so a retry never
// duplicates. If ctx has no deadline, retries stop after the publish
// timeout ([WithPublishTimeout]). A ctx that has already ended publishes
// nothing and returns its error; so does a stopped agent, with
// [ErrClosed]. A failed send is [ErrPublish] when the stream did not store
// the message, [ErrPublishUnconfirmed] when it may have: then send the
// same envelope again (see [Agent.Resend]), which the stream stores at
// most once.
func (a *Agent) SendEnvelope(ctx context.Context, e *wire.Envelope) error {
	_, err := a.send.sendEnvelope(ctx, e, false)
	return err
}

// Resend is [Agent.SendEnvelope] for an envelope sent before whose publish
// could not be confirmed ([ErrPublishUnconfirmed]), e.g. the one
// [Agent.Send] returned with that error. It publishes e under its message
// id, which the stream stores at most once within its duplicate window,
// and held reports that the stream already held it: the earlier send was
// stored after all, and that copy is the one delivered. held is false when
// this call stored e, or, rarely, when a retry of this call found it
// stored and an earlier attempt of the same call may have stored it. Past
// the duplicate window (2 minutes by default) the stream stores e again.
func (a *Agent) Resend(ctx context.Context, e *wire.Envelope) (held bool, err error) {
	return a.send.sendEnvelope(ctx, e, true)
}

// sendEnvelope checks e and publishes it. held reports that the stream
// held e before this call, which only a publish alone can tell (see
// publish).
func (s *sender) sendEnvelope(ctx context.Context, e *wire.Envelope, alone bool) (held bool, err error) {
	if e == nil {
		return false, fmt.Errorf("%w: nil envelope", wire.ErrInvalidEnvelope)
	}
	if e.SenderID != s.id {
		return false, fmt.Errorf("%w: sender_id %q is not this agent %q", wire.ErrInvalidEnvelope, e.SenderID, s.id)
	}
	subject, err := s.subjectFor(e)
	if err != nil {
		return false, err
	}
	return s.publish(ctx, subject, e, alone)
}

func (s *sender) subjectFor(e *wire.Envelope) (string, error) {
	scheme := s.opts.scheme
	var subject string
	var err error
	switch {
	case e.ReceiverID != "":
		subject, err = scheme.Direct(e.ReceiverID, string(e.Priority), e.SenderID)
	case e.Topic != "":
		subject, err = scheme.Topic(e.Topic, string(e.Priority), e.SenderID)
	default:
		subject, err = scheme.Broadcast(string(e.Priority), e.SenderID)
	}
	if errors.Is(err, subjects.ErrInvalidToken) {
		var te *subjects.InvalidTokenError
		if errors.As(err, &te) && te.Field == "priority" {
			return "", &wire.ValidationError{Field: "priority", Reason: te.Error()}
		}
		return "", fmt.Errorf("%w: %w", ErrInvalidID, err)
	}
	return subject, err
}

func (s *sender) sendReply(ctx context.Context, e *wire.Envelope) error {
	if e.SenderType == "" {
		e.SenderType = s.opts.agentType
	}
	subject, err := s.subjectFor(e)
	if err != nil {
		return err
	}
	_, err = s.publish(ctx, subject, e, false)
	return err
}

// outMsg is an encoded envelope ready to publish. Its data lives in a
// pooled buffer (buf, nil when not pooled) that goes back to the pool only
// once the broker has acknowledged the message: until its future resolves,
// nats.go's async publish keeps the message to resend it, and agentkit's
// own retries reuse it too.
type outMsg struct {
	*nats.Msg
	buf *[]byte
}

// stored returns m's buffer to the pool; call it only after the broker
// acknowledged m.
func (m outMsg) stored() {
	putEncodeBuffer(m.buf)
}

// encode encodes e, which the caller has validated, as the NATS message to
// publish on subject: every Mesh-* header and the Nats-Msg-Id come from
// its fields, which validation bounds. Envelopes larger than the server's
// max payload are offloaded to the object store and replaced by a stub.
func (s *sender) encode(ctx context.Context, subject string, e *wire.Envelope) (outMsg, error) {
	buf := getEncodeBuffer()
	data, err := e.AppendJSON((*buf)[:0])
	if err != nil {
		putEncodeBuffer(buf)
		return outMsg{}, fmt.Errorf("%w: %w", wire.ErrInvalidEnvelope, err)
	}
	*buf = data
	ref := ""
	if max := s.nc.MaxPayload(); max > 0 && int64(len(data)) > max-headerRoom {
		data, err = s.offload(ctx, e, data)
		putEncodeBuffer(buf) // the object store has its own copy
		if err != nil {
			return outMsg{}, err
		}
		buf, ref = nil, e.MessageID
	}
	// The header values share one backing array: one allocation, not one per header.
	vals := [...]string{e.MessageID, string(e.MessageType), e.Action, ref, e.Correlation, e.WorkflowID, e.InReplyTo, e.TaskID, e.Status}
	h := make(nats.Header, 8) // up to 8 entries fit a small map: one allocation, not a table
	for i, k := range [...]string{wire.HeaderMsgID, wire.HeaderType, wire.HeaderAction, wire.HeaderEnvelopeRef, wire.HeaderCorrelation,
		wire.HeaderWorkflow, wire.HeaderInReplyTo, wire.HeaderTaskID, wire.HeaderStatus} {
		if vals[i] != "" || i < 3 {
			h[k] = vals[i : i+1 : i+1]
		}
	}
	return outMsg{Msg: &nats.Msg{Subject: subject, Data: data, Header: h}, buf: buf}, nil
}

// publish validates e, encodes it and stores it on subject, retrying
// retryable failures. A ctx that has ended, or a stopped agent, publishes
// nothing. held reports that the stream acked an attempt as a duplicate
// while no earlier attempt of this call could have stored e: it held e
// before this call. A fast batch stores nothing for a duplicate without
// saying so, so only a publish alone, whose first attempt never joins the
// send line, can tell that of its first attempt.
func (s *sender) publish(ctx context.Context, subject string, e *wire.Envelope, alone bool) (held bool, err error) {
	// First: nothing of an invalid envelope goes anywhere, not a header, a
	// span attribute nor an object.
	if err := e.Validate(); err != nil {
		return false, err
	}
	if !s.fast.enter(s.js) {
		return false, fmt.Errorf("%w: %s %s to %s not sent", ErrClosed, e.MessageType, e.MessageID, subject)
	}
	defer s.fast.leave()
	if err := ctx.Err(); err != nil {
		return false, fmt.Errorf("agentkit: %s %s to %s not sent: %w", e.MessageType, e.MessageID, subject, err)
	}
	ctx, span := s.tracing.startSend(ctx, subject, e)
	defer func() { endSpan(span, err) }()
	msg, err := s.encode(ctx, subject, e)
	if err != nil {
		return false, err
	}
	s.tracing.inject(ctx, msg.Header)
	var tried attempts
	if alone {
		held, err = s.publishAlone(ctx, msg)
	} else {
		err = s.publishFirst(ctx, msg)
	}
	tried.add(err)
	cause := err // the last failure of an attempt that ran its course
	if err != nil && retryablePublish(err) && ctx.Err() == nil {
		ctx, cancel := withDefaultTimeout(ctx, s.opts.publishTimeout)
		defer cancel()
		var answer answerTime
		wait := newPublishRetry()
		err = backoff.Retry(func() error {
			if answer.tooLate(ctx) {
				<-ctx.Done() // as if the backoff had lasted until the deadline
				return ctx.Err()
			}
			s.stats.publishRetries.Add(1)
			start := time.Now()
			mine := tried.unsure // an attempt of this call may have stored it
			dup, err := s.publishAlone(ctx, msg)
			held = dup && !mine
			answer.observe(time.Since(start), err)
			tried.add(err)
			wait.after(err)
			if err != nil && ctx.Err() == nil {
				cause = err
			}
			if err != nil && !retryablePublish(err) {
				return backoff.Permanent(err)
			}
			return err
		}, backoff.WithContext(wait, ctx))
	}
	if err != nil {
		err = tried.failure(fmt.Sprintf("%s %s to %s", e.MessageType, e.MessageID, subject), err, cause)
		s.published(e, err, false, false)
		return false, err
	}
	msg.stored()
	s.published(e, nil, false, false)
	return held, nil
}

// publishRetry is the retry schedule of failed publishes: exponential
// from 50ms to 2s, bounded by the caller's context, except that after an
// attempt no stream answered it waits at most electionRetry. That is a
// stream whose leader is being elected (or none at all), and a new
// leader stores within a few hundred milliseconds of its election: the
// exponential wait alone held a Send up to 2.7s past it.
type publishRetry struct {
	backoff.BackOff
	noStream bool // the last attempt reached no stream
}

// electionRetry is the longest wait after an attempt no stream answered.
const electionRetry = 250 * time.Millisecond

func newPublishRetry() *publishRetry {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval, b.MaxInterval, b.MaxElapsedTime = 50*time.Millisecond, 2*time.Second, 0
	return &publishRetry{BackOff: b}
}

// after notes the failure of an attempt (nil: none).
func (p *publishRetry) after(err error) {
	p.noStream = errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders)
}

// NextBackOff returns the wait before the next attempt.
func (p *publishRetry) NextBackOff() time.Duration {
	d := p.BackOff.NextBackOff()
	if p.noStream && d > electionRetry {
		d = electionRetry
	}
	return d
}

// pubOutcome is what a failed publish attempt says about whether the stream
// stored its message. Telling "not stored" from "may have been stored"
// decides the caller's next step: a message not stored may be sent again
// under any id, one that may have been stored only under its own id, or it
// is handled twice.
type pubOutcome int

const (
	// pubUnsent: the message never left this client.
	pubUnsent pubOutcome = iota
	// pubNone: this attempt stored nothing (no stream answered, or it
	// could not take messages then), which says nothing of earlier ones.
	pubNone
	// pubRefused: the stream refused the message for what it is, or
	// after its duplicate check, so no attempt stored it.
	pubRefused
	// pubUnknown: the message may have been stored (the attempt
	// reached the server and no answer came back).
	pubUnknown
)

// The server's error codes (nats-server's errors.json) that come either
// from the message itself, the same for every attempt, or after the
// stream's duplicate check, and so prove no attempt stored the message.
const (
	jsStreamStoreFailed     = 10077 // a limit (max messages, bytes) or the store refused it
	jsMessageExceedsMaximum = 10054 // larger than the stream's max_msg_size
)

// attemptError is a failed attempt whose error alone does not tell its
// outcome: one that never left this client, or one an earlier attempt
// (a fast batch) may have stored.
type attemptError struct {
	err     error
	outcome pubOutcome
}

func (e *attemptError) Error() string { return e.err.Error() }
func (e *attemptError) Unwrap() error { return e.err }

// unsent marks err as the failure of an attempt that published nothing.
func unsent(err error) error { return &attemptError{err: err, outcome: pubUnsent} }

// publishOutcome classifies err, the failure of one publish attempt.
// Whatever it does not know to have stored nothing may have stored the
// message: a timeout or an ended ctx while the ack was on its way, a
// reconnect that dropped the pending acks (nats.ErrDisconnected), a
// publisher cleaned up under it, an unreadable ack.
func publishOutcome(err error) pubOutcome {
	var ae *attemptError
	var apiErr *jetstream.APIError
	switch {
	case errors.As(err, &ae):
		return ae.outcome
	case errors.Is(err, ErrPermissionDenied):
		return pubNone // the server dropped it: no stream saw it
	case errors.As(err, &apiErr):
		switch apiErr.ErrorCode {
		case jsDuplicateInProcess:
			return pubUnknown // an earlier attempt holds the id and may yet store it
		case jsStreamStoreFailed, jsMessageExceedsMaximum:
			return pubRefused
		}
		return pubNone // the stream answered, storing nothing (no leader, a limit of the account, ...)
	case errors.Is(err, jetstream.ErrNoStreamResponse), errors.Is(err, nats.ErrNoResponders):
		return pubNone // no stream listens on the subject
	}
	return pubUnknown
}

// attempts sums up the failed attempts to publish one message.
type attempts struct {
	sent   bool // a message left this client
	unsure bool // the stream may have stored it
}

// add counts a failed attempt; nil (a success) changes nothing.
func (t *attempts) add(err error) {
	if err != nil {
		t.note(publishOutcome(err))
	}
}

func (t *attempts) note(o pubOutcome) {
	switch o {
	case pubNone:
		t.sent = true
	case pubRefused:
		t.sent, t.unsure = true, false
	case pubUnknown:
		t.sent, t.unsure = true, true
	}
}

// failure is the error of a publish of what (type, id and subject) that
// failed with err after attempts t. cause is the last failure of an
// attempt that ran its course, when err is only that the time ran out.
func (t attempts) failure(what string, err, cause error) error {
	if cause != nil && !errors.Is(err, cause) {
		// Say why the attempts failed (no stream answering, no leader,
		// ...), not only that the time ran out.
		err = fmt.Errorf("%w (attempts failed with: %w)", err, cause)
	}
	switch {
	case t.unsure:
		return fmt.Errorf("%w: %s: %w", ErrPublishUnconfirmed, what, err)
	case !t.sent && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)):
		// The caller's ctx ended before anything went out: its own error,
		// not a failed publish.
		return fmt.Errorf("agentkit: %s not sent: %w", what, err)
	}
	return fmt.Errorf("%w: %s: %w", ErrPublish, what, err)
}

// answerTime is how long the stream took to answer (refusing, or with
// no stream there) the last attempt it answered. A retry is only started
// if its answer may come back before the deadline: one started later would
// most likely end unanswered, turning the answers so far ("not stored")
// into "may have been stored" for nothing.
type answerTime time.Duration

// observe records an attempt that took d and failed with err; only a
// failure the stream answered says how long answers take.
func (t *answerTime) observe(d time.Duration, err error) {
	if streamAnswered(err) {
		*t = answerTime(d)
	}
}

// streamAnswered reports whether err is the failure of an attempt the
// stream, or the server for it, answered in time.
func streamAnswered(err error) bool {
	o := publishOutcome(err)
	return err != nil && (o == pubNone || o == pubRefused)
}

// tooLate reports whether ctx ends before the answer to an attempt
// started now can be expected: in less than four of the last answers'
// time, a margin for a busy stream or machine.
func (t answerTime) tooLate(ctx context.Context) bool {
	deadline, ok := ctx.Deadline()
	return ok && t > 0 && time.Until(deadline) < 4*time.Duration(t)
}

// NewRequest returns a request envelope from this agent to agent to,
// ready for [Agent.SendEnvelope] or [Agent.SendBatch]. Inside a handler it
// inherits the handled message's ids like [Agent.Send].
func (a *Agent) NewRequest(ctx context.Context, to, action string, payload any, opts ...SendOption) (*wire.Envelope, error) {
	o, err := a.composeTo(ctx, to, action, payload, opts)
	if err != nil {
		return nil, err
	}
	return o.Envelope, nil
}

// BatchError reports which envelopes of a [Agent.SendBatch] were not
// confirmed stored.
type BatchError struct {
	// Errs[i] is nil when envs[i] was stored, else why it was not
	// confirmed: [ErrPublish] (not stored), [ErrPublishUnconfirmed] (may
	// have been stored: resend it as it is), or the ctx's error when the
	// ctx ended before it was sent.
	Errs []error
}

func (e *BatchError) Error() string {
	n, maybe, first := 0, 0, error(nil)
	for _, err := range e.Errs {
		if err != nil {
			if first == nil {
				first = err
			}
			n++
			if errors.Is(err, ErrPublishUnconfirmed) {
				maybe++
			}
		}
	}
	if maybe > 0 {
		return fmt.Sprintf("agentkit: %d of %d messages not confirmed stored (%d may have been); first: %v", n, len(e.Errs), maybe, first)
	}
	return fmt.Sprintf("agentkit: %d of %d messages not stored; first: %v", n, len(e.Errs), first)
}

// Unwrap returns the individual failures, so errors.Is(err, ErrPublish)
// and errors.Is(err, ErrPublishUnconfirmed) work.
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
// them. Every envelope is checked before anything is published, and a ctx
// that has ended, or a stopped agent ([ErrClosed]), publishes nothing.
// Failed publishes are retried with exponential backoff under their own
// message ids, so a retry never duplicates; what still fails when ctx (or
// the publish timeout) ends is reported per envelope in a [*BatchError].
// SendBatch is the bulk path: one goroutine can keep the stream busy
// without waiting for each ack in turn. On a stream that allows it (NATS
// 2.14+, allow_batched, as [StreamConfig] sets), the messages go as fast
// batches of up to 1,000, each confirmed by one ack instead of one per
// message; what a fast batch does not confirm is published one by one.
func (a *Agent) SendBatch(ctx context.Context, envs []*wire.Envelope) error {
	return a.send.sendBatch(ctx, envs)
}

// sendBatch publishes envs; see [Agent.SendBatch].
func (s *sender) sendBatch(ctx context.Context, envs []*wire.Envelope) (err error) {
	subject := make([]string, len(envs))
	for i, e := range envs {
		if e == nil {
			return fmt.Errorf("%w: batch item %d: nil envelope", wire.ErrInvalidEnvelope, i)
		}
		if e.SenderID != s.id {
			return fmt.Errorf("%w: batch item %d: sender_id %q is not this agent %q", wire.ErrInvalidEnvelope, i, e.SenderID, s.id)
		}
		var err error
		if subject[i], err = s.subjectFor(e); err == nil {
			err = e.Validate()
		}
		if err != nil {
			return fmt.Errorf("agentkit: batch item %d: %w", i, err)
		}
	}
	if !s.fast.enter(s.js) {
		return fmt.Errorf("%w: batch of %d messages not sent", ErrClosed, len(envs))
	}
	defer s.fast.leave()
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("agentkit: batch of %d messages not sent: %w", len(envs), err)
	}
	parent := trace.SpanContextFromContext(ctx)
	ctx, span := s.tracing.tracer.Start(ctx, "send batch", trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(attribute.String("messaging.system", "nats"), attribute.Int("messaging.batch.message_count", len(envs))))
	defer func() { endSpan(span, err) }()
	recording := span.IsRecording()
	msgs := make([]outMsg, len(envs))
	for i, e := range envs {
		if recording {
			mirrorTrace(e, span, parent) // every message carries the batch span
		}
		// A large envelope goes to the object store here: only once every
		// one is known to be valid.
		if msgs[i], err = s.encode(ctx, subject[i], e); err != nil {
			return fmt.Errorf("agentkit: batch item %d: %w", i, err)
		}
		s.tracing.inject(ctx, msgs[i].Header)
	}
	ctx, cancel := withDefaultTimeout(ctx, s.opts.publishTimeout)
	defer cancel()
	errs := make([]error, len(envs))
	tried := make([]attempts, len(envs))
	fast := s.publishFast(ctx, msgs, tried)
	todo := seq(fast, len(envs))
	b := newPublishRetry()
	var answer answerTime
	for {
		start := time.Now()
		s.publishEach(ctx, msgs, todo, errs)
		took := time.Since(start)
		retry, answered := todo[:0], true
		for _, i := range todo {
			tried[i].add(errs[i])
			answered = answered && (errs[i] == nil || streamAnswered(errs[i]))
			if errs[i] != nil && retryablePublish(errs[i]) && ctx.Err() == nil {
				retry = append(retry, i)
			}
		}
		if len(retry) == 0 {
			break
		}
		if answered {
			// Every failure was answered: the round took as long as the
			// stream's answers did.
			answer = answerTime(took)
		}
		b.after(errs[retry[0]])
		select {
		case <-time.After(b.NextBackOff()):
		case <-ctx.Done():
		}
		if answer.tooLate(ctx) {
			<-ctx.Done() // as if the backoff had lasted until the deadline
		}
		if ctx.Err() != nil {
			break // errs keeps each message's last failure
		}
		s.stats.publishRetries.Add(uint64(len(retry)))
		todo = retry
	}
	failed := 0
	for i, err := range errs {
		if err != nil {
			errs[i] = tried[i].failure(fmt.Sprintf("%s %s to %s", envs[i].MessageType, envs[i].MessageID, msgs[i].Subject), err, nil)
			s.published(envs[i], errs[i], true, false)
			failed++
			continue
		}
		msgs[i].stored()
		s.published(envs[i], nil, true, i < fast)
	}
	if failed > 0 {
		return &BatchError{Errs: errs}
	}
	return nil
}

// publishOnce makes one attempt to publish msg on its own (see
// publishEach).
func (s *sender) publishOnce(ctx context.Context, msg outMsg) error {
	_, err := s.publishAlone(ctx, msg)
	return err
}

// publishAlone is publishOnce, also reporting whether the stream acked
// msg as a duplicate of a message id it held.
func (s *sender) publishAlone(ctx context.Context, msg outMsg) (dup bool, err error) {
	var errs [1]error
	var dups [1]bool
	s.publishAcked(ctx, []outMsg{msg}, []int{0}, errs[:], dups[:])
	return dups[0], errs[0]
}

// publishEach publishes msgs[i] for each i in todo asynchronously, then
// waits for each one's ack (or ctx) and sets errs[i] to its outcome. The
// jetstream context bounds each wait by the attempt timeout, and all
// publishes share one reply subscription instead of a request each. Once
// ctx has ended it publishes nothing more.
func (s *sender) publishEach(ctx context.Context, msgs []outMsg, todo []int, errs []error) {
	s.publishAcked(ctx, msgs, todo, errs, nil)
}

// publishAcked is publishEach, also setting dups[i], if dups is not nil,
// when the stream acked msgs[i] as a duplicate.
func (s *sender) publishAcked(ctx context.Context, msgs []outMsg, todo []int, errs []error, dups []bool) {
	futures := make([]jetstream.PubAckFuture, len(todo))
	for j, i := range todo {
		if err := ctx.Err(); err != nil {
			errs[i] = unsent(err)
			continue
		}
		var err error
		if futures[j], err = s.js.PublishMsgAsync(msgs[i].Msg, asyncPublishOpts...); err != nil {
			errs[i] = unsent(err)
		} else {
			errs[i] = nil
		}
	}
	for j, i := range todo {
		if futures[j] != nil {
			select {
			case ack := <-futures[j].Ok():
				if s.countDuplicate(ack) && dups != nil {
					dups[i] = true
				}
				continue
			case errs[i] = <-futures[j].Err():
			case <-ctx.Done():
				errs[i] = ctx.Err() // the message went out: it may be stored
			}
		}
		if denied := s.denied(msgs[i].Subject); denied != nil {
			errs[i] = denied
		}
	}
}

// asyncPublishOpts turns off nats.go's own retries after "no responders"
// (2, 250ms apart): agentkit retries with its backoff anyway, and an
// attempt must end with the server's answer, not republish behind the
// caller's back after the caller was told how it ended.
var asyncPublishOpts = []jetstream.PublishOpt{jetstream.WithRetryAttempts(0)}

// countDuplicate counts ack in Stats.PublishDuplicates if the stream
// stored nothing for it, and reports whether it did.
func (s *sender) countDuplicate(ack *jetstream.PubAck) bool {
	if ack != nil && ack.Duplicate {
		s.stats.publishDups.Add(1)
		return true
	}
	return false
}

// denied returns ErrPermissionDenied when the server refused this
// connection the subject. The server reports that only asynchronously
// (nats.go keeps it as the connection's last error), so without this check
// a denial looks like a timeout and would be retried in vain.
func (s *sender) denied(subject string) error {
	pe, ok := permission.Parse(s.nc.LastError())
	if !ok || subject != "" && pe.Subject != subject {
		return nil
	}
	return pe
}

// retryablePublish reports whether a failed publish may succeed if repeated:
// timeouts, missing responders, a temporarily unavailable JetStream and a
// message id still in process, but not a closed connection, an oversize
// message or a stream's refusal.
func retryablePublish(err error) bool {
	var apiErr *jetstream.APIError
	switch {
	case errors.Is(err, ErrPermissionDenied):
		return false
	case errors.As(err, &apiErr):
		return apiErr.Code == 503 || apiErr.ErrorCode == jsDuplicateInProcess
	case errors.Is(err, nats.ErrConnectionClosed), errors.Is(err, nats.ErrMaxPayload),
		errors.Is(err, nats.ErrBadSubject), errors.Is(err, nats.ErrInvalidMsg):
		return false
	}
	return true
}

// jsDuplicateInProcess is the server's error (409) for a message whose id
// an earlier publish holds in process on a clustered stream, not yet
// stored (JSStreamDuplicateMessageConflict): a retry of a publish that
// timed out, or SendBatch republishing what a fast batch interrupted by a
// leader change did not confirm. Repeated, the publish finds the first one
// stored and is acked as its duplicate, or stores the message if the first
// one failed.
const jsDuplicateInProcess = 10158

func withDefaultTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, d)
}

// await sends o and waits for the reply accept admits. A message whose
// id the caller chose may be one the stream holds already, from an
// earlier call: if that call received the answer, no other will come, and
// await fails at once with ErrDuplicateRequest; if it is still to come,
// await receives it. Telling the two apart takes the stream's duplicate
// flag, so such a message is published alone (see publish).
func (a *Agent) await(ctx context.Context, o *outgoing, accept func(*wire.Envelope) bool) (*wire.Envelope, error) {
	e := o.Envelope
	if a.lifecycle() == stateNew {
		return nil, fmt.Errorf("%w: waiting for a reply needs a started agent", ErrNotStarted)
	}
	w, err := a.send.addWaiter(e.MessageID, accept)
	if err != nil {
		return nil, fmt.Errorf("%w: %s %s to %s: another call of this agent is waiting for its answer", err, e.Action, e.MessageID, e.ReceiverID)
	}
	if w == nil {
		return nil, fmt.Errorf("%w: cannot wait for a reply to %s", ErrClosed, e.Action)
	}
	defer a.send.removeWaiter(e.MessageID, w)
	if a.lifecycle() != stateStarted { // stopping: it no longer reads its replies
		return nil, fmt.Errorf("%w: cannot wait for a reply to %s", ErrClosed, e.Action)
	}
	ctx, cancel := withDefaultTimeout(ctx, a.opts.requestTimeout)
	defer cancel()
	held, err := a.send.sendEnvelope(ctx, e, o.idGiven)
	if err != nil {
		return nil, err
	}
	if held && a.send.answeredBefore(e.MessageID, w) {
		return nil, fmt.Errorf("%w: %s %s to %s: the stream held it already", ErrDuplicateRequest, e.Action, e.MessageID, e.ReceiverID)
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
func remoteError(r *wire.Envelope) error {
	if r.Error == nil {
		return (&wire.Error{Code: wire.CodeInternal, Message: "reply with status " + r.Status + " and no error"}).AsRemote()
	}
	return r.Error.AsRemote()
}

// Request sends a request to agent to and waits for its response (matched
// by in_reply_to). An error reply is returned as an [*wire.Error] (IsRemote is
// true) together with the reply envelope; no reply before ctx's deadline (or
// the request timeout, [WithRequestTimeout]) is [ErrTimeout]. A response
// arriving after that is acked, dropped and counted as [OutcomeLateReply].
// The agent must be started.
//
// A request whose publish could not be confirmed ([ErrPublishUnconfirmed])
// may have been stored and be answered. To retry one safely, give it an
// id ([WithMessageID] with a [wire.NewMessageID]) and retry under the same
// id: the stream stores it once, and the retry receives the answer if it
// is still to come, or fails at once with [ErrDuplicateRequest] if it
// came to the earlier call (the agent remembers that of the last few
// thousand ids answered). The same holds for a retry after [ErrTimeout].
func (a *Agent) Request(ctx context.Context, to, action string, payload any, opts ...SendOption) (*wire.Envelope, error) {
	o, err := a.composeTo(ctx, to, action, payload, opts)
	if err != nil {
		return nil, err
	}
	return a.guarded(ctx, o, func(r *wire.Envelope) bool {
		return r.MessageType == wire.TypeResponse || r.MessageType == wire.TypeError || r.MessageType == wire.TypeAck && r.Status == wire.StatusNACK
	}, func(r *wire.Envelope) error {
		if r.MessageType != wire.TypeResponse {
			return remoteError(r)
		}
		return nil
	})
}

// guarded sends o through the circuit breaker of its receiver and waits
// for the reply accept admits; judge turns the reply into the caller's
// error, which is also what the breaker counts. An open circuit falls back
// when o allows it; a half-open one lets the message through as a trial,
// at low priority.
func (a *Agent) guarded(ctx context.Context, o *outgoing, accept func(*wire.Envelope) bool, judge func(*wire.Envelope) error) (r *wire.Envelope, err error) {
	if err := o.Validate(); err != nil {
		return nil, err // before its values reach a span, the breaker or a fallback
	}
	if a.send.fast.stopped() {
		// Before the breaker and the fallback: a stopped agent neither
		// counts against the destination nor looks for another one.
		return nil, fmt.Errorf("%w: %s %s to %s not sent", ErrClosed, o.MessageType, o.MessageID, o.ReceiverID)
	}
	ctx, span := a.tracing.startRequest(ctx, o)
	defer func() { endSpan(span, err) }()
	done, trial, err := a.send.allow(o.ReceiverID)
	if err != nil {
		if err := a.fallBack(ctx, o, err); err != nil {
			a.requested(RequestEvent{To: o.ReceiverID, Request: o.Envelope, Err: err, Refused: true})
			return nil, err
		}
		if done, trial, err = a.send.allow(o.ReceiverID); err != nil {
			a.requested(RequestEvent{To: o.ReceiverID, Request: o.Envelope, Err: err, Refused: true})
			return nil, err
		}
	}
	if trial {
		o.Priority = wire.PriorityLow
	}
	start := time.Now()
	r, err = a.await(ctx, o, accept)
	var elapsed time.Duration
	if err == nil {
		elapsed = time.Since(start)
		err = judge(r)
	}
	done(err)
	a.requested(RequestEvent{To: o.ReceiverID, Request: o.Envelope, Reply: r, Elapsed: elapsed, Err: err})
	return r, err
}

// Ack is the receiver's acknowledgment of a message sent with
// [Agent.SendAndWait].
type Ack struct {
	// MessageID is the id of the acknowledged message.
	MessageID string
	// OK is true for ACK, false for NACK.
	OK bool
	// ProcessingTime is the time the receiver reported spending on the message.
	ProcessingTime time.Duration
	// Error is the NACK's code and reason; nil on ACK.
	Error *wire.Error
	// Envelope is the ack (or error) envelope itself.
	Envelope *wire.Envelope
}

// SendAndWait sends a request with requires_ack set and waits for the
// receiver's ack envelope: an [*Ack] with OK set, or, on NACK, the Ack and an
// [*wire.Error] carrying the code and reason. Busy receivers do not NACK: the
// broker redelivers on the priority's backoff and the ACK comes when the
// message is finally handled, so ctx should allow for the retries. The
// agent must be started. A failed publish, and a retry under the same
// message id, are as for [Agent.Request].
func (a *Agent) SendAndWait(ctx context.Context, to, action string, payload any, opts ...SendOption) (*Ack, error) {
	o, err := a.composeTo(ctx, to, action, payload, opts)
	if err != nil {
		return nil, err
	}
	o.RequiresAck = true
	r, err := a.guarded(ctx, o, func(r *wire.Envelope) bool { return r.MessageType == wire.TypeAck || r.MessageType == wire.TypeError },
		func(r *wire.Envelope) error {
			if r.MessageType == wire.TypeAck && r.Status == wire.StatusACK {
				return nil
			}
			return remoteError(r)
		})
	if r == nil {
		return nil, err
	}
	ack := &Ack{MessageID: o.MessageID, OK: err == nil, Envelope: r}
	if ms, perr := strconv.ParseInt(r.Metadata[wire.MetaProcessingTime], 10, 64); perr == nil {
		ack.ProcessingTime = time.Duration(ms) * time.Millisecond
	}
	errors.As(err, &ack.Error)
	return ack, err
}
