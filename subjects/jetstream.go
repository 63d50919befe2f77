package subjects

import "strings"

// JetStream's own subject prefixes, restated from the server
// (server/jetstream_api.go) for the permissions that grant them; a test
// asserts they equal the server's.
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
