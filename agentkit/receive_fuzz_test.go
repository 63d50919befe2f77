package agentkit_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/propagation"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/internal/natstest"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// FuzzReceive drives the receive path of a running agent on a live
// embedded server: each input is a message (a subject among those the
// agent consumes, two headers, a body, or a valid envelope with one
// member replaced) published to the stream, and the input waits, bounded,
// for the message's terminal outcome at the broker. Properties: every
// message the stream stores is settled, acked (handled or not) or
// terminated, never left to exhaust its deliveries or to sit pending; the
// agent keeps its connection and keeps reading; its handler never sees an
// envelope that is invalid, misrouted or above its limit. One server and
// one agent serve the whole run (per fuzzing process).
//
// The seeds are the hostile categories of e2e's TestHostilePeers that
// reach a receiver. Headers that nats.go itself interprets on receipt
// (Status, Description, Nats-Pin-Id) are left to that suite: they stop the
// receiver's reads, and with them this run.
func FuzzReceive(f *testing.F) {
	for _, s := range receiveSeeds() {
		f.Add(s.subject, s.mode, s.k1, s.v1, s.g1, s.k2, s.v2, s.body, s.g2)
	}
	r := newReceiveRig(f)
	f.Fuzz(func(t *testing.T, subject, mode, k1 uint8, v1 string, g1 uint16, k2 uint8, v2 string, body []byte, g2 uint16) {
		r.run(t, subject, mode, k1, grow(v1, g1, 70<<10), k2, v2, body, g2)
	})
}

// grow returns s repeated n times (n < 2: s), at most max bytes: inputs
// stay small, so the fuzzer mutates and minimizes them quickly, and still
// reach the sizes of the hostile categories.
func grow(s string, n uint16, max int) string {
	if n < 2 || s == "" {
		return s
	}
	return strings.Repeat(s, min(int(n), max/len(s)+1))
}

// growFragment grows a JSON fragment b by n (n < 2: b as is), to at
// most max bytes. With the high bit of n clear, what lies between its first
// and last byte is repeated: `"a"` grows into a long JSON string. With it
// set, each half of b is repeated (n without the high bit times): `[]`
// grows into arrays nested n deep.
func growFragment(b []byte, n uint16, max int) []byte {
	if n&0x8000 != 0 {
		n &^= 0x8000
		if n < 2 || len(b) < 2 {
			return b
		}
		h := len(b) / 2
		return []byte(grow(string(b[:h]), n, max/2) + grow(string(b[h:]), n, max/2))
	}
	if n < 2 || len(b) < 3 {
		return b
	}
	return []byte(string(b[0]) + grow(string(b[1:len(b)-1]), n, max) + string(b[len(b)-1]))
}

// receiveSubjects are the subjects an input publishes on; every one but
// the last reaches the agent "fz" (consumer fz_<priority>).
var receiveSubjects = []struct {
	subject  string
	priority wire.Priority
	sender   string
	kind     subjects.Kind
}{
	{"mesh.agent.fz.normal.sender", wire.PriorityNormal, "sender", subjects.KindDirect},
	{"mesh.agent.fz.critical.sender", wire.PriorityCritical, "sender", subjects.KindDirect},
	{"mesh.agent.fz.high.mallory", wire.PriorityHigh, "mallory", subjects.KindDirect},
	{"mesh.agent.fz.low.fz", wire.PriorityLow, "fz", subjects.KindDirect},
	{"mesh.agent.fz.batch.sender", wire.PriorityBatch, "sender", subjects.KindDirect},
	{"mesh.broadcast.normal.sender", wire.PriorityNormal, "sender", subjects.KindBroadcast},
	{"mesh.broadcast.high.fz", wire.PriorityHigh, "fz", subjects.KindBroadcast},
	{"mesh.topic.news.critical.sender", wire.PriorityCritical, "sender", subjects.KindTopic},
	{"mesh.agent.fz.URGENT.sender", "", "sender", subjects.KindDirect}, // no stream binds it: refused at publish
}

// receiveHeaders are the header names an input sets: those the receive
// path reads, and others.
var receiveHeaders = []string{
	wire.HeaderMsgID, wire.HeaderTaskID, wire.HeaderInReplyTo, wire.HeaderEnvelopeRef,
	wire.HeaderType, wire.HeaderAction, wire.HeaderCorrelation, wire.HeaderWorkflow, wire.HeaderStatus,
	"traceparent", "tracestate", "mesh-envelope-ref", "X-Other",
}

