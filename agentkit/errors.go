package agentkit

import (
	"errors"
	"fmt"
	"time"
)

// Sentinel errors. Each is returned wrapped with context; match with errors.Is.
var (
	// ErrInvalidEnvelope: an envelope failed to decode or validate.
	ErrInvalidEnvelope = errors.New("agentkit: invalid envelope")
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
	// ErrPublish: the stream did not store the message (every attempt was
	// refused or reached no stream), so sending it again cannot duplicate
	// it.
	ErrPublish = errors.New("agentkit: publish failed")
	// ErrPublishUnconfirmed: an attempt reached the server but no answer
	// came back before the context (or the publish timeout) ended, so the
	// message may have been stored and may be delivered. It does not match
	// [ErrPublish]. Resend the same envelope ([Agent.SendEnvelope], or
	// [WithMessageID] with its id) within the stream's duplicate window:
	// the stream then stores it at most once.
	ErrPublishUnconfirmed = errors.New("agentkit: publish unconfirmed: the message may have been stored")
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
	// ErrPermissionDenied: the server refused this connection's credentials
	// a subject (publishing as another agent, another agent's consumer, a
	// JetStream API call). Not retried.
	ErrPermissionDenied = errors.New("agentkit: permission denied")
)

// ValidationError names the envelope field that failed validation.
type ValidationError struct {
	Field  string
	Reason string
}

func (e *ValidationError) Error() string {
	return fmt.Sprintf("agentkit: invalid envelope: %s: %s", e.Field, e.Reason)
}

// Is reports whether target is [ErrInvalidEnvelope].
func (e *ValidationError) Is(target error) bool { return target == ErrInvalidEnvelope }

func invalid(field, reason string) error { return &ValidationError{Field: field, Reason: reason} }

// Error is the error object of the ACL envelope and the Go error returned by
// [Agent.Request] and [Agent.SendAndWait] when the receiver answered with an
// error or a NACK. Use errors.As to read the code.
type Error struct {
	Code         ErrorCode      `json:"code"`
	Message      string         `json:"message,omitempty"`
	Retryable    bool           `json:"retryable"`
	RetryAfterMS int64          `json:"retry_after_ms,omitzero"`
	Details      map[string]any `json:"details,omitempty"`
	remote       bool           // set when the error came back from another agent
}

// NewError returns an error with code, a message, and the code's retryability.
func NewError(code ErrorCode, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...), Retryable: code.Retryable()}
}

func (e *Error) Error() string {
	origin := "agentkit"
	if e.remote {
		origin = "agentkit: remote"
	}
	if e.Message == "" {
		return fmt.Sprintf("%s: %s", origin, e.Code)
	}
	return fmt.Sprintf("%s: %s: %s", origin, e.Code, e.Message)
}

// RetryAfter returns the receiver's hint of when to retry, or 0; absurd
// hints are capped at [MaxTTLMillis].
func (e *Error) RetryAfter() time.Duration {
	return time.Duration(min(max(e.RetryAfterMS, 0), MaxTTLMillis)) * time.Millisecond
}

// IsRemote reports whether err carries an [*Error] sent back by another agent.
func IsRemote(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.remote
}

// CodeOf returns the [ErrorCode] carried by err, [CodeTimeout] for
// [ErrTimeout], or "" when err carries none.
func CodeOf(err error) ErrorCode {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	if errors.Is(err, ErrTimeout) {
		return CodeTimeout
	}
	return ""
}

// IsRetryable reports whether trying again may succeed: a timeout, a
// publish failure, an unconfirmed publish (resend it under the same
// message id), or an [*Error] marked retryable; never a permission denial.
func IsRetryable(err error) bool {
	if errors.Is(err, ErrPermissionDenied) {
		return false
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Retryable
	}
	return errors.Is(err, ErrTimeout) || errors.Is(err, ErrPublish) || errors.Is(err, ErrPublishUnconfirmed)
}
