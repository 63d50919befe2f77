package wire

// Headers mirrored from the envelope so the ack monitor and operators can
// read them without decoding the body. Senders set them from the envelope's
// fields, which validation bounds, so every value fits a header line.
const (
	// HeaderMsgID carries message_id. It is NATS JetStream's Nats-Msg-Id
	// (jetstream.MsgIDHeader), so the stream deduplicates on it.
	HeaderMsgID       = "Nats-Msg-Id"
	HeaderType        = "Mesh-Type"   // message_type
	HeaderAction      = "Mesh-Action" // action
	HeaderCorrelation = "Mesh-Correlation-Id"
	HeaderWorkflow    = "Mesh-Workflow-Id"
	HeaderInReplyTo   = "Mesh-In-Reply-To"
	// HeaderTaskID carries task_id; receivers handle the messages of one task
	// in stream order by it (senders in other languages must set it too).
	HeaderTaskID = "Mesh-Task-Id"
	HeaderStatus = "Mesh-Status" // the envelope's status, on replies
)

// HeaderEnvelopeRef names the Object Store object holding the full
// envelope of a message too large for the server's max payload (claim
// check). The message itself carries a stub envelope with the same ids,
// and the object is named after its message_id, so the ref always equals
// [HeaderMsgID].
const HeaderEnvelopeRef = "Mesh-Envelope-Ref"

// Metadata keys of forwarded messages. A message forwarded by a reroute or
// a fallback keeps the original sender and message id here, so the agent
// that finally handles it replies to the original sender, in reply to the
// original message ([Envelope.NewResponse] and the other replies follow
// them): a request waiting there gets its answer.
const (
	MetaOriginSender    = "origin_sender"
	MetaOriginMessageID = "origin_message_id"
	MetaHandoffFrom     = "handoff_from"   // the agent the message was meant for, or that passed it on
	MetaHandoffReason   = "handoff_reason" // why: "circuit open", "reroute"
)

// MetaProcessingTime is the metadata key of an ack envelope
// ([Envelope.NewAck]) holding the milliseconds the receiver spent on the
// message, in decimal.
const MetaProcessingTime = "processing_time_ms"
