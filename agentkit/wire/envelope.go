package wire

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"
	"unicode/utf8"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/google/uuid"

	"github.com/agentmesh-io/agentmesh/internal/bound"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// Version is the envelope version agentkit writes in the "acl" field.
const Version = "1"

// DefaultMaxEnvelopeBytes is the largest encoded envelope an agent sends or
// accepts unless configured otherwise (agentkit.WithMaxEnvelopeBytes):
// 16 MiB. Envelopes above the server's max payload (1 MiB by default)
// travel through the object store; this limit bounds those too.
const DefaultMaxEnvelopeBytes = 16 << 20

// maxIDLen bounds message, correlation, workflow, task and session ids, and
// the action, status and agent types, in characters (as JSON Schema's
// maxLength counts). With control characters excluded, any of them can
// travel in a header and be quoted in a reason.
const maxIDLen = 256

// MaxTTLMillis is the largest ttl_ms accepted: about 292 years, the most a
// time.Duration holds.
const MaxTTLMillis = math.MaxInt64 / int64(time.Millisecond)

// Envelope is one ACL v1 message: the JSON object every agent sends and
// receives. Field names are snake_case on the wire; see schema/acl.schema.json
// for the same definition as JSON Schema. The envelope itself is encoded with
// JSON v2 (github.com/go-json-experiment/json, the upstream of Go's
// encoding/json/v2), which decodes in one pass; payloads are user data and
// keep encoding/json semantics ([Envelope.DecodePayload]).
type Envelope struct {
	ACL          string            `json:"acl"`                     // envelope version, "1"
	MessageID    string            `json:"message_id"`              // unique id; also the Nats-Msg-Id header
	MessageType  MessageType       `json:"message_type"`            // request, response, notification, error, ack
	Action       string            `json:"action,omitempty"`        // the verb; required on requests and notifications
	Priority     Priority          `json:"priority"`                // critical, high, normal, low, batch
	Timestamp    time.Time         `json:"timestamp"`               // creation time, RFC 3339, UTC
	TTLMillis    int64             `json:"ttl_ms,omitzero"`         // after timestamp+ttl the message is expired, never handled
	SenderID     string            `json:"sender_id"`               // must equal the subject's sender token
	SenderType   string            `json:"sender_type,omitempty"`   // planner, executor, ...
	ReceiverID   string            `json:"receiver_id,omitempty"`   // direct target; empty for topic and broadcast
	ReceiverType string            `json:"receiver_type,omitempty"` // target agent type
	Topic        string            `json:"topic,omitempty"`         // publish/subscribe topic
	Correlation  string            `json:"correlation_id,omitempty"`
	WorkflowID   string            `json:"workflow_id,omitempty"`
	TaskID       string            `json:"task_id,omitempty"`
	SessionID    string            `json:"session_id,omitempty"`
	InReplyTo    string            `json:"in_reply_to,omitempty"` // message_id this answers
	RequiresAck  bool              `json:"requires_ack,omitzero"` // the sender wants an ack envelope back
	Status       string            `json:"status,omitempty"`      // success, failed, ACK, NACK, ...
	Error        *Error            `json:"error,omitempty"`       // set on error envelopes and NACKs
	Payload      json.RawMessage   `json:"payload,omitempty"`     // the action's data
	Context      json.RawMessage   `json:"context,omitempty"`     // propagated session context
	Metadata     map[string]string `json:"metadata,omitempty"`
	Trace        *Trace            `json:"trace,omitempty"` // mirrors the W3C traceparent header
}

// Trace holds the trace ids of the message. The W3C traceparent
// header is authoritative; this copy is for readers that only see the body.
type Trace struct {
	TraceID    string `json:"trace_id,omitempty"`
	SpanID     string `json:"span_id,omitempty"`
	ParentSpan string `json:"parent_span,omitempty"`
}

// NewMessageID returns a new random (v4) UUID string.
func NewMessageID() string { return uuid.NewString() }

// NewEnvelope returns a valid-to-fill envelope of type t with a new message
// id, the current time and [PriorityNormal].
func NewEnvelope(t MessageType, sender, action string) *Envelope {
	return &Envelope{
		ACL:         Version,
		MessageID:   NewMessageID(),
		MessageType: t,
		Action:      action,
		Priority:    PriorityNormal,
		Timestamp:   time.Now().UTC(),
		SenderID:    sender,
	}
}

