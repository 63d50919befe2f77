package agentkit

import (
	"errors"

	"github.com/agentmesh-io/agentmesh/agentkit/bucket"
	"github.com/agentmesh-io/agentmesh/agentkit/permission"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
)

// Sentinel errors. Each is returned wrapped with context; match with errors.Is.
var (
	// ErrInvalidOption: an option or argument was out of range.
	ErrInvalidOption = errors.New("agentkit: invalid option")
	// ErrInvalidID: an agent id or topic is not a valid subject token.
	ErrInvalidID = errors.New("agentkit: invalid id")
	// ErrNotStarted: the call needs a started agent (Request, SendAndWait, Subscribe).
	ErrNotStarted = errors.New("agentkit: agent not started")
	// ErrAlreadyStarted: Start was called twice, or Handle after Start.
	ErrAlreadyStarted = errors.New("agentkit: agent already started")
	// ErrClosed: the agent has been stopped. Once Stop or Drain has
	// returned (or the connection closed), every send fails with it and
	// publishes nothing: Send, Publish, Broadcast, Request, SendAndWait,
	// SendEnvelope, SendBatch and replies. During Drain, handlers still
	// running may send.
	ErrClosed = errors.New("agentkit: agent stopped")
	// ErrHandlersAbandoned is reported to the error handler by a Stop (or
	// a Drain whose ctx ended) that stopped waiting for handlers still
	// running the stop grace after their context was cancelled (see
	// [WithStopGrace]); it says how many. Their messages went back for
	// redelivery and their results are dropped; their goroutines end when
	// they return.
	ErrHandlersAbandoned = errors.New("agentkit: handlers abandoned")
	// ErrPublish: the stream did not store the message (every attempt was
	// refused or reached no stream), so sending it again cannot duplicate
	// it.
	ErrPublish = errors.New("agentkit: publish failed")
	// ErrPublishUnconfirmed: an attempt reached the server but no answer
	// came back before the context (or the publish timeout) ended, so the
	// message may have been stored and may be delivered. It does not match
	// [ErrPublish]. Resend the same envelope within the stream's duplicate
	// window ([Agent.Resend], which also tells whether the stream held it,
	// or [WithMessageID] with its id): the stream then stores it at most
	// once.
	ErrPublishUnconfirmed = errors.New("agentkit: publish unconfirmed: the message may have been stored")
	// ErrDuplicateRequest: a [Agent.Request] or [Agent.SendAndWait] under
	// a message id (see [WithMessageID]) whose answer this agent cannot
	// wait for: the stream already held the message and the answer came
	// to an earlier call, or another call of this agent is waiting for it.
	// The call fails at once rather than wait out its deadline. The
	// message is stored once; retrying under a new id has it handled
	// again.
	ErrDuplicateRequest = errors.New("agentkit: duplicate request: its answer goes to an earlier call")
	// ErrTimeout: no response or ack arrived before the context's deadline.
	ErrTimeout = errors.New("agentkit: timed out waiting for reply")
	// ErrPayloadTooLarge: the encoded envelope exceeds the connection's max payload.
	ErrPayloadTooLarge = errors.New("agentkit: envelope too large")
	// ErrCircuitOpen: the circuit to the destination is open; nothing was sent
	// (see [CircuitOpenError]).
	ErrCircuitOpen = errors.New("agentkit: circuit open")
	// ErrNoFallback: no other READY agent has the capability to take the
	// message (see [NoFallbackError]).
	ErrNoFallback = errors.New("agentkit: no fallback agent")
	// ErrTooFewReplicas: the stream or a bucket the agent opens exists with
	// fewer replicas than WithReplicas asks for (see [EnsureStream]).
	ErrTooFewReplicas = bucket.ErrTooFewReplicas
	// ErrPermissionDenied is [permission.ErrDenied]: the server refused
	// this connection's credentials a subject (publishing as another
	// agent, another agent's consumer, a JetStream API call). Not retried.
	ErrPermissionDenied = permission.ErrDenied
)

// CodeOf returns the [wire.ErrorCode] carried by err, [wire.CodeTimeout] for
// [ErrTimeout], or "" when err carries none.
func CodeOf(err error) wire.ErrorCode {
	var e *wire.Error
	if errors.As(err, &e) {
		return e.Code
	}
	if errors.Is(err, ErrTimeout) {
		return wire.CodeTimeout
	}
	return ""
}

// IsRetryable reports whether trying again may succeed: a timeout, a
// publish failure, an unconfirmed publish (resend it under the same
// message id), or an [*wire.Error] marked retryable; never a permission denial.
func IsRetryable(err error) bool {
	if errors.Is(err, ErrPermissionDenied) {
		return false
	}
	var e *wire.Error
	if errors.As(err, &e) {
		return e.Retryable
	}
	return errors.Is(err, ErrTimeout) || errors.Is(err, ErrPublish) || errors.Is(err, ErrPublishUnconfirmed)
}
