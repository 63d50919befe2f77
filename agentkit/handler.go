package agentkit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/agentkit/wire"
)

// Handler handles the messages of one action. The error it returns decides
// what happens to the message (see the package documentation's outcome
// table): nil acks it, [Busy] or any other error retries it later, [Reject]
// terminates it and tells the sender.
//
// Handlers run concurrently with each other (see [WithConcurrency]) and
// must honour ctx, which is cancelled at the priority's ProcessingLimit and
// when the agent stops.
type Handler interface {
	Handle(ctx context.Context, m *Message) error
}

// HandlerFunc adapts a function to [Handler].
type HandlerFunc func(ctx context.Context, m *Message) error

// Handle calls f.
func (f HandlerFunc) Handle(ctx context.Context, m *Message) error { return f(ctx, m) }

// Message is a received envelope with its delivery details. The embedded
// [wire.Envelope] must not be modified.
type Message struct {
	*wire.Envelope
	// Subject is the subject the message was published on.
	Subject string
	// Delivery is the delivery attempt, 1 on the first.
	Delivery uint64
	// StreamSeq is the message's sequence in the stream.
	StreamSeq uint64

	send *sender // replies go out through the agent's send side
	msg  jetstream.Msg
}

// Reply sends a response to the sender carrying payload (encoded as JSON
// unless it is a json.RawMessage or []byte of JSON) with action and this
// message's correlation, workflow, task and session ids.
func (m *Message) Reply(ctx context.Context, action string, payload any) error {
	raw, err := encodePayload(payload)
	if err != nil {
		return err
	}
	return m.send.sendReply(ctx, m.NewResponse(m.send.id, action, raw))
}

// ReplyError sends an error envelope answering this message. Most handlers
// return [Reject] instead, which also terminates the message.
func (m *Message) ReplyError(ctx context.Context, e *wire.Error) error {
	return m.send.sendReply(ctx, m.NewErrorReply(m.send.id, e))
}

// Busy returns an error telling the runtime the agent cannot take the
// message now: it is NAKed and redelivered after the given delay, on every
// attempt that returns it (the growth of the broker's ack timeout with the
// attempt is taken off), or with the priority's backoff for this attempt
// as the NAK's delay when after is 0.
func Busy(after time.Duration) error { return &retryError{delay: after, code: wire.CodeBusy} }

// Retry wraps err so the message is redelivered after delay, as [Busy]
// does (0: the priority's backoff). Plain errors returned by a handler are retried the
// same way; Retry only sets the delay.
func Retry(err error, after time.Duration) error {
	return &retryError{delay: after, code: wire.CodeInternal, err: err}
}

// Reject returns an error telling the runtime the message can never
// succeed: it is terminated with reason and the sender receives an error
// (or NACK) envelope carrying code. A handler returning a non-retryable
// [*wire.Error] has the same effect.
func Reject(code wire.ErrorCode, reason string) error {
	if !code.Valid() {
		code = wire.CodeRejected
	}
	return &wire.Error{Code: code, Message: reason, Retryable: false}
}

// ErrHandlerPanic matches the error of a handler (or middleware) that
// panicked: the runtime recovered the panic, logged its stack and retries
// the message as for any other error.
var ErrHandlerPanic = errors.New("handler panic")

type retryError struct {
	delay time.Duration
	code  wire.ErrorCode
	err   error
}

func (e *retryError) Error() string {
	if e.err != nil {
		return fmt.Sprintf("agentkit: retry: %v", e.err)
	}
	return "agentkit: " + string(e.code)
}

func (e *retryError) Unwrap() error { return e.err }

// encodePayload turns a payload argument into raw JSON. Raw JSON
// (json.RawMessage or []byte) is used as is and checked when the envelope
// is encoded; anything else is marshalled with encoding/json.
func encodePayload(payload any) (json.RawMessage, error) {
	switch p := payload.(type) {
	case nil:
		return nil, nil
	case json.RawMessage:
		return p, nil
	case []byte:
		return p, nil
	}
	b, err := json.Marshal(payload)
	if err != nil {
		return nil, fmt.Errorf("%w: payload: %w", wire.ErrInvalidEnvelope, err)
	}
	return b, nil
}

type handlingKey struct{}

// withHandling marks ctx as belonging to the handling of env.
func withHandling(ctx context.Context, env *wire.Envelope) context.Context {
	return context.WithValue(ctx, handlingKey{}, env)
}

// handling returns the envelope whose handler ctx belongs to, or nil.
func handling(ctx context.Context) *wire.Envelope {
	e, _ := ctx.Value(handlingKey{}).(*wire.Envelope)
	return e
}

// HandledEnvelope returns the envelope being handled when ctx is (derived
// from) a handler's context, else nil.
func HandledEnvelope(ctx context.Context) *wire.Envelope { return handling(ctx) }
