package wire

import (
	"slices"

	"github.com/agentmesh-io/agentmesh/internal/bound"
)

// Priority is a message's urgency. It selects the subject, the consumer, the
// delivery policy (ack timeout, retries, backoff) and the order in which an
// agent handles its backlog. The set is closed; "medium" is accepted on input
// as [PriorityNormal].
type Priority string

// The five priority levels, highest first.
const (
	PriorityCritical Priority = "critical" // handled ahead of everything, on its own worker
	PriorityHigh     Priority = "high"
	PriorityNormal   Priority = "normal" // the default
	PriorityLow      Priority = "low"
	PriorityBatch    Priority = "batch" // handled only when nothing else waits
)

// Priorities lists every priority, highest first.
var Priorities = []Priority{PriorityCritical, PriorityHigh, PriorityNormal, PriorityLow, PriorityBatch}

// ParsePriority parses s, accepting "medium" as [PriorityNormal].
func ParsePriority(s string) (Priority, error) {
	switch p := Priority(s); p {
	case PriorityCritical, PriorityHigh, PriorityNormal, PriorityLow, PriorityBatch:
		return p, nil
	case "medium":
		return PriorityNormal, nil
	}
	return "", invalid("priority", "unknown priority "+bound.Quote(s)+" (want critical, high, normal, low or batch)")
}

// Valid reports whether p is one of [Priorities].
func (p Priority) Valid() bool { return slices.Contains(Priorities, p) }

// String returns the wire spelling.
func (p Priority) String() string { return string(p) }

// MarshalText implements encoding.TextMarshaler; it rejects invalid values.
func (p Priority) MarshalText() ([]byte, error) {
	if !p.Valid() {
		return nil, invalid("priority", "unknown priority "+bound.Quote(string(p)))
	}
	return []byte(p), nil
}

// UnmarshalText implements encoding.TextUnmarshaler via [ParsePriority].
func (p *Priority) UnmarshalText(b []byte) error {
	v, err := ParsePriority(string(b))
	if err != nil {
		return err
	}
	*p = v
	return nil
}

// MessageType says what role a message plays in a conversation.
type MessageType string

// The message types of the ACL.
const (
	TypeRequest      MessageType = "request"      // asks the receiver to act; may expect a response
	TypeResponse     MessageType = "response"     // answers a request (in_reply_to is set)
	TypeNotification MessageType = "notification" // informs; no response expected
	TypeError        MessageType = "error"        // reports a failure (error is set)
	TypeAck          MessageType = "ack"          // ACK or NACK of a message that asked for one
)

var messageTypes = []MessageType{TypeRequest, TypeResponse, TypeNotification, TypeError, TypeAck}

// Valid reports whether t is a known message type.
func (t MessageType) Valid() bool { return slices.Contains(messageTypes, t) }

// MarshalText implements encoding.TextMarshaler; it rejects invalid values.
func (t MessageType) MarshalText() ([]byte, error) {
	if !t.Valid() {
		return nil, invalid("message_type", "unknown type "+bound.Quote(string(t)))
	}
	return []byte(t), nil
}

// UnmarshalText implements encoding.TextUnmarshaler; it rejects unknown types.
func (t *MessageType) UnmarshalText(b []byte) error {
	v := MessageType(b)
	if !v.Valid() {
		return invalid("message_type", "unknown type "+bound.Quote(string(b))+" (want request, response, notification, error or ack)")
	}
	*t = v
	return nil
}

// ErrorCode is the closed set of error categories carried in [Error]. Each
// code says once whether retrying can help ([ErrorCode.Retryable]).
type ErrorCode string

// The error codes.
const (
	CodeTimeout           ErrorCode = "TIMEOUT"            // the receiver did not answer in time
	CodeUnavailable       ErrorCode = "UNAVAILABLE"        // the receiver is offline or its breaker is open
	CodeBusy              ErrorCode = "BUSY"               // the receiver is overloaded; retry later
	CodeRateLimit         ErrorCode = "RATE_LIMIT"         // too many requests; retry later
	CodeInvalid           ErrorCode = "INVALID"            // the request is malformed or semantically wrong
	CodeRejected          ErrorCode = "REJECTED"           // the receiver refused the request
	CodeCapabilityMissing ErrorCode = "CAPABILITY_MISSING" // the receiver has no handler for the action
	CodeNotFound          ErrorCode = "NOT_FOUND"          // a referenced entity does not exist
	CodeExpired           ErrorCode = "EXPIRED"            // the message's ttl_ms passed before it was handled
	CodeInternal          ErrorCode = "INTERNAL"           // the receiver failed unexpectedly
)

var retryable = map[ErrorCode]bool{
	CodeTimeout:           true,
	CodeUnavailable:       true,
	CodeBusy:              true,
	CodeRateLimit:         true,
	CodeInvalid:           false,
	CodeRejected:          false,
	CodeCapabilityMissing: false,
	CodeNotFound:          false,
	CodeExpired:           false,
	CodeInternal:          true,
}

// ErrorCodes lists every error code.
var ErrorCodes = []ErrorCode{CodeTimeout, CodeUnavailable, CodeBusy, CodeRateLimit, CodeInvalid,
	CodeRejected, CodeCapabilityMissing, CodeNotFound, CodeExpired, CodeInternal}

// Valid reports whether c is a known code.
func (c ErrorCode) Valid() bool { _, ok := retryable[c]; return ok }

// Retryable reports whether sending the same message again may succeed.
// INTERNAL counts as retryable: a crash may be transient.
func (c ErrorCode) Retryable() bool { return retryable[c] }

// MarshalText implements encoding.TextMarshaler; it rejects invalid values.
func (c ErrorCode) MarshalText() ([]byte, error) {
	if !c.Valid() {
		return nil, invalid("error.code", "unknown code "+bound.Quote(string(c)))
	}
	return []byte(c), nil
}

// UnmarshalText implements encoding.TextUnmarshaler; it rejects unknown codes.
func (c *ErrorCode) UnmarshalText(b []byte) error {
	v := ErrorCode(b)
	if !v.Valid() {
		return invalid("error.code", "unknown code "+bound.Quote(string(b)))
	}
	*c = v
	return nil
}

// Status values used on responses and acks. Status is an open string on the
// wire; these are the values agentkit itself writes.
const (
	StatusSuccess  = "success"
	StatusFailed   = "failed"
	StatusAccepted = "accepted"
	StatusRejected = "rejected"
	StatusACK      = "ACK"
	StatusNACK     = "NACK"
)
