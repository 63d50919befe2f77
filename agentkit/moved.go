// Temporary: removed once the callers outside agentkit import wire and protocol directly.

package agentkit

import (
	"github.com/agentmesh-io/agentmesh/agentkit/protocol"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
)

// The aliases below keep agentkit.<Name> compiling for callers outside
// agentkit while they move to the wire format (package wire) and the
// payload catalogue (package protocol). Each is the name documented there.

type Envelope = wire.Envelope
type Error = wire.Error
type Escalation = protocol.Escalation
type MessageType = wire.MessageType
type Priority = wire.Priority

const (
	ActionEscalation  = protocol.ActionEscalation
	CodeInvalid       = wire.CodeInvalid
	CodeNotFound      = wire.CodeNotFound
	CodeRejected      = wire.CodeRejected
	HeaderAction      = wire.HeaderAction
	HeaderCorrelation = wire.HeaderCorrelation
	HeaderEnvelopeRef = wire.HeaderEnvelopeRef
	HeaderInReplyTo   = wire.HeaderInReplyTo
	HeaderMsgID       = wire.HeaderMsgID
	HeaderStatus      = wire.HeaderStatus
	HeaderTaskID      = wire.HeaderTaskID
	HeaderType        = wire.HeaderType
	HeaderWorkflow    = wire.HeaderWorkflow
	MaxTTLMillis      = wire.MaxTTLMillis
	PriorityCritical  = wire.PriorityCritical
	PriorityHigh      = wire.PriorityHigh
	PriorityLow       = wire.PriorityLow
	PriorityNormal    = wire.PriorityNormal
	StatusSuccess     = wire.StatusSuccess
	TypeNotification  = wire.TypeNotification
	TypeRequest       = wire.TypeRequest
	TypeResponse      = wire.TypeResponse
)

var (
	Decode             = wire.Decode
	ErrInvalidEnvelope = wire.ErrInvalidEnvelope
	NewCorrelationID   = wire.NewCorrelationID
	NewEnvelope        = wire.NewEnvelope
	ParsePriority      = wire.ParsePriority
	Priorities         = wire.Priorities
)
