package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/auth"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// The agents of TestHostilePeers: three that handle work (planner also
// consumes topic "news"), one well-behaved sender, and mallory, an agent
// with valid credentials of its own that sends whatever its permissions
// let it send.
const (
	hostileSender = "mallory"
	goodSender    = "alice"
	newsTopic     = "news"
	// hostileMaxEnvelope is the receivers' envelope limit (WithMaxEnvelopeBytes).
	hostileMaxEnvelope = 256 << 10
)

var hostileVictims = []string{"planner", "executor", "validator"}

// hostilePolicy is every priority's delivery policy: short ack timeouts,
// so a message the runtime leaves unsettled is redelivered, and exhausted,
// within the test's budget.
func hostilePolicy() agentkit.DeliveryPolicy {
	return agentkit.DeliveryPolicy{BackOff: []time.Duration{4 * time.Second, 8 * time.Second}, MaxDeliver: 2,
		ProcessingLimit: 30 * time.Second, Prefetch: 1, MaxPrefetch: 512, MaxAckPending: 1000}
}

// Outcomes of a hostile message. At publish: refused (by permissions, the
// stream or the client), deduplicated (not stored), unrouted (stored, but
// no agent's consumer takes it). Per delivery to an agent's consumer:
// invalid (TERM "INVALID: ..."), term (another TERM), handled (acked after
// the handler ran), acked (acked unhandled: expired, late reply, ...),
// exhausted (MAX_DELIVERIES), pending (no terminal event).
const (
	outRefused   = "refused"
	outDedup     = "deduplicated"
	outUnrouted  = "unrouted"
	outInvalid   = "invalid"
	outTerm      = "term"
	outHandled   = "handled"
	outAcked     = "acked"
	outExhausted = "exhausted"
	outPending   = "pending"
)

// hostileCase is one hostile message.
type hostileCase struct {
	category, name string
	kind           subjects.Kind // direct (default), broadcast or topic
	to             string        // receiver of a direct message (default: by position)
	prio           wire.Priority // default: by position, among critical, high, normal
	subject        string        // a raw subject instead of the one kind, to and prio make
	env            func(e map[string]any)
	body           func(c *hostileCase, base []byte) []byte
	header         func(c *hostileCase, h nats.Header, ml *hostileMallory)
	setup          func(ctx context.Context, c *hostileCase, ml *hostileMallory) error
	want           []string

	// set while the corpus is sent
	id       string // the base envelope's message_id
	base     []byte // the base envelope, with env applied
	subj     string
	bodySize int
	seq      uint64
	publish  string // "stored", outDedup or "refused: <why>"
	expected []hostileDelivery
}

// hostileMallory is the hostile agent: a raw nats.go client holding only
// its own credentials.
type hostileMallory struct {
	nc     *nats.Conn
	w      *auth.Watcher
	js     jetstream.JetStream
	obs    jetstream.ObjectStore
	lastID string // Nats-Msg-Id of the last stored hostile message
	goodID string // message_id of the last good message sent
}

// publish stores msg in the stream, or says why not.
func (ml *hostileMallory) publish(ctx context.Context, msg *nats.Msg) (*jetstream.PubAck, string) {
	var ack *jetstream.PubAck
	err := ml.w.Guard(ctx, func(ctx context.Context) error {
		var err error
		ack, err = ml.js.PublishMsg(ctx, msg)
		return err
	})
	if err != nil {
		return nil, publishRefusal(err)
	}
	return ack, ""
}

// publishMeta writes raw object metadata for name in the payload store.
func (ml *hostileMallory) publishMeta(ctx context.Context, name string, data []byte) error {
	msg := nats.NewMsg("$O." + subjects.Default.PayloadsBucket() + ".M." + base64.URLEncoding.EncodeToString([]byte(name)))
	msg.Header.Set(jetstream.MsgRollup, jetstream.MsgRollupSubject)
	msg.Data = data
	_, err := ml.js.PublishMsg(ctx, msg)
	return err
}

// addRaw returns the JSON object base with member key set to raw JSON
// (appended: a key base already holds is then duplicated).
func addRaw(base []byte, key, raw string) []byte {
	b := bytes.TrimRight(base, " \n")
	out := slices.Clone(b[:len(b)-1])
	out = append(out, `,"`+key+`":`+raw+`}`...)
	return out
}

// setRaw replaces the string value of member key in base by raw bytes
// placed inside the quotes (which may be invalid UTF-8).
func setRaw(base []byte, key, raw string) []byte {
	var m map[string]any
	if err := json.Unmarshal(base, &m); err != nil {
		panic(err)
	}
	old, _ := json.Marshal(m[key])
	return bytes.Replace(base, []byte(`"`+key+`":`+string(old)), []byte(`"`+key+`":"`+raw+`"`), 1)
}

// objectEnvelope returns the base envelope of c with mutate applied and a
// payload of n bytes, as stored in the payload store.
func objectEnvelope(c *hostileCase, n int, mutate func(map[string]any)) []byte {
	var m map[string]any
	if err := json.Unmarshal(c.base, &m); err != nil {
		panic(err)
	}
	if n > 0 {
		m["payload"] = map[string]string{"blob": strings.Repeat("x", n)}
	}
	if mutate != nil {
		mutate(m)
	}
	b, err := json.Marshal(m)
	if err != nil {
		panic(err)
	}
	return b
}

// refHeader marks c as a large envelope stored under its message_id.
func refHeader(c *hostileCase, h nats.Header, _ *hostileMallory) {
	h.Set(wire.HeaderEnvelopeRef, c.id)
}

func withHeader(key, value string) func(*hostileCase, nats.Header, *hostileMallory) {
	return func(_ *hostileCase, h nats.Header, _ *hostileMallory) { h.Set(key, value) }
}

func setField(key string, v any) func(map[string]any) {
	return func(e map[string]any) { e[key] = v }
}

func deepArrays(n int) string    { return strings.Repeat("[", n) + strings.Repeat("]", n) }
func deepObjects(n int) string   { return strings.Repeat(`{"a":`, n) + "1" + strings.Repeat("}", n) }
func big(n int, c string) string { return strings.Repeat(c, n) }

