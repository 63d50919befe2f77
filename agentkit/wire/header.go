package wire

import (
	"strconv"
	"strings"
)

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

// Mirrored reports whether a message's headers h (a nats.Header) mirror
// its envelope. Every sender that mirrors sends [HeaderType], and then a
// missing Mesh-* header is an empty member; without it the headers say
// nothing of the envelope, which only the body tells (a sender that
// mirrors no header loses speed, never data).
func Mirrored(h map[string][]string) bool {
	_, ok := h[HeaderType]
	return ok
}

// HeaderEnvelopeRef names the Object Store object holding the full
// envelope of a message too large for the server's max payload (claim
// check). The message itself carries a stub envelope with the same ids,
// and the object is named after its message_id, so the ref equals
// [HeaderMsgID], or the message id a replay id ([ReplayID]) was made from.
const HeaderEnvelopeRef = "Mesh-Envelope-Ref"

// replayInfix joins a message id and a dead letter's sequence in a
// replay's message id.
const replayInfix = ":replay:"

// ReplayID is the Nats-Msg-Id of a dead letter's replay: the original's
// message id and the letter's sequence in the dead-letter stream, so the
// stream stores one replay of a letter within its duplicate window but
// takes every letter of one message.
func ReplayID(messageID string, letterSeq uint64) string {
	return messageID + replayInfix + strconv.FormatUint(letterSeq, 10)
}

// ReplayOf returns the message id that msgID, a replay's Nats-Msg-Id, was
// made from by [ReplayID] (once or, for a replay replayed again, more
// often), and false when msgID is no replay id.
func ReplayOf(msgID string) (string, bool) {
	orig, replayed := msgID, false
	for {
		i := strings.LastIndex(orig, replayInfix)
		if i <= 0 || !digits(orig[i+len(replayInfix):]) {
			return orig, replayed
		}
		orig, replayed = orig[:i], true
	}
}

// digits reports whether s is a non-empty run of ASCII digits.
func digits(s string) bool {
	return s != "" && strings.Trim(s, "0123456789") == ""
}

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