// NewCorrelationID returns a correlation id in the format
// "<session>_<hash8>_<unix seconds>", where hash8 is the first 8 hex digits
// of the SHA-256 of query. Any unique string is accepted as a correlation
// id; this helper only makes ids that group a session's queries readably.
func NewCorrelationID(session, query string, at time.Time) string {
	sum := sha256.Sum256([]byte(query))
	return fmt.Sprintf("%s_%s_%d", session, hex.EncodeToString(sum[:4]), at.Unix())
}

// Expired reports whether e carries a ttl_ms that has passed at now.
func (e *Envelope) Expired(now time.Time) bool {
	return e.TTLMillis > 0 && now.After(e.Timestamp.Add(time.Duration(e.TTLMillis)*time.Millisecond))
}

// Validate checks every field agentkit relies on. The error is a
// [*ValidationError] naming the field, matched by errors.Is(err, [ErrInvalidEnvelope]).
func (e *Envelope) Validate() error {
	switch {
	case e.ACL != Version:
		return invalid("acl", fmt.Sprintf("unsupported version %s (want %q)", bound.Quote(e.ACL), Version))
	}
	if err := ValidateMessageID(e.MessageID); err != nil {
		return err
	}
	switch {
	case !e.MessageType.Valid():
		return invalid("message_type", "unknown type "+bound.Quote(string(e.MessageType)))
	case !e.Priority.Valid():
		return invalid("priority", "unknown priority "+bound.Quote(string(e.Priority)))
	case e.Timestamp.IsZero():
		return invalid("timestamp", "required")
	case e.TTLMillis < 0:
		return invalid("ttl_ms", "must not be negative")
	case e.TTLMillis > MaxTTLMillis:
		return invalid("ttl_ms", fmt.Sprintf("must be at most %d", int64(MaxTTLMillis)))
	}
	if err := subjects.ValidateToken("sender_id", e.SenderID); err != nil {
		return invalid("sender_id", err.Error())
	}
	if e.ReceiverID != "" {
		if err := subjects.ValidateToken("receiver_id", e.ReceiverID); err != nil {
			return invalid("receiver_id", err.Error())
		}
	}
	if e.Topic != "" {
		if err := subjects.ValidateToken("topic", e.Topic); err != nil {
			return invalid("topic", err.Error())
		}
	}
	for _, f := range [...]struct{ name, v string }{{"action", e.Action}, {"status", e.Status},
		{"sender_type", e.SenderType}, {"receiver_type", e.ReceiverType}, {"correlation_id", e.Correlation},
		{"workflow_id", e.WorkflowID}, {"task_id", e.TaskID}, {"session_id", e.SessionID}, {"in_reply_to", e.InReplyTo}} {
		if err := checkShort(f.name, f.v); err != nil {
			return err
		}
	}
	switch e.MessageType {
	case TypeRequest, TypeNotification:
		if e.Action == "" {
			return invalid("action", "required on "+string(e.MessageType)+" messages")
		}
	case TypeResponse, TypeAck:
		if e.InReplyTo == "" {
			return invalid("in_reply_to", "required on "+string(e.MessageType)+" messages")
		}
	case TypeError:
		if e.Error == nil {
			return invalid("error", "required on error messages")
		}
	}
	if e.Error != nil && !e.Error.Code.Valid() {
		return invalid("error.code", "unknown code "+bound.Quote(string(e.Error.Code)))
	}
	return nil
}

// ValidateMessageID checks a message_id, which is also the Nats-Msg-Id
// header and the name of a large envelope's object in the payload store:
// at most 256 characters, no whitespace or control characters. The error
// is a [*ValidationError] on message_id.
func ValidateMessageID(id string) error {
	switch {
	case id == "":
		return invalid("message_id", "required")
	case utf8.RuneCountInString(id) > maxIDLen || strings.ContainsAny(id, " \t\r\n") || bound.HasControl(id):
		return invalid("message_id", "must be at most 256 characters without whitespace or control characters")
	}
	return nil
}

// ValidateAction checks an action name as [Envelope.Validate] does: at
// most 256 characters, no control characters. The error is a
// [*ValidationError] on action.
func ValidateAction(action string) error { return checkShort("action", action) }