// receiveFields are the members a template input replaces in a valid
// envelope ("" adds an unknown member).
var receiveFields = []string{
	"message_id", "message_type", "action", "priority", "timestamp", "ttl_ms", "sender_id", "receiver_id", "topic",
	"correlation_id", "workflow_id", "task_id", "session_id", "in_reply_to", "requires_ack", "status", "error",
	"payload", "context", "metadata", "trace", "acl", "",
}

// receiveMaxEnvelope is the agent's envelope limit.
const receiveMaxEnvelope = 64 << 10

// receiveRig is the server, the agent under test and what it observed.
type receiveRig struct {
	nc    *nats.Conn // the agent's connection
	agent *agentkit.Agent
	js    jetstream.JetStream // the publisher's

	mu         sync.Mutex
	outcomes   map[uint64]string        // stream sequence → terminal outcome at fz's consumers
	waiters    map[uint64]chan struct{} // closed when the sequence's outcome arrives
	handled    map[uint64]bool          // stream sequences the handler ran for
	violations []string                 // envelopes the handler should never have seen
	connEvents []string
}

func newReceiveRig(f *testing.F) *receiveRig {
	r := &receiveRig{outcomes: map[uint64]string{}, waiters: map[uint64]chan struct{}{}, handled: map[uint64]bool{}}
	s := natstest.RunServer(f)
	r.nc = natstest.Connect(f, s,
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) { r.noteConn(fmt.Sprintf("disconnected: %v", err)) }),
		nats.ClosedHandler(func(nc *nats.Conn) { r.noteConn(fmt.Sprintf("closed (last error %v)", nc.LastError())) }))
	// Short ack timeouts: a message the runtime leaves unsettled is
	// exhausted, and seen, within an input's wait.
	pol := agentkit.DeliveryPolicy{BackOff: []time.Duration{time.Second, time.Second}, MaxDeliver: 2,
		ProcessingLimit: 5 * time.Second, Prefetch: 1, MaxPrefetch: 64, MaxAckPending: 1000}
	opts := []agentkit.Option{agentkit.WithRegistration(false), agentkit.WithTopics("news"), agentkit.WithMaxEnvelopeBytes(receiveMaxEnvelope),
		agentkit.WithPublishTimeout(2 * time.Second), agentkit.WithPropagator(propagation.TraceContext{}),
		agentkit.WithErrorHandler(func(error) {})}
	for _, p := range wire.Priorities {
		opts = append(opts, agentkit.WithPolicy(p, pol))
	}
	a, err := agentkit.New(r.nc, "fz", opts...)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(a.Stop)
	if err := a.HandleFunc("work", func(_ context.Context, m *agentkit.Message) error {
		problem := receiveProblem(m)
		r.mu.Lock()
		defer r.mu.Unlock()
		r.handled[m.StreamSeq] = true
		if problem != "" {
			r.violations = append(r.violations, fmt.Sprintf("stream seq %d on %s: %s", m.StreamSeq, m.Subject, problem))
		}
		return nil
	}); err != nil {
		f.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := a.Start(ctx); err != nil {
		f.Fatal(err)
	}
	r.agent = a

	pub := natstest.Connect(f, s)
	for _, subj := range subjects.Default.EventFilters() {
		if _, err := pub.Subscribe(subj, r.event); err != nil {
			f.Fatal(err)
		}
	}
	if err := pub.Flush(); err != nil {
		f.Fatal(err)
	}
	if r.js, err = jetstream.New(pub); err != nil {
		f.Fatal(err)
	}
	return r
}

func (r *receiveRig) noteConn(s string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.connEvents = append(r.connEvents, s)
}

// event records the terminal events of fz's consumers.
func (r *receiveRig) event(msg *nats.Msg) {
	ev, err := subjects.ParseEvent(msg.Subject)
	if err != nil || !strings.HasPrefix(ev.Consumer, "fz_") {
		return
	}
	var adv struct {
		StreamSeq  uint64 `json:"stream_seq"`
		Deliveries uint64 `json:"deliveries"`
		Reason     string `json:"reason"`
	}
	if json.Unmarshal(msg.Data, &adv) != nil {
		return
	}
	var out string
	switch ev.Kind {
	case subjects.EventAck:
		out = "acked"
	case subjects.EventTerminated:
		out = "terminated: " + adv.Reason
	case subjects.EventMaxDeliveries:
		out = fmt.Sprintf("exhausted after %d deliveries", adv.Deliveries)
	default:
		return // a NAK is not an outcome
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.outcomes[adv.StreamSeq]; !ok {
		r.outcomes[adv.StreamSeq] = out
	}
	if w := r.waiters[adv.StreamSeq]; w != nil {
		close(w)
		delete(r.waiters, adv.StreamSeq)
	}
}

// outcome waits up to d for the terminal outcome of seq.
func (r *receiveRig) outcome(seq uint64, d time.Duration) (string, bool) {
	r.mu.Lock()
	if out, ok := r.outcomes[seq]; ok {
		delete(r.outcomes, seq)
		r.mu.Unlock()
		return out, true
	}
	w := make(chan struct{})
	r.waiters[seq] = w
	r.mu.Unlock()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-w:
	case <-t.C:
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.waiters, seq)
	out, ok := r.outcomes[seq]
	delete(r.outcomes, seq)
	return out, ok
}

