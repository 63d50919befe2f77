package wire

import (
	"errors"
	"fmt"
	"time"
)

// ErrInvalidEnvelope matches every error of an envelope or payload that
// fails to decode or validate; [*ValidationError] names the field. The
// text keeps the "agentkit:" prefix the runtime's errors share.
var ErrInvalidEnvelope = errors.New("agentkit: invalid envelope")

// ValidationError names the envelope field that failed validation.
type ValidationError struct {
	Field  string // the JSON name, dotted for nested fields: "error.code", "payload.task_id"
	Reason string
}

func (e *ValidationError) Error() string {
	return fmt.Sprintf("agentkit: invalid envelope: %s: %s", e.Field, e.Reason)
}

// Is reports whether target is [ErrInvalidEnvelope].
func (e *ValidationError) Is(target error) bool { return target == ErrInvalidEnvelope }

// invalid returns the error of field failing validation for reason.
func invalid(field, reason string) error { return &ValidationError{Field: field, Reason: reason} }

// Error is the error object of the ACL envelope. It is also the Go error
// the runtime returns (agentkit's Agent.Request and Agent.SendAndWait) when
// the receiver answered with an error or a NACK, marked by [Error.AsRemote].
// Use errors.As to read the code.
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

// AsRemote returns a copy of e marked as sent back by another agent: its
// text says "remote" and [IsRemote] reports true. The mark is not encoded;
// the runtime sets it on the error of every error reply and NACK it hands
// to a caller.
func (e *Error) AsRemote() *Error {
	r := *e
	r.remote = true
	return &r
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