// hostileCorpus is what mallory sends. want lists the acceptable
// outcomes: invalid wherever the message is not a valid envelope for the
// receiver; a valid envelope with hostile headers the runtime does not
// use may also be handled.
func hostileCorpus() []hostileCase {
	inv := []string{outInvalid}
	invOrHandled := []string{outInvalid, outHandled}
	refused := []string{outRefused}
	unrouted := []string{outUnrouted}
	ref3100 := big(3100, "r")
	var cs []hostileCase
	add := func(c ...hostileCase) { cs = append(cs, c...) }

	// Headers the receiver's nats.go client interprets: a stored message
	// must never pass for a status message of the server, nor pin the
	// receiver's pulls. First, so that the pulls renew while the rest
	// is sent; to validator at low and batch (executor at low for a
	// valid body), where nothing else of the corpus goes.
	add(
		hostileCase{category: "client library", name: "Nats-Pin-Id on a valid request", to: "validator", prio: wire.PriorityLow,
			header: withHeader("Nats-Pin-Id", "forged-pin"), want: invOrHandled},
		// Empty bodies with a Status header, which nats.go takes for the
		// server's status messages, are left to
		// agentkit's TestHostileInput_ForgedStatusMessages: they never
		// reach the runtime, and some end the receiver's iterator, which
		// costs the messages in flight an attempt.
		hostileCase{category: "client library", name: "valid request with Status 409 headers", to: "executor", prio: wire.PriorityLow,
			header: func(_ *hostileCase, h nats.Header, _ *hostileMallory) {
				h.Set("Status", "409")
				h.Set("Description", "Consumer Deleted")
			}, want: invOrHandled},
	)

	// Oversize values on every Mesh-* header, and on the other headers the
	// receive path reads (Nats-Msg-Id, traceparent).
	add(
		hostileCase{category: "header: oversize", name: "Mesh-Envelope-Ref of 3,100 chars", header: withHeader(wire.HeaderEnvelopeRef, ref3100), want: inv},
		hostileCase{category: "header: oversize", name: "Mesh-Envelope-Ref of 3,100 chars = Nats-Msg-Id = message_id",
			env: setField("message_id", ref3100), header: func(_ *hostileCase, h nats.Header, _ *hostileMallory) {
				h.Set(wire.HeaderEnvelopeRef, ref3100)
				h.Set(wire.HeaderMsgID, ref3100)
			}, want: inv},
		hostileCase{category: "header: oversize", name: "Mesh-Envelope-Ref of 60 KB", header: withHeader(wire.HeaderEnvelopeRef, big(60<<10, "r")), want: inv},
		hostileCase{category: "header: oversize", name: "Mesh-Envelope-Ref of 3,100 chars on a reply (read by the reader)",
			header: func(_ *hostileCase, h nats.Header, _ *hostileMallory) {
				h.Set(wire.HeaderEnvelopeRef, ref3100)
				h.Set(wire.HeaderInReplyTo, "m1")
			}, want: inv},
		hostileCase{category: "header: oversize", name: "Mesh-Task-Id of 60 KB", env: setField("task_id", "t1"), header: withHeader(wire.HeaderTaskID, big(60<<10, "t")), want: inv},
		hostileCase{category: "header: oversize", name: "Mesh-In-Reply-To of 60 KB", header: withHeader(wire.HeaderInReplyTo, big(60<<10, "i")), want: invOrHandled},
		hostileCase{category: "header: oversize", name: "Mesh-Type of 60 KB", header: withHeader(wire.HeaderType, big(60<<10, "y")), want: invOrHandled},
		hostileCase{category: "header: oversize", name: "Mesh-Action of 60 KB", header: withHeader(wire.HeaderAction, big(60<<10, "a")), want: invOrHandled},
		hostileCase{category: "header: oversize", name: "Mesh-Correlation-Id of 60 KB", header: withHeader(wire.HeaderCorrelation, big(60<<10, "c")), want: invOrHandled},
		hostileCase{category: "header: oversize", name: "Mesh-Workflow-Id of 60 KB", header: withHeader(wire.HeaderWorkflow, big(60<<10, "w")), want: invOrHandled},
		hostileCase{category: "header: oversize", name: "Mesh-Status of 60 KB", header: withHeader(wire.HeaderStatus, big(60<<10, "s")), want: invOrHandled},
		hostileCase{category: "header: oversize", name: "Nats-Msg-Id of 60 KB", header: withHeader(wire.HeaderMsgID, big(60<<10, "n")), want: invOrHandled},
		hostileCase{category: "header: oversize", name: "traceparent of 60 KB", header: withHeader("traceparent", "00-"+big(60<<10, "f")), want: invOrHandled},
		hostileCase{category: "header: oversize", name: "every Mesh-* header at 6 KB", env: setField("task_id", "t1"),
			header: func(_ *hostileCase, h nats.Header, _ *hostileMallory) {
				for _, k := range []string{wire.HeaderType, wire.HeaderAction, wire.HeaderCorrelation, wire.HeaderWorkflow,
					wire.HeaderInReplyTo, wire.HeaderTaskID, wire.HeaderStatus, wire.HeaderEnvelopeRef} {
					h.Set(k, big(6<<10, "h"))
				}
			}, want: inv},
		hostileCase{category: "header: oversize", name: "2,000 header fields", header: func(_ *hostileCase, h nats.Header, _ *hostileMallory) {
			for i := range 2000 {
				h.Set(fmt.Sprintf("X-Junk-%d", i), "v")
			}
		}, want: invOrHandled},
		hostileCase{category: "header: oversize", name: "Mesh-Task-Id of 70 KB (above JetStream's 64 KB header limit)",
			env: setField("task_id", "t1"), header: withHeader(wire.HeaderTaskID, big(70<<10, "t")), want: refused},
	)
	// Headers with invalid UTF-8, control characters or another case.
	add(
		hostileCase{category: "header: encoding", name: "Mesh-Task-Id invalid UTF-8", env: setField("task_id", "t1"), header: withHeader(wire.HeaderTaskID, "t\xff\xfe1"), want: inv},
		hostileCase{category: "header: encoding", name: "Mesh-Envelope-Ref invalid UTF-8", header: withHeader(wire.HeaderEnvelopeRef, "\xff\xfe"), want: inv},
		hostileCase{category: "header: encoding", name: "Mesh-In-Reply-To invalid UTF-8", header: withHeader(wire.HeaderInReplyTo, "\xc3\x28"), want: invOrHandled},
		hostileCase{category: "header: encoding", name: "traceparent invalid UTF-8", header: withHeader("traceparent", "00-\xff\xfe-\xff-01"), want: invOrHandled},
		hostileCase{category: "header: encoding", name: "Mesh-Task-Id with CR LF (header injection)", env: setField("task_id", "t1"),
			header: withHeader(wire.HeaderTaskID, "t1\r\nNats-Msg-Id: forged"), want: inv},
		hostileCase{category: "header: encoding", name: "Mesh-Task-Id with NUL", env: setField("task_id", "t1"), header: withHeader(wire.HeaderTaskID, "t1\x00"), want: inv},
		hostileCase{category: "header: encoding", name: "mesh-envelope-ref in lower case, 3,100 chars", header: withHeader("mesh-envelope-ref", ref3100), want: invOrHandled},
	)
	// Oversize fields in the body.
	add(
		hostileCase{category: "body: oversize", name: "action of 100 KB", env: setField("action", big(100<<10, "a")), want: inv},
		hostileCase{category: "body: oversize", name: "message_id of 3,100 chars (= Nats-Msg-Id)", env: setField("message_id", big(3100, "m")),
			header: withHeader(wire.HeaderMsgID, big(3100, "m")), want: inv},
		hostileCase{category: "body: oversize", name: "message_id of 100 KB, no Nats-Msg-Id", env: setField("message_id", big(100<<10, "m")),
			header: func(_ *hostileCase, h nats.Header, _ *hostileMallory) { h.Del(wire.HeaderMsgID) }, want: inv},
	)
	for _, f := range []string{"correlation_id", "workflow_id", "task_id", "session_id", "in_reply_to", "sender_type", "receiver_type", "status"} {
		add(hostileCase{category: "body: oversize", name: f + " of 100 KB", env: setField(f, big(100<<10, "x")), want: inv})
	}
	add(
		hostileCase{category: "body: oversize", name: "unknown member with a 50 KB name", body: func(_ *hostileCase, b []byte) []byte { return addRaw(b, big(50<<10, "k"), "1") }, want: inv},
		hostileCase{category: "body: oversize", name: "payload of 300 KB (receiver's limit 256 KiB)", env: setField("payload", map[string]string{"blob": big(300<<10, "x")}), want: inv},
		hostileCase{category: "body: oversize", name: "metadata of 10,000 entries", env: func(e map[string]any) {
			md := map[string]string{}
			for i := range 10000 {
				md[fmt.Sprint("k", i)] = "v"
			}
			e["metadata"] = md
		}, want: invOrHandled},
		hostileCase{category: "body: oversize", name: "body above the server's max payload (1.1 MB)", env: setField("payload", map[string]string{"blob": big(1100<<10, "x")}), want: refused},
	)
	// Invalid UTF-8 and control characters in fields.
	add(
		hostileCase{category: "body: encoding", name: "invalid UTF-8 in action", body: func(_ *hostileCase, b []byte) []byte { return setRaw(b, "action", "wo\xffrk") }, want: inv},
		hostileCase{category: "body: encoding", name: "invalid UTF-8 in message_id", body: func(_ *hostileCase, b []byte) []byte { return setRaw(b, "message_id", "id-\xc3\x28") }, want: inv},
		hostileCase{category: "body: encoding", name: "invalid UTF-8 in sender_id", body: func(_ *hostileCase, b []byte) []byte { return setRaw(b, "sender_id", "mallory\xff") }, want: inv},
		hostileCase{category: "body: encoding", name: "invalid UTF-8 in a payload string", body: func(_ *hostileCase, b []byte) []byte { return addRaw(b, "payload", "{\"s\":\"\xed\xa0\x80\"}") }, want: inv},
		hostileCase{category: "body: encoding", name: "invalid UTF-8 in a metadata key", body: func(_ *hostileCase, b []byte) []byte { return addRaw(b, "metadata", "{\"\xff\":\"v\"}") }, want: inv},
		hostileCase{category: "body: encoding", name: `\u0000 in correlation_id`, body: func(_ *hostileCase, b []byte) []byte { return addRaw(b, "correlation_id", `"c\u0000d"`) }, want: inv},
		hostileCase{category: "body: encoding", name: "C1 control (U+0085) in task_id", env: setField("task_id", "t\u0085"), want: inv},
		hostileCase{category: "body: encoding", name: "byte order mark before the object", body: func(_ *hostileCase, b []byte) []byte { return append([]byte("\xef\xbb\xbf"), b...) }, want: inv},
	)
	// Deep nesting.
	add(
		hostileCase{category: "body: nesting", name: "payload nested 10,000 arrays deep", body: func(_ *hostileCase, b []byte) []byte { return addRaw(b, "payload", deepArrays(10000)) }, want: invOrHandled},
		hostileCase{category: "body: nesting", name: "payload nested 100,000 arrays deep", body: func(_ *hostileCase, b []byte) []byte { return addRaw(b, "payload", deepArrays(100000)) }, want: invOrHandled},
		hostileCase{category: "body: nesting", name: "context nested 10,000 objects deep", body: func(_ *hostileCase, b []byte) []byte { return addRaw(b, "context", deepObjects(10000)) }, want: invOrHandled},
		hostileCase{category: "body: nesting", name: "unknown member nested 50,000 arrays deep", body: func(_ *hostileCase, b []byte) []byte { return addRaw(b, "junk", deepArrays(50000)) }, want: inv},
		hostileCase{category: "body: nesting", name: "metadata nested 10,000 objects deep", body: func(_ *hostileCase, b []byte) []byte { return addRaw(b, "metadata", deepObjects(10000)) }, want: inv},
	)
	// Not an envelope at all.
	garbage := make([]byte, 1024)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range garbage {
		garbage[i] = byte(r.UintN(256))
	}
	for _, nb := range []struct{ name, body string }{
		{"empty body", ""}, {"plain text", "hello, agent"}, {"1 KB of random bytes", string(garbage)}, {"JSON array", "[1,2]"},
		{"JSON string", `"work"`}, {"JSON null", "null"}, {"JSON number", "1e999"}, {"whitespace", " \r\n\t "},
	} {
		add(hostileCase{category: "body: not JSON", name: nb.name, body: func(*hostileCase, []byte) []byte { return []byte(nb.body) }, want: inv})
	}
	add(
		hostileCase{category: "body: not JSON", name: "truncated envelope", body: func(_ *hostileCase, b []byte) []byte { return b[:len(b)/2] }, want: inv},
		hostileCase{category: "body: not JSON", name: "trailing garbage", body: func(_ *hostileCase, b []byte) []byte { return append(slices.Clone(b), "xyz"...) }, want: inv},
		hostileCase{category: "body: not JSON", name: "two envelopes", body: func(_ *hostileCase, b []byte) []byte { return append(slices.Clone(b), b...) }, want: inv},
	)
	// Routing lies.
	add(
		hostileCase{category: "body: routing", name: "spoofed sender_id (alice)", env: setField("sender_id", goodSender), want: inv},
		hostileCase{category: "body: routing", name: "sender_id not a token", env: setField("sender_id", "mal.lory"), want: inv},
		hostileCase{category: "body: routing", name: "duplicate sender_id member (mallory, then alice)", body: func(_ *hostileCase, b []byte) []byte { return addRaw(b, "sender_id", `"alice"`) }, want: inv},
		hostileCase{category: "body: routing", name: "wrong receiver_id", env: setField("receiver_id", goodSender), want: inv},
		hostileCase{category: "body: routing", name: "no receiver_id on a direct subject", env: func(e map[string]any) { delete(e, "receiver_id") }, want: inv},
		hostileCase{category: "body: routing", name: "priority high in the body, normal subject", prio: wire.PriorityNormal, env: setField("priority", "high"), want: inv},
		hostileCase{category: "body: routing", name: "unknown priority urgent", env: setField("priority", "urgent"), want: inv},
		// "medium" is an accepted synonym of normal, on a normal subject.
		hostileCase{category: "body: routing", name: "priority medium", env: setField("priority", "medium"), want: []string{outHandled}},
		hostileCase{category: "body: routing", name: "broadcast naming a receiver", kind: subjects.KindBroadcast, prio: wire.PriorityNormal, env: setField("receiver_id", "planner"), want: inv},
		hostileCase{category: "body: routing", name: "broadcast with a spoofed sender", kind: subjects.KindBroadcast, prio: wire.PriorityNormal, env: setField("sender_id", goodSender), want: inv},
		hostileCase{category: "body: routing", name: "topic message naming another topic", kind: subjects.KindTopic, prio: wire.PriorityNormal, env: setField("topic", "other"), want: inv},
		hostileCase{category: "body: routing", name: "unknown message_type", env: setField("message_type", "command"), want: inv},
		hostileCase{category: "body: routing", name: "response without in_reply_to", env: setField("message_type", "response"), want: inv},
		hostileCase{category: "body: routing", name: "error without error", env: setField("message_type", "error"), want: inv},
		hostileCase{category: "body: routing", name: "unknown error code", env: setField("error", map[string]any{"code": "PWNED", "message": "x"}), want: inv},
		hostileCase{category: "body: routing", name: "acl version 2", env: setField("acl", "2"), want: inv},
		hostileCase{category: "body: routing", name: "unknown member", env: setField("colour", "red"), want: inv},
	)
	// Valid envelopes from mallory (controls): handled, or settled as the runtime's table says.
	add(
		hostileCase{category: "valid from mallory", name: "valid request", want: []string{outHandled}},
		hostileCase{category: "valid from mallory", name: "valid broadcast", kind: subjects.KindBroadcast, prio: wire.PriorityHigh, want: []string{outHandled}},
		hostileCase{category: "valid from mallory", name: "valid topic message", kind: subjects.KindTopic, prio: wire.PriorityCritical, want: []string{outHandled}},
		hostileCase{category: "valid from mallory", name: "unknown action", env: setField("action", "drop_tables"), want: []string{outTerm}},
		hostileCase{category: "valid from mallory", name: "response nobody waits for", env: func(e map[string]any) {
			e["message_type"], e["in_reply_to"] = "response", "nobody"
			delete(e, "action")
		}, want: []string{outAcked}},
	)
	// ttl_ms and timestamps at their edges.
	add(
		hostileCase{category: "ttl/timestamp", name: "expired: ttl 1ms, timestamp 2000", env: func(e map[string]any) {
			e["ttl_ms"], e["timestamp"] = 1, "2000-01-01T00:00:00Z"
		}, want: []string{outAcked}},
		hostileCase{category: "ttl/timestamp", name: "ttl_ms at the maximum", env: setField("ttl_ms", wire.MaxTTLMillis), want: []string{outHandled}},
		hostileCase{category: "ttl/timestamp", name: "ttl_ms one above the maximum", env: setField("ttl_ms", wire.MaxTTLMillis+1), want: inv},
		hostileCase{category: "ttl/timestamp", name: "ttl_ms negative", env: setField("ttl_ms", -1), want: inv},
		hostileCase{category: "ttl/timestamp", name: "ttl_ms 1e30", env: setField("ttl_ms", json.Number("1e30")), want: inv},
		hostileCase{category: "ttl/timestamp", name: "ttl_ms max int64", env: setField("ttl_ms", json.Number("9223372036854775807")), want: inv},
		hostileCase{category: "ttl/timestamp", name: "ttl_ms a string", env: setField("ttl_ms", "100"), want: inv},
		hostileCase{category: "ttl/timestamp", name: "timestamp zero", env: setField("timestamp", "0001-01-01T00:00:00Z"), want: inv},
		hostileCase{category: "ttl/timestamp", name: "timestamp missing", env: func(e map[string]any) { delete(e, "timestamp") }, want: inv},
		hostileCase{category: "ttl/timestamp", name: "timestamp year 9999, ttl at the maximum", env: func(e map[string]any) {
			e["timestamp"], e["ttl_ms"] = "9999-12-31T23:59:59.999999999Z", wire.MaxTTLMillis
		}, want: invOrHandled},
		hostileCase{category: "ttl/timestamp", name: "timestamp year 10000", env: setField("timestamp", "10000-01-01T00:00:00Z"), want: inv},
		hostileCase{category: "ttl/timestamp", name: "timestamp with a leap second", env: setField("timestamp", "2016-12-31T23:59:60Z"), want: inv},
		hostileCase{category: "ttl/timestamp", name: "timestamp with offset +23:59", env: setField("timestamp", "2026-01-01T00:00:00+23:59"), want: invOrHandled},
		hostileCase{category: "ttl/timestamp", name: "timestamp not RFC 3339", env: setField("timestamp", "yesterday"), want: inv},
		hostileCase{category: "ttl/timestamp", name: "timestamp 1ns after year 1, ttl at the maximum", env: func(e map[string]any) {
			e["timestamp"], e["ttl_ms"] = "0001-01-01T00:00:00.000000001Z", wire.MaxTTLMillis
		}, want: []string{outInvalid, outAcked}},
	)
	// Subjects with bad tokens that mallory's permissions (mesh.agent.*.*.mallory,
	// mesh.topic.*.*.mallory, mesh.broadcast.*.mallory) allow, and some they do not.
	// A priority token outside the five matches no subject of the stream:
	// the server refuses it. Other bad tokens are stored, and no consumer
	// filters them.
	for _, s := range []string{
		"mesh.agent.planner.URGENT.mallory", "mesh.agent.planner.Normal.mallory", "mesh.agent.planner.critical!.mallory",
		"mesh.broadcast.URGENT.mallory", "mesh.topic.news.URGENT.mallory",
	} {
		add(hostileCase{category: "subject: bad token", name: clipText(s, 60), subject: s, want: []string{outRefused}})
	}
	for _, s := range []string{
		"mesh.agent.PLANNER.normal.mallory", "mesh.agent.plänner.normal.mallory", "mesh.agent." + big(3000, "p") + ".normal.mallory",
		"mesh.topic.n$ws.normal.mallory",
	} {
		add(hostileCase{category: "subject: bad token", name: clipText(s, 60), subject: s, want: unrouted})
	}
	for _, s := range []string{"mesh.agent.*.normal.mallory", "mesh.agent.planner.*.mallory", "mesh.broadcast.*.mallory", "mesh.topic.>.normal.mallory"} {
		add(hostileCase{category: "subject: wildcard token", name: s, subject: s, want: []string{outUnrouted, outRefused, outInvalid}})
	}
	for _, s := range []string{
		"mesh.agent.planner.normal.extra.mallory", "mesh.agent.planner.normal.mallory.extra", "mesh.agent.planner.normal.alice",
		"mesh.broadcast.normal.alice", "mesh.hb.planner", "mesh.dlq.planner.normal.mallory", "mesh.alert.critical.planner",
	} {
		add(hostileCase{category: "subject: not permitted", name: s, subject: s, want: refused})
	}
	// Nats-Msg-Id.
	add(
		hostileCase{category: "Nats-Msg-Id", name: "absent", header: func(_ *hostileCase, h nats.Header, _ *hostileMallory) { h.Del(wire.HeaderMsgID) }, want: []string{outHandled}},
		hostileCase{category: "Nats-Msg-Id", name: "another message_id than the body's", header: withHeader(wire.HeaderMsgID, "not-the-body-id"), want: invOrHandled},
		hostileCase{category: "Nats-Msg-Id", name: "duplicate of mallory's previous message", header: func(_ *hostileCase, h nats.Header, ml *hostileMallory) {
			h.Set(wire.HeaderMsgID, ml.lastID)
		}, want: []string{outDedup}},
		hostileCase{category: "Nats-Msg-Id", name: "a good message's id", header: func(_ *hostileCase, h nats.Header, ml *hostileMallory) {
			h.Set(wire.HeaderMsgID, ml.goodID)
		}, want: []string{outDedup}},
		hostileCase{category: "Nats-Msg-Id", name: "with a tab and NUL", header: withHeader(wire.HeaderMsgID, "id\t\x00"), want: invOrHandled},
	)
	// Headers JetStream interprets at publish.
	add(
		hostileCase{category: "JetStream headers", name: "Nats-Rollup: all", header: withHeader("Nats-Rollup", "all"), want: refused},
		hostileCase{category: "JetStream headers", name: "Nats-Expected-Stream: OTHER", header: withHeader("Nats-Expected-Stream", "OTHER"), want: refused},
		hostileCase{category: "JetStream headers", name: "Nats-Expected-Last-Sequence: 1", header: withHeader("Nats-Expected-Last-Sequence", "1"), want: refused},
		hostileCase{category: "JetStream headers", name: "Nats-TTL: 1s", header: withHeader("Nats-TTL", "1s"), want: []string{outRefused, outHandled}},
	)
	// The payload store (claim check): mallory may write any object.
	put := func(n int, mutate func(map[string]any)) func(context.Context, *hostileCase, *hostileMallory) error {
		return func(ctx context.Context, c *hostileCase, ml *hostileMallory) error {
			_, err := ml.obs.PutBytes(ctx, c.id, objectEnvelope(c, n, mutate))
			return err
		}
	}
	add(
		hostileCase{category: "payload store", name: "valid large envelope (control)", header: refHeader, setup: put(1<<10, nil), want: []string{outHandled}},
		hostileCase{category: "payload store", name: "ref to no object", header: refHeader, want: inv},
		hostileCase{category: "payload store", name: "object not JSON", header: refHeader, setup: func(ctx context.Context, c *hostileCase, ml *hostileMallory) error {
			_, err := ml.obs.PutBytes(ctx, c.id, []byte("not an envelope"))
			return err
		}, want: inv},
		hostileCase{category: "payload store", name: "object with another message_id", header: refHeader, setup: put(0, setField("message_id", "someone-else")), want: inv},
		hostileCase{category: "payload store", name: "object of 300 KB (limit 256 KiB)", header: refHeader, setup: put(300<<10, nil), want: inv},
		hostileCase{category: "payload store", name: "object spoofing the sender", header: refHeader, setup: put(0, setField("sender_id", goodSender)), want: inv},
		hostileCase{category: "payload store", name: "object nested 100,000 deep", header: refHeader, setup: func(ctx context.Context, c *hostileCase, ml *hostileMallory) error {
			_, err := ml.obs.PutBytes(ctx, c.id, addRaw(c.base, "payload", deepArrays(100000)))
			return err
		}, want: invOrHandled},
		hostileCase{category: "payload store", name: "object meta not JSON", header: refHeader, setup: func(ctx context.Context, c *hostileCase, ml *hostileMallory) error {
			return ml.publishMeta(ctx, c.id, []byte("{not json"))
		}, want: inv},
		hostileCase{category: "payload store", name: "object digest mismatch", header: refHeader, setup: func(ctx context.Context, c *hostileCase, ml *hostileMallory) error {
			info, err := ml.obs.PutBytes(ctx, c.id, objectEnvelope(c, 0, nil))
			if err != nil {
				return err
			}
			sum := sha256.Sum256([]byte("something else"))
			info.Digest = "SHA-256=" + base64.URLEncoding.EncodeToString(sum[:])
			info.ModTime = time.Time{}
			meta, err := json.Marshal(info)
			if err != nil {
				return err
			}
			return ml.publishMeta(ctx, c.id, meta)
		}, want: inv},
		hostileCase{category: "payload store", name: "link to a 300 KB object (limit 256 KiB)", header: refHeader, setup: func(ctx context.Context, c *hostileCase, ml *hostileMallory) error {
			target, err := ml.obs.PutBytes(ctx, c.id+"-target", objectEnvelope(c, 300<<10, nil))
			if err != nil {
				return err
			}
			_, err = ml.obs.AddLink(ctx, c.id, target)
			return err
		}, want: inv},
		hostileCase{category: "payload store", name: "link to itself", header: refHeader, setup: func(ctx context.Context, c *hostileCase, ml *hostileMallory) error {
			_, err := ml.obs.AddLink(ctx, c.id, &jetstream.ObjectInfo{ObjectMeta: jetstream.ObjectMeta{Name: c.id}, Bucket: subjects.Default.PayloadsBucket()})
			return err
		}, want: inv},
		hostileCase{category: "payload store", name: "link into a bucket the receiver may not read", header: refHeader, setup: func(ctx context.Context, c *hostileCase, ml *hostileMallory) error {
			_, err := ml.obs.AddLink(ctx, c.id, &jetstream.ObjectInfo{ObjectMeta: jetstream.ObjectMeta{Name: "x"}, Bucket: "secrets"})
			return err
		}, want: inv},
		hostileCase{category: "payload store", name: "link into a bucket the receiver may not read, on a reply (fetched by the reader)",
			header: func(c *hostileCase, h nats.Header, ml *hostileMallory) {
				refHeader(c, h, ml)
				h.Set(wire.HeaderInReplyTo, "m1")
			}, setup: func(ctx context.Context, c *hostileCase, ml *hostileMallory) error {
				_, err := ml.obs.AddLink(ctx, c.id, &jetstream.ObjectInfo{ObjectMeta: jetstream.ObjectMeta{Name: "x"}, Bucket: "secrets"})
				return err
			}, want: inv},
	)
	return cs
}