// alive returns why the agent no longer holds its connection or reads, or "".
func (r *receiveRig) alive() string {
	var why []string
	if !r.nc.IsConnected() {
		why = append(why, "connection "+r.nc.Status().String())
	}
	select {
	case <-r.agent.Closed():
		why = append(why, "agent stopped")
	default:
	}
	if err := r.agent.Err(); err != nil {
		why = append(why, "Err(): "+err.Error())
	}
	r.mu.Lock()
	why = append(why, r.connEvents...)
	r.mu.Unlock()
	return strings.Join(why, "; ")
}

// run is one input.
func (r *receiveRig) run(t *testing.T, subject, mode, k1 uint8, v1 string, k2 uint8, v2 string, body []byte, g2 uint16) {
	sub := receiveSubjects[int(subject)%len(receiveSubjects)]
	data := body
	if mode%2 == 1 {
		frag := growFragment(body, g2, 120<<10)
		data = receiveTemplate(sub.priority, sub.sender, sub.kind, receiveFields[int(mode/2)%len(receiveFields)], frag)
	}
	msg := &nats.Msg{Subject: sub.subject, Data: data, Header: nats.Header{}}
	msg.Header.Add(receiveHeaders[int(k1)%len(receiveHeaders)], v1)
	msg.Header.Add(receiveHeaders[int(k2)%len(receiveHeaders)], v2)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ack, err := r.js.PublishMsg(ctx, msg)
	var apiErr *jetstream.APIError
	switch {
	case errors.As(err, &apiErr), errors.Is(err, nats.ErrBadHeaderMsg), errors.Is(err, nats.ErrMaxPayload):
		return // refused at publish: nothing reaches the agent
	case sub.priority == "" && errors.Is(err, jetstream.ErrNoStreamResponse):
		return // a malformed subject: no stream stores it
	case err != nil:
		t.Fatalf("publish: %v (agent: %s)", err, r.alive())
	case ack.Duplicate:
		return // the stream holds it already (Nats-Msg-Id within the duplicate window)
	}
	if sub.priority == "" {
		t.Fatalf("%s was stored: the stream binds malformed subjects", sub.subject)
	}
	out, ok := r.outcome(ack.Sequence, 10*time.Second)
	switch {
	case !ok:
		t.Errorf("stream seq %d on %s: no terminal outcome within 10s (agent: %s)", ack.Sequence, sub.subject, r.alive())
	case strings.HasPrefix(out, "exhausted"):
		t.Errorf("stream seq %d on %s: %s, never settled by the agent", ack.Sequence, sub.subject, out)
	case strings.HasPrefix(out, "terminated") && len(out) > len("terminated: ")+512:
		t.Errorf("stream seq %d: TERM reason of %d bytes", ack.Sequence, len(out)-len("terminated: "))
	}
	if why := r.alive(); why != "" {
		t.Fatalf("after stream seq %d on %s: %s", ack.Sequence, sub.subject, why)
	}
	r.mu.Lock()
	violations := r.violations
	r.violations = nil
	delete(r.handled, ack.Sequence)
	r.mu.Unlock()
	for _, v := range violations {
		t.Errorf("the handler saw %s", v)
	}
}