// checkShort checks a short text field (an id, the action, a status or an
// agent type): at most maxIDLen characters, no control characters.
func checkShort(field, v string) error {
	if utf8.RuneCountInString(v) > maxIDLen {
		return invalid(field, "longer than 256 characters")
	}
	if bound.HasControl(v) {
		return invalid(field, "contains a control character")
	}
	return nil
}

// Encode validates e and returns its JSON encoding, with map keys sorted so
// the same envelope always encodes to the same bytes.
func (e *Envelope) Encode() ([]byte, error) {
	if err := e.Validate(); err != nil {
		return nil, err
	}
	b, err := e.AppendJSON(nil)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidEnvelope, err)
	}
	return b, nil
}

// Decode parses and validates one JSON envelope. Unknown fields are
// rejected (as the JSON Schema's additionalProperties: false does), and so
// are duplicate fields and invalid UTF-8 (which JSON Schema cannot express).
// Errors match errors.Is(err, [ErrInvalidEnvelope]); a field that fails is
// named by a [*ValidationError].
func Decode(data []byte) (*Envelope, error) {
	var e Envelope
	if err := jsonv2.Unmarshal(data, &e, jsonv2.RejectUnknownMembers(true)); err != nil {
		var ve *ValidationError
		if errors.As(err, &ve) {
			return nil, ve
		}
		return nil, fmt.Errorf("%w: not a JSON envelope: %w", ErrInvalidEnvelope, err)
	}
	if err := e.Validate(); err != nil {
		return nil, err
	}
	return &e, nil
}

// DecodePayload unmarshals the payload into v.
func (e *Envelope) DecodePayload(v any) error {
	if len(e.Payload) == 0 {
		return fmt.Errorf("%w: payload: empty", ErrInvalidEnvelope)
	}
	if err := json.Unmarshal(e.Payload, v); err != nil {
		return fmt.Errorf("%w: payload: %w", ErrInvalidEnvelope, err)
	}
	return nil
}

// reply returns a new envelope from e's receiver (self) back to e's sender,
// carrying e's conversation ids and in_reply_to = e.MessageID.
func (e *Envelope) reply(self string, t MessageType, action string) *Envelope {
	r := NewEnvelope(t, self, action)
	r.Priority = e.Priority
	r.ReceiverID = e.SenderID
	r.ReceiverType = e.SenderType
	r.InReplyTo = e.MessageID
	if origin := e.Metadata[MetaOriginSender]; origin != "" {
		// A forwarded message: answer whoever sent the original.
		r.ReceiverID, r.ReceiverType, r.InReplyTo = origin, "", e.Metadata[MetaOriginMessageID]
	}
	r.Correlation = e.Correlation
	if r.Correlation == "" {
		r.Correlation = e.MessageID
	}
	r.WorkflowID = e.WorkflowID
	r.TaskID = e.TaskID
	r.SessionID = e.SessionID
	r.Context = e.Context
	return r
}

// NewResponse returns a response to e from self with status success and the
// given action and payload (already encoded JSON, may be nil).
func (e *Envelope) NewResponse(self, action string, payload json.RawMessage) *Envelope {
	r := e.reply(self, TypeResponse, action)
	r.Status = StatusSuccess
	r.Payload = payload
	return r
}

// NewErrorReply returns an error envelope answering e from self, with
// status rejected when err is not retryable, else failed. A nil err is
// reported as INTERNAL.
func (e *Envelope) NewErrorReply(self string, err *Error) *Envelope {
	if err == nil {
		err = NewError(CodeInternal, "unspecified error")
	}
	r := e.reply(self, TypeError, e.Action)
	r.Status = StatusFailed
	if !err.Retryable {
		r.Status = StatusRejected
	}
	r.Error = err
	return r
}

// NewAck returns the ack envelope answering e from self: status ACK when
// nack is nil, else NACK carrying nack as the reason. processing is the
// time the receiver spent on e; it travels as metadata
// [MetaProcessingTime].
func (e *Envelope) NewAck(self string, nack *Error, processing time.Duration) *Envelope {
	r := e.reply(self, TypeAck, e.Action)
	r.Status = StatusACK
	if nack != nil {
		r.Status = StatusNACK
		r.Error = nack
	}
	r.Metadata = map[string]string{MetaProcessingTime: fmt.Sprint(processing.Milliseconds())}
	return r
}
