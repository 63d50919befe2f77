package subjects

import (
	"strconv"
	"strings"
)

// JetStream's own subject prefixes, restated from the server
// (server/jetstream_api.go) for the permissions that grant them. TestAPI
// checks the API subjects against the server's templates; the ack and flow
// control prefixes, which the server does not export, are checked against
// subjects in its formats.
const (
	// APIPrefix prefixes every JetStream API subject.
	APIPrefix = "$JS.API"
	// AckPrefix prefixes the subjects consumers' messages are acked on.
	AckPrefix = "$JS.ACK"
	// FlowControlPrefix prefixes push consumers' flow control subjects.
	FlowControlPrefix = "$JS.FC"
)

// API returns the JetStream API subject of the given tokens,
// "$JS.API.<token>.<token>...": API("STREAM", "INFO", stream) is the
// stream info request, API("CONSUMER", "MSG", "NEXT", stream, consumer) a
// pull request. Tokens may be wildcards, for permissions.
func API(tokens ...string) string {
	return APIPrefix + "." + strings.Join(tokens, ".")
}

// AckFilters returns the filters of the subjects consumer of stream is
// acked (and NAKed, terminated, kept in progress) on, in both formats the
// server uses: v1 "$JS.ACK.<stream>.<consumer>.<5 numbers>" (the default)
// and v2 "$JS.ACK.<domain>.<account hash>.<stream>.<consumer>.<5
// numbers>..." (feature flag js_ack_fc_v2). The v2 filter cannot match
// another consumer's v1 subject: its fifth token would be a number, not
// the stream. consumer may be "*".
func AckFilters(stream, consumer string) []string {
	return []string{
		AckPrefix + "." + stream + "." + consumer + ".>",
		AckPrefix + ".*.*." + stream + "." + consumer + ".>",
	}
}

// AckReply returns the v1 ack subject of the message at stream sequence
// seq of consumer, stated as delivered by consumer sequence delivered:
// "$JS.ACK.<stream>.<consumer>.1.<seq>.<delivered>.0.0". The server acts
// on a NAK sent there only while the message is pending (delivered and
// not acked) and delivered is past the consumer's ack floor, and reads
// neither the delivery count nor the last two numbers for a NAK without a
// delay; so whoever may ack the consumer can hand back its pending
// messages without holding their deliveries.
func AckReply(stream, consumer string, seq, delivered uint64) string {
	return AckPrefix + "." + stream + "." + consumer + ".1." + strconv.FormatUint(seq, 10) + "." + strconv.FormatUint(delivered, 10) + ".0.0"
}

// FlowControlFilters returns the filters of the flow control subjects of
// push consumers (such as a KV watch) on stream, v1 and v2 as for
// [AckFilters].
func FlowControlFilters(stream string) []string {
	return []string{
		FlowControlPrefix + "." + stream + ".>",
		FlowControlPrefix + ".*.*." + stream + ".>",
	}
}

// KVStream returns the name of the stream behind KV bucket.
func KVStream(bucket string) string { return "KV_" + bucket }

// ObjectStream returns the name of the stream behind object store bucket.
func ObjectStream(bucket string) string { return "OBJ_" + bucket }

// ObjectFilter returns the filter of the subjects object store bucket
// keeps its chunks and metadata on.
func ObjectFilter(bucket string) string { return "$O." + bucket + ".>" }

// InboxPrefix returns user's private reply-subject prefix, "_INBOX_<user>",
// for nats.CustomInboxPrefix: permissions can then grant each user its own
// replies and no one else's.
func InboxPrefix(user string) string { return "_INBOX_" + user }

// FastBatchOp is the operation token of a fast batch publish's reply
// subject ([AppendFastBatchReply]).
type FastBatchOp byte

// The fast batch operations.
const (
	FastBatchStart  FastBatchOp = '0' // the batch's first message
	FastBatchAppend FastBatchOp = '1' // a message in between
	FastBatchCommit FastBatchOp = '2' // the last message: the stream acks the batch
)

// AppendFastBatchReply appends to b the reply subject of message seq
// (from 1) of a JetStream fast batch publish (NATS 2.14+):
// "<inbox>.<flow>.fail.<seq>.<op>.$FI". The inbox's last token is the
// batch id and its subscription receives the batch's acks; flow is how
// many messages the server may take between two flow-control acks; "fail"
// is the gap mode, which ends the batch at a lost message. It appends, so
// a sender can reuse one buffer for a whole batch.
func AppendFastBatchReply(b []byte, inbox string, flow, seq int, op FastBatchOp) []byte {
	b = append(append(b, inbox...), '.')
	b = append(strconv.AppendInt(b, int64(flow), 10), ".fail."...)
	b = append(strconv.AppendInt(b, int64(seq), 10), '.', byte(op))
	return append(b, ".$FI"...)
}