// hostileGood is the well-behaved traffic: every message sent, by the
// receivers expected to handle it.
type hostileGood struct {
	mu     sync.Mutex
	expect map[string]int // "<receiver>/<message id>" → 1
	final  []string       // the keys of the messages sent after the corpus
	errs   []string
}

// send sends one good message from `from` by kind (direct to `to`, topic,
// broadcast) at p, and records who must handle it; final marks the
// messages sent after the whole corpus.
func (g *hostileGood) send(ctx context.Context, from *agentkit.Agent, kind subjects.Kind, to string, p wire.Priority, final bool) string {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	payload := map[string]string{"from": from.ID(), "kind": string(kind)}
	var env *wire.Envelope
	var err error
	var receivers []string
	switch kind {
	case subjects.KindTopic:
		env, err = from.Publish(ctx, newsTopic, "work", payload, agentkit.WithPriority(p))
		receivers = []string{"planner"}
	case subjects.KindBroadcast:
		env, err = from.Broadcast(ctx, "work", payload, agentkit.WithPriority(p))
		receivers = hostileVictims
	default:
		env, err = from.Send(ctx, to, "work", payload, agentkit.WithPriority(p))
		receivers = []string{to}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if err != nil {
		g.errs = append(g.errs, fmt.Sprintf("%s %s from %s to %s at %s: %v", kind, "work", from.ID(), to, p, err))
		return ""
	}
	for _, r := range receivers {
		if r == from.ID() {
			continue // an agent's own topic message or broadcast is not for it
		}
		key := r + "/" + env.MessageID
		g.expect[key] = 1
		if final {
			g.final = append(g.final, key)
		}
	}
	return env.MessageID
}

func (g *hostileGood) snapshot() (map[string]int, []string, []string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make(map[string]int, len(g.expect))
	for k, v := range g.expect {
		out[k] = v
	}
	return out, slices.Clone(g.final), slices.Clone(g.errs)
}

// TestHostilePeers sends a corpus of hostile messages from mallory, an
// agent holding only its own credentials, to three agents handling good
// traffic from well-behaved agents, interleaved. Properties: every agent
// keeps its connection and keeps consuming (a good message at every
// priority, sent after the whole corpus, is handled); every hostile
// message the stream stored reaches a terminal outcome at the broker
// (nothing left pending on the agents' consumers) that its case allows
// (terminated as INVALID wherever it is not a valid envelope for the
// receiver), and the agents' INVALID counts match the broker's TERM
// advisories; every good message is handled exactly once; no handler sees
// an envelope the runtime should have refused. A table of category →
// outcome is logged.
func TestHostilePeers(t *testing.T) {
	t.Parallel()
	budget := 150 * time.Second
	if dl, ok := t.Deadline(); ok {
		budget = min(budget, time.Until(dl)/2)
	}
	const stall = 30 * time.Second

	specs := []auth.AgentSpec{{ID: "planner", Topics: []string{newsTopic}}, {ID: "executor"}, {ID: "validator"}, {ID: goodSender}, {ID: hostileSender}}
	policies := map[wire.Priority]agentkit.DeliveryPolicy{}
	for _, p := range wire.Priorities {
		policies[p] = hostilePolicy()
	}
	m := newHostileMesh(t, specs, policies)
	ledger := newHostileLedger()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })

	ctx, cancel := context.WithTimeout(context.Background(), budget+2*time.Minute)
	defer cancel()
	agentOpts := func(id string, extra ...agentkit.Option) []agentkit.Option {
		opts := []agentkit.Option{agentkit.WithProvisioning(false), agentkit.WithRegistration(false),
			agentkit.WithMaxEnvelopeBytes(hostileMaxEnvelope), agentkit.WithPublishTimeout(5 * time.Second),
			agentkit.WithPropagator(propagation.TraceContext{}), agentkit.WithTracerProvider(tp)}
		for p, pol := range policies {
			opts = append(opts, agentkit.WithPolicy(p, pol))
		}
		return append(opts, extra...)
	}

	victims := map[string]*hostileVictim{}
	var victimAgents []*agentkit.Agent
	for _, id := range hostileVictims {
		v := &hostileVictim{id: id}
		v.nc = m.connect(id, v.connOptions()...)
		opts := agentOpts(id, agentkit.WithErrorHandler(func(err error) { v.note(&v.asyncErrors, err.Error()) }))
		if id == "planner" {
			opts = append(opts, agentkit.WithTopics(newsTopic))
		}
		a, err := agentkit.New(v.nc, id, opts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(a.Stop)
		if err := a.HandleFunc("work", ledger.handler(id, hostileMaxEnvelope, hostileSender)); err != nil {
			t.Fatal(err)
		}
		if err := a.Start(ctx); err != nil {
			t.Fatalf("Start %s: %v", id, err)
		}
		v.agent = a
		victims[id] = v
		victimAgents = append(victimAgents, a)
	}
	alice, err := agentkit.New(m.connect(goodSender), goodSender, agentOpts(goodSender)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(alice.Stop)

	// Mallory: a raw client with its own credentials only.
	ml := &hostileMallory{w: auth.NewWatcher(nil)}
	ml.nc = m.connect(hostileSender, ml.w.Option())
	if ml.js, err = jetstream.New(ml.nc); err != nil {
		t.Fatal(err)
	}
	if ml.obs, err = ml.js.ObjectStore(ctx, subjects.Default.PayloadsBucket()); err != nil {
		t.Fatalf("mallory's payload store: %v", err)
	}

	// The victims' consumers and what they filter.
	filters := map[string][]string{} // consumer → filters
	consumerOf := map[string]string{}
	victimConsumers := map[string]bool{}
	for _, id := range hostileVictims {
		var names []string
		for _, p := range wire.Priorities {
			name, _ := subjects.Default.Consumer(id, string(p))
			names = append(names, name)
		}
		for _, class := range subjects.FanoutClasses {
			name, _ := subjects.Default.FanoutConsumer(id, class)
			names = append(names, name)
		}
		for _, name := range names {
			info, err := m.consumerInfo(ctx, name)
			if err != nil {
				t.Fatalf("consumer %s: %v", name, err)
			}
			fs := info.Config.FilterSubjects
			if info.Config.FilterSubject != "" {
				fs = append(fs, info.Config.FilterSubject)
			}
			filters[name], consumerOf[name], victimConsumers[name] = fs, id, true
		}
	}

	good := &hostileGood{expect: map[string]int{}}
	// Background good traffic between the victims, one message per hostile
	// message sent, concurrently with mallory.
	tick := make(chan struct{}, 1)
	corpusDone := make(chan struct{})
	var bg sync.WaitGroup
	bg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-corpusDone:
				return
			case <-tick:
			}
			from := victims[hostileVictims[i%3]].agent
			to := hostileVictims[(i+1)%3]
			kind := subjects.KindDirect
			switch {
			case i%11 == 5:
				kind = subjects.KindBroadcast
			case i%7 == 3:
				kind = subjects.KindTopic
			}
			good.send(ctx, from, kind, to, wire.Priorities[i%5], false)
		}
	})

	// The corpus, each hostile message followed by a good one from alice.
	cases := hostileCorpus()
	mainPrios := []wire.Priority{wire.PriorityCritical, wire.PriorityHigh, wire.PriorityNormal}
	for i := range cases {
		c := &cases[i]
		if c.kind == "" {
			c.kind = subjects.KindDirect
		}
		if c.to == "" {
			c.to = hostileVictims[(i/3)%3]
		}
		if c.prio == "" {
			c.prio = mainPrios[i%3]
		}
		e := wire.NewEnvelope(wire.TypeRequest, hostileSender, "work")
		e.Priority = c.prio
		switch c.kind {
		case subjects.KindDirect:
			e.ReceiverID = c.to
			c.subj, _ = subjects.Default.Direct(c.to, string(c.prio), hostileSender)
		case subjects.KindTopic:
			e.Topic = newsTopic
			c.subj, _ = subjects.Default.Topic(newsTopic, string(c.prio), hostileSender)
		case subjects.KindBroadcast:
			c.subj, _ = subjects.Default.Broadcast(string(c.prio), hostileSender)
		}
		if c.subject != "" {
			c.subj = c.subject
		}
		c.id = e.MessageID
		data, err := e.Encode()
		if err != nil {
			t.Fatal(err)
		}
		var em map[string]any
		if err := json.Unmarshal(data, &em); err != nil {
			t.Fatal(err)
		}
		if c.env != nil {
			c.env(em)
		}
		if c.base, err = json.Marshal(em); err != nil {
			t.Fatal(err)
		}
		body := c.base
		if c.body != nil {
			body = c.body(c, c.base)
		}
		c.bodySize = len(body)
		if c.setup != nil {
			sctx, scancel := context.WithTimeout(ctx, 20*time.Second)
			err := c.setup(sctx, c, ml)
			scancel()
			if err != nil {
				t.Fatalf("%s / %s: setup: %v", c.category, c.name, err)
			}
		}
		msg := &nats.Msg{Subject: c.subj, Data: body, Header: nats.Header{}}
		msg.Header.Set(wire.HeaderMsgID, c.id)
		if c.header != nil {
			c.header(c, msg.Header, ml)
		}
		pctx, pcancel := context.WithTimeout(ctx, 20*time.Second)
		ack, refusal := ml.publish(pctx, msg)
		pcancel()
		switch {
		case refusal != "":
			c.publish = outRefused + ": " + refusal
		case ack.Duplicate:
			c.publish = outDedup
		default:
			c.publish, c.seq = "stored", ack.Sequence
			ml.lastID = msg.Header.Get(wire.HeaderMsgID)
			for name, fs := range filters {
				if slices.ContainsFunc(fs, func(f string) bool { return hostileFilterMatch(f, c.subj) }) {
					c.expected = append(c.expected, hostileDelivery{name, c.seq})
				}
			}
			slices.SortFunc(c.expected, func(a, b hostileDelivery) int { return strings.Compare(a.consumer, b.consumer) })
		}
		select {
		case tick <- struct{}{}:
		default:
		}
		to := hostileVictims[i%3]
		if id := good.send(ctx, alice, subjects.KindDirect, to, wire.Priorities[(i+2)%5], false); id != "" {
			ml.goodID = id
		}
	}
	close(corpusDone)
	bg.Wait()

	// After the whole corpus: a good message to every agent at every
	// priority, which each must still handle.
	for _, id := range hostileVictims {
		for _, p := range wire.Priorities {
			good.send(ctx, alice, subjects.KindDirect, id, p, true)
		}
	}

	// Wait until every stored hostile message and every good message has
	// reached its outcome and the agents' consumers hold nothing.
	expect, _, sendErrs := good.snapshot()
	closedVictim := func(consumer string) bool {
		v := victims[consumerOf[consumer]]
		return v.nc.IsClosed()
	}
	progress := func() string {
		return fmt.Sprintf("%d/%d", m.events.count(), ledger.calls.Load())
	}
	waitErr := hostileWait(budget, stall, progress, func() string {
		for key := range expect {
			if ledger.goodCount(key) == 0 && !victims[strings.SplitN(key, "/", 2)[0]].nc.IsClosed() {
				return "good message " + key + " not handled"
			}
		}
		for i := range cases {
			for _, d := range cases[i].expected {
				if closedVictim(d.consumer) {
					continue
				}
				if out, _ := deliveryOutcome(m.events, ledger, consumerOf, d); out == outPending {
					return fmt.Sprintf("%s / %s: no terminal outcome at %s", cases[i].category, cases[i].name, d.consumer)
				}
			}
		}
		for name := range victimConsumers {
			if closedVictim(name) {
				continue
			}
			qctx, qcancel := context.WithTimeout(ctx, 5*time.Second)
			info, err := m.consumerInfo(qctx, name)
			qcancel()
			if err != nil {
				return fmt.Sprintf("consumer %s: %v", name, err)
			}
			if info.NumPending != 0 || info.NumAckPending != 0 {
				return fmt.Sprintf("consumer %s: %d pending, %d waiting for an ack", name, info.NumPending, info.NumAckPending)
			}
		}
		return ""
	})

	// The table: category → outcome.
	var rows []string
	var failures []string
	expectedInvalid, invalidDeliveries := 0, 0
	for i := range cases {
		c := &cases[i]
		var outs []string
		ok := true
		switch {
		case c.publish != "stored":
			outs = append(outs, c.publish)
			kind, _, _ := strings.Cut(c.publish, ":")
			ok = slices.Contains(c.want, kind)
		default:
			seen := map[hostileDelivery]bool{}
			for _, d := range c.expected {
				seen[d] = true
			}
			deliveries := slices.Clone(c.expected)
			for _, d := range m.events.deliveriesOf(c.seq) {
				if !seen[d] && victimConsumers[d.consumer] {
					deliveries = append(deliveries, d) // the server delivered it where no filter says it should
				}
			}
			if len(deliveries) == 0 {
				outs = append(outs, fmt.Sprintf("%s (seq %d)", outUnrouted, c.seq))
				ok = slices.Contains(c.want, outUnrouted)
			}
			for _, d := range deliveries {
				out, detail := deliveryOutcome(m.events, ledger, consumerOf, d)
				note := ""
				if !seen[d] {
					note = " [unexpected delivery]"
				}
				outs = append(outs, fmt.Sprintf("%s: %s%s%s", d.consumer, out, detail, note))
				if !slices.Contains(c.want, out) {
					ok = false
				}
				if slices.Equal(c.want, []string{outInvalid}) {
					expectedInvalid++
					if out == outInvalid {
						invalidDeliveries++
					}
				}
			}
		}
		mark := "ok"
		if !ok {
			mark = "FAIL"
			failures = append(failures, fmt.Sprintf("%s / %s: %s (want %s)", c.category, c.name, strings.Join(outs, "; "), strings.Join(c.want, " or ")))
		}
		rows = append(rows, fmt.Sprintf("%-4s | %-24s | %-62s | %7d B | %s", mark, c.category, clipText(c.name, 62), c.bodySize, strings.Join(outs, "; ")))
	}
	t.Logf("hostile corpus: %d messages; outcome per receiving consumer\n%s", len(cases), strings.Join(rows, "\n"))
	if waitErr != "" {
		t.Errorf("waiting for every outcome: %s", waitErr)
	}

	// Property: every agent keeps its connection and keeps consuming.
	for _, id := range hostileVictims {
		if why := victims[id].alive(); why != "" {
			t.Errorf("agent %s: %s", id, why)
		}
	}
	_, finalKeys, _ := good.snapshot()
	for _, key := range finalKeys {
		if ledger.goodCount(key) == 0 {
			t.Errorf("keeps consuming: the good message %s sent after the corpus was not handled", key)
		}
	}

	// Property: every hostile message reached an outcome its case allows.
	for _, f := range failures {
		t.Errorf("outcome: %s", f)
	}
	// Property: the broker's INVALID terminations are the agents' INVALID
	// outcomes, and cover every message that is not a valid envelope.
	terms := m.events.terms("INVALID: ", victimConsumers)
	var statsInvalid uint64
	for _, a := range victimAgents {
		statsInvalid += a.Stats().Outcomes[agentkit.OutcomeInvalid]
	}
	if uint64(terms) != statsInvalid {
		t.Errorf("TERM INVALID advisories %d, the agents' invalid outcomes %d", terms, statsInvalid)
	}
	if invalidDeliveries != expectedInvalid {
		t.Errorf("of %d deliveries of stored messages that are no valid envelope for their receiver, %d were terminated as INVALID (TERM INVALID advisories in all: %d)", expectedInvalid, invalidDeliveries, terms)
	}
	// Property: nothing is left pending on the agents' consumers.
	for name := range victimConsumers {
		info, err := m.consumerInfo(ctx, name)
		if err != nil {
			t.Errorf("consumer %s: %v", name, err)
			continue
		}
		if info.NumPending != 0 || info.NumAckPending != 0 {
			t.Errorf("consumer %s: %d messages pending, %d waiting for an ack (redelivered %d)", name, info.NumPending, info.NumAckPending, info.NumRedelivered)
		}
	}

	// Property: every good message handled exactly once, by its receivers.
	for _, e := range sendErrs {
		t.Errorf("good traffic: %s", e)
	}
	got, violations := ledger.snapshot()
	missing, dup := 0, 0
	for key := range expect {
		switch n := got[key]; {
		case n == 0:
			missing++
			if missing <= 10 {
				t.Errorf("good message %s not handled", key)
			}
		case n > 1:
			dup++
			t.Errorf("good message %s handled %d times", key, n)
		}
	}
	for key, n := range got {
		if expect[key] == 0 {
			t.Errorf("handled %d times a good message nobody sent to that agent: %s", n, key)
		}
	}
	if missing > 10 {
		t.Errorf("... %d good messages not handled in all", missing)
	}
	t.Logf("good traffic: %d deliveries expected, %d missing, %d duplicated", len(expect), missing, dup)

	// Property: no handler saw an envelope the runtime should have refused.
	for _, v := range violations {
		t.Errorf("handler saw: %s", v)
	}
	for _, id := range hostileVictims {
		v := victims[id]
		v.mu.Lock()
		errs := slices.Clone(v.asyncErrors)
		v.mu.Unlock()
		if len(errs) > 0 {
			t.Logf("agent %s: %d async errors, first: %s", id, len(errs), strings.Join(errs[:min(3, len(errs))], " | "))
		}
	}
}

// deliveryOutcome is what happened to delivery d: its outcome and a
// detail (the TERM reason, the delivery count).
func deliveryOutcome(ev *hostileEvents, l *hostileLedger, consumerOf map[string]string, d hostileDelivery) (string, string) {
	var naks uint64
	acked := false
	for _, e := range ev.of(d) {
		switch e.Kind {
		case subjects.EventTerminated:
			if strings.HasPrefix(e.Reason, "INVALID: ") {
				return outInvalid, " (" + clipText(e.Reason, 110) + ")"
			}
			return outTerm, " (" + clipText(e.Reason, 110) + ")"
		case subjects.EventMaxDeliveries:
			return outExhausted, fmt.Sprintf(" (after %d deliveries)", e.Deliveries)
		case subjects.EventNak:
			naks++
		case subjects.EventAck:
			acked = true
		}
	}
	if acked {
		if l.handledSeq(consumerOf[d.consumer], d.seq) > 0 {
			return outHandled, ""
		}
		return outAcked, ""
	}
	if naks > 0 {
		return outPending, fmt.Sprintf(" (NAKed %d times)", naks)
	}
	return outPending, ""
}
