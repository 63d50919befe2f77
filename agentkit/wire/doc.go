// Package wire is agentmesh's wire format: the ACL v1 envelope every agent
// sends and receives over NATS JetStream, its JSON codec and its rules.
//
// It owns what any reader of a message needs, without the agent runtime
// (package agentkit) or a NATS connection: the ack monitor, the trace and
// dead-letter tools and the JSON Schema's tests import it alone.
//
//   - [Envelope] and [Trace], built with [NewEnvelope] and answered with
//     [Envelope.NewResponse], [Envelope.NewErrorReply] and [Envelope.NewAck];
//     ids from [NewMessageID] and [NewCorrelationID].
//   - The codec: [Envelope.Encode] and [Envelope.AppendJSON] write
//     deterministic JSON; [Decode] parses strictly (unknown and duplicate
//     members, invalid UTF-8 are refused) and validates; [Envelope.Validate]
//     enforces the field bounds: ids, the action, the status and agent
//     types at most 256 characters without control characters, ttl_ms at
//     most [MaxTTLMillis], subject-safe sender, receiver and topic.
//   - The closed enums [Priority], [MessageType] and [ErrorCode] (whose
//     [ErrorCode.Retryable] says whether a retry can help) and the status
//     values the runtime writes.
//   - The error object [Error] and the validation errors: every failure to
//     decode or validate matches [ErrInvalidEnvelope], and a
//     [*ValidationError] names the field.
//   - The NATS headers mirrored from the envelope ([HeaderMsgID], ...,
//     [HeaderEnvelopeRef]) and the metadata keys the runtime writes.
//
// schema/acl.schema.json defines the same envelope as JSON Schema; the
// schema package's tests keep the two in agreement.
package wire