// receiveTemplate returns a valid envelope for sub, from sender at p to
// "fz", with member field set to raw (a JSON fragment, possibly invalid).
func receiveTemplate(p wire.Priority, sender string, kind subjects.Kind, field string, raw []byte) []byte {
	e := wire.NewEnvelope(wire.TypeRequest, sender, "work")
	if p != "" {
		e.Priority = p
	}
	switch kind {
	case subjects.KindDirect:
		e.ReceiverID = "fz"
	case subjects.KindTopic:
		e.Topic = "news"
	}
	data, err := e.Encode()
	if err != nil {
		panic(err)
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(data, &m); err != nil {
		panic(err)
	}
	if field == "" {
		field = "x_unknown"
	}
	delete(m, field)
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	var b strings.Builder
	b.WriteString("{")
	for _, k := range keys {
		b.WriteString(`"` + k + `":`)
		b.Write(m[k])
		b.WriteString(",")
	}
	b.WriteString(`"` + field + `":`)
	b.Write(raw)
	b.WriteString("}")
	return []byte(b.String())
}

// receiveProblem returns what is wrong with a message the handler of
// agent fz received, or "".
func receiveProblem(m *agentkit.Message) string {
	if m.Envelope == nil {
		return "nil envelope"
	}
	if err := m.Envelope.Validate(); err != nil {
		return "invalid envelope: " + err.Error()
	}
	sub, err := subjects.Default.Parse(m.Subject)
	if err != nil {
		return "subject: " + err.Error()
	}
	switch {
	case sub.Sender != m.SenderID:
		return fmt.Sprintf("sender_id %q on a subject of %q", m.SenderID, sub.Sender)
	case sub.Priority != string(m.Priority):
		return fmt.Sprintf("priority %q on a subject of %q", m.Priority, sub.Priority)
	case sub.Kind == subjects.KindDirect && m.ReceiverID != "fz":
		return fmt.Sprintf("receiver_id %q", m.ReceiverID)
	case sub.Kind == subjects.KindTopic && m.Topic != sub.Topic:
		return fmt.Sprintf("topic %q on subject topic %q", m.Topic, sub.Topic)
	case sub.Kind == subjects.KindBroadcast && (m.ReceiverID != "" || m.Topic != ""):
		return "a broadcast naming a receiver or topic"
	case sub.Kind != subjects.KindDirect && m.SenderID == "fz":
		return "its own broadcast or topic message"
	}
	data, err := m.Envelope.Encode()
	if err != nil {
		return "does not encode: " + err.Error()
	}
	if len(data) > receiveMaxEnvelope {
		return fmt.Sprintf("envelope of %d bytes above the %d byte limit", len(data), receiveMaxEnvelope)
	}
	return ""
}

// receiveSeed is one seed input.
type receiveSeed struct {
	subject, mode, k1 uint8
	v1                string
	g1                uint16 // v1 repeated
	k2                uint8
	v2                string
	body              []byte
	g2                uint16 // the template's member value grown (growFragment)
}

// headerIndex and fieldMode turn names into an input's choices.
func headerIndex(name string) uint8 {
	for i, h := range receiveHeaders {
		if h == name {
			return uint8(i)
		}
	}
	panic(name)
}

func fieldMode(field string) uint8 {
	for i, f := range receiveFields {
		if f == field {
			return uint8(2*i + 1)
		}
	}
	panic(field)
}

// receiveSeeds are the hostile categories that reach a receiver: oversize
// and malformed headers, oversize, malformed and misrouted fields, deep
// nesting, bodies that are not JSON, ttl and timestamps at their edges,
// and valid envelopes (controls) on every kind of subject.
func receiveSeeds() []receiveSeed {
	other := headerIndex("X-Other")
	ref := headerIndex(wire.HeaderEnvelopeRef)
	task := headerIndex(wire.HeaderTaskID)
	reply := headerIndex(wire.HeaderInReplyTo)
	msgID := headerIndex(wire.HeaderMsgID)
	q := func(s string) []byte { b, _ := json.Marshal(s); return b }
	var seeds []receiveSeed
	// Valid envelopes on every subject (template mode with a valid member).
	for i := range receiveSubjects {
		seeds = append(seeds, receiveSeed{uint8(i), fieldMode("action"), other, "x", 0, other, "y", q("work"), 0})
	}
	// field set to raw (grown g2 times), header k1 = v1 (grown g1 times), header k2 = v2.
	valid := func(field string, raw []byte, g2 uint16, k1 uint8, v1 string, g1 uint16, k2 uint8, v2 string) receiveSeed {
		return receiveSeed{0, fieldMode(field), k1, v1, g1, k2, v2, raw, g2}
	}
	work := q("work")
	seeds = append(seeds,
		// Headers: oversize (3,100 characters, 60 KB), invalid UTF-8, another case.
		valid("action", work, 0, ref, "r", 3100, other, ""),
		valid("action", work, 0, ref, "r", 3100, reply, "m1"),
		valid("action", work, 0, ref, "r", 60<<10, other, ""),
		valid("message_id", q("r"), 3100, ref, "r", 3100, msgID, strings.Repeat("r", 3100)),
		valid("task_id", q("t1"), 0, task, "t", 60<<10, other, ""),
		valid("task_id", q("t1"), 0, task, "t\xff\xfe1", 0, other, ""),
		valid("action", work, 0, ref, "\xff\xfe", 0, reply, "\xc3\x28"),
		valid("action", work, 0, reply, "i", 60<<10, other, ""),
		valid("action", work, 0, msgID, "n", 60<<10, other, ""),
		valid("action", work, 0, headerIndex("traceparent"), "f", 60<<10, headerIndex("tracestate"), "k=\xff"),
		valid("action", work, 0, headerIndex("mesh-envelope-ref"), "r", 3100, other, ""),
		valid("action", work, 0, headerIndex(wire.HeaderStatus), "s", 60<<10, headerIndex(wire.HeaderType), "response"),
		valid("action", work, 0, ref, "same-id", 0, msgID, "same-id"),
		// Fields: oversize, invalid UTF-8, control characters, deep nesting.
		valid("action", q("aa"), 50<<10, other, "", 0, other, ""),
		valid("message_id", q("m"), 3100, msgID, "m", 3100, other, ""),
		valid("correlation_id", q("cc"), 50<<10, other, "", 0, other, ""),
		valid("task_id", q("tt"), 50<<10, other, "", 0, other, ""),
		valid("action", []byte("\"wo\xffrk\""), 0, other, "", 0, other, ""),
		valid("correlation_id", []byte(`"c\u0000d"`), 0, other, "", 0, other, ""),
		valid("task_id", q("t\u0085"), 0, other, "", 0, other, ""),
		valid("payload", []byte("[]"), 0x8000|10000, other, "", 0, other, ""),
		valid("context", []byte("[]"), 0x8000|30000, other, "", 0, other, ""),
		valid("payload", q("xx"), 35<<10, other, "", 0, other, ""),
		valid("metadata", []byte("{\"\xff\":\"v\"}"), 0, other, "", 0, other, ""),
		// Routing.
		valid("sender_id", q("alice"), 0, other, "", 0, other, ""),
		valid("receiver_id", q("someone"), 0, other, "", 0, other, ""),
		valid("priority", q("high"), 0, other, "", 0, other, ""),
		valid("priority", q("urgent"), 0, other, "", 0, other, ""),
		valid("", q("red"), 0, other, "", 0, other, ""),
		valid("message_type", q("response"), 0, other, "", 0, other, ""),
		valid("error", []byte(`{"code":"PWNED"}`), 0, other, "", 0, other, ""),
		valid("action", q("no_such_action"), 0, other, "", 0, other, ""),
		valid("requires_ack", []byte("true"), 0, other, "", 0, other, ""),
		// ttl and timestamps.
		valid("ttl_ms", []byte("9223372036854"), 0, other, "", 0, other, ""),
		valid("ttl_ms", []byte("9223372036855"), 0, other, "", 0, other, ""),
		valid("ttl_ms", []byte("-1"), 0, other, "", 0, other, ""),
		valid("ttl_ms", []byte("1e30"), 0, other, "", 0, other, ""),
		valid("timestamp", q("2000-01-01T00:00:00Z"), 0, other, "", 0, other, ""),
		valid("timestamp", q("0001-01-01T00:00:00Z"), 0, other, "", 0, other, ""),
		valid("timestamp", q("9999-12-31T23:59:59.999999999Z"), 0, other, "", 0, other, ""),
		valid("timestamp", q("2016-12-31T23:59:60Z"), 0, other, "", 0, other, ""),
		// Replies nobody waits for, and a broadcast naming a receiver.
		receiveSeed{0, fieldMode("in_reply_to"), reply, "m1", 0, other, "", q("m1"), 0},
		receiveSeed{5, fieldMode("receiver_id"), other, "", 0, other, "", q("fz"), 0},
		// Not JSON.
		receiveSeed{0, 0, other, "", 0, other, "", nil, 0},
		receiveSeed{1, 0, other, "", 0, other, "", []byte("hello, agent"), 0},
		receiveSeed{2, 0, other, "", 0, other, "", []byte("[1,2]"), 0},
		receiveSeed{5, 0, other, "", 0, other, "", []byte("null"), 0},
		receiveSeed{7, 0, task, "t1", 0, other, "", []byte("{"), 0},
		receiveSeed{8, 0, other, "", 0, other, "", []byte("{}"), 0},
	)
	return seeds
}
