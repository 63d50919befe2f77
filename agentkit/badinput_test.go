package agentkit_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/internal/natstest"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// rawEnvelope is a request from "sender" to "recv", as JSON.
func rawEnvelope(t *testing.T, mutate func(map[string]any)) []byte {
	t.Helper()
	e := wire.NewEnvelope(wire.TypeRequest, "sender", "work")
	e.ReceiverID = "recv"
	b, err := e.Encode()
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	mutate(m)
	b, err = json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Anything on a mesh subject that is not a valid envelope for the agent is
// terminated with a reason naming the problem, never reaches a handler, and
// the agent keeps running.
func TestBadInput_TerminatedWithReason(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	adv := m.watchAdvisories()
	var rec recorder
	recv := m.started("recv", map[string]agentkit.HandlerFunc{"work": rec.handle(nil)}, agentkit.WithMaxEnvelopeBytes(4096))
	js, err := jetstream.New(m.conn())
	if err != nil {
		t.Fatal(err)
	}
	direct := "mesh.agent.recv.normal.sender"
	tests := []struct {
		name    string
		subject string
		data    []byte
		reason  string      // must appear in the TERM reason
		header  nats.Header // optional
	}{
		{"not JSON", direct, []byte("hello, agent"), "not a JSON envelope", nil},
		{"JSON array", direct, []byte(`[1,2]`), "not a JSON envelope", nil},
		{"missing message_id", direct, rawEnvelope(t, func(m map[string]any) { delete(m, "message_id") }), "message_id: required", nil},
		{"missing action", direct, rawEnvelope(t, func(m map[string]any) { delete(m, "action") }), "action: required", nil},
		{"unknown field", direct, rawEnvelope(t, func(m map[string]any) { m["colour"] = "red" }), "colour", nil},
		{"bad priority", direct, rawEnvelope(t, func(m map[string]any) { m["priority"] = "urgent" }), "urgent", nil},
		{"bad version", direct, rawEnvelope(t, func(m map[string]any) { m["acl"] = "2" }), "acl: unsupported version", nil},
		{"sender mismatch", direct, rawEnvelope(t, func(m map[string]any) { m["sender_id"] = "mallory" }), `sender_id "mallory" does not match the subject's sender "sender"`, nil},
		{"wrong receiver", direct, rawEnvelope(t, func(m map[string]any) { m["receiver_id"] = "other" }), `receiver_id "other" is not this agent "recv"`, nil},
		{"priority mismatch", direct, rawEnvelope(t, func(m map[string]any) { m["priority"] = "high" }), `priority "high" does not match`, nil},
		{"oversize", direct, rawEnvelope(t, func(m map[string]any) { m["payload"] = strings.Repeat("x", 5000) }), "exceeds the 4096 byte limit", nil},
		{"broadcast naming a receiver", "mesh.broadcast.normal.sender", rawEnvelope(t, func(map[string]any) {}), "a broadcast must name neither", nil},
		{"task header mismatch", direct, rawEnvelope(t, func(m map[string]any) { m["task_id"] = "t1" }),
			`task_id "t1" does not match the Mesh-Task-Id header "t2"`, nats.Header{wire.HeaderTaskID: {"t2"}}},
		{"task header mismatch on a reply", direct, rawEnvelope(t, func(m map[string]any) {
			m["message_type"], m["in_reply_to"], m["task_id"] = "response", "m1", "t1"
		}), `task_id "t1" does not match the Mesh-Task-Id header "t2"`, nats.Header{wire.HeaderTaskID: {"t2"}, wire.HeaderInReplyTo: {"m1"}}},
	}
	for _, tt := range tests {
		ack, err := js.PublishMsg(ctx(t), &nats.Msg{Subject: tt.subject, Data: tt.data, Header: tt.header})
		if err != nil {
			t.Fatalf("%s: publish: %v", tt.name, err)
		}
		eventually(t, 5*time.Second, tt.name+" terminated", func() bool { return len(adv.of(subjects.EventTerminated, ack.Sequence)) == 1 })
		term := adv.of(subjects.EventTerminated, ack.Sequence)[0]
		if !strings.HasPrefix(term.Reason, "INVALID: ") || !strings.Contains(term.Reason, tt.reason) {
			t.Errorf("%s: TERM reason %q, want it to contain %q", tt.name, term.Reason, tt.reason)
		}
	}
	if rec.count() != 0 {
		t.Fatalf("a handler saw %d bad messages", rec.count())
	}
	if n := recv.Stats().Outcomes[agentkit.OutcomeInvalid]; n != uint64(len(tests)) {
		t.Fatalf("invalid outcomes = %d, want %d", n, len(tests))
	}
	// Still running: a valid message is handled.
	sender := m.agent("sender")
	if _, err := sender.Send(ctx(t), "recv", "work", nil); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "valid message after bad ones", func() bool { return rec.count() == 1 })
}

// Invalid ids, topics and envelopes passed to the API fail before anything
// is published.
func TestBadInput_APIRejectsBeforePublishing(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	nc := m.conn()
	sender, err := agentkit.New(nc, "sender", agentkit.WithMaxEnvelopeBytes(1<<20))
	if err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(nc)
	if err := agentkit.EnsureStream(ctx(t), js, agentkit.StreamConfig(subjects.Default, 1)); err != nil {
		t.Fatal(err)
	}
	foreign := wire.NewEnvelope(wire.TypeRequest, "someone_else", "work")
	foreign.ReceiverID = "recv"
	tests := []struct {
		name    string
		call    func() error
		wantErr error
		field   string
	}{
		{"receiver with a dot", func() error { _, err := sender.Send(ctx(t), "re.cv", "work", nil); return err }, agentkit.ErrInvalidID, ""},
		{"receiver with a wildcard", func() error { _, err := sender.Send(ctx(t), "*", "work", nil); return err }, agentkit.ErrInvalidID, ""},
		{"topic with a space", func() error { _, err := sender.Publish(ctx(t), "my topic", "work", nil); return err }, agentkit.ErrInvalidID, ""},
		// An empty receiver or topic would make the message a broadcast.
		{"empty receiver", func() error { _, err := sender.Send(ctx(t), "", "work", nil); return err }, agentkit.ErrInvalidID, ""},
		{"empty receiver of a request", func() error { _, err := sender.Request(ctx(t), "", "work", nil); return err }, agentkit.ErrInvalidID, ""},
		{"empty receiver of SendAndWait", func() error { _, err := sender.SendAndWait(ctx(t), "", "work", nil); return err }, agentkit.ErrInvalidID, ""},
		{"empty receiver of NewRequest", func() error { _, err := sender.NewRequest(ctx(t), "", "work", nil); return err }, agentkit.ErrInvalidID, ""},
		{"empty topic", func() error { _, err := sender.Publish(ctx(t), "", "work", nil); return err }, agentkit.ErrInvalidID, ""},
		{"empty action", func() error { _, err := sender.Send(ctx(t), "recv", "", nil); return err }, wire.ErrInvalidEnvelope, "action"},
		{"unknown priority", func() error {
			_, err := sender.Send(ctx(t), "recv", "work", nil, agentkit.WithPriority("urgent"))
			return err
		}, wire.ErrInvalidEnvelope, "priority"},
		{"negative ttl", func() error {
			_, err := sender.Send(ctx(t), "recv", "work", nil, agentkit.WithTTL(-time.Second))
			return err
		}, wire.ErrInvalidEnvelope, "ttl_ms"},
		{"payload not JSON", func() error { _, err := sender.Send(ctx(t), "recv", "work", []byte("{oops")); return err }, wire.ErrInvalidEnvelope, ""},
		{"payload not marshalable", func() error { _, err := sender.Send(ctx(t), "recv", "work", make(chan int)); return err }, wire.ErrInvalidEnvelope, ""},
		{"above the envelope limit", func() error {
			_, err := sender.Send(ctx(t), "recv", "work", map[string]string{"blob": strings.Repeat("x", 2<<20)})
			return err
		}, agentkit.ErrPayloadTooLarge, ""},
		{"sender impersonation", func() error { return sender.SendEnvelope(ctx(t), foreign) }, wire.ErrInvalidEnvelope, ""},
	}
	for _, tt := range tests {
		err := tt.call()
		if !errors.Is(err, tt.wantErr) {
			t.Errorf("%s: err = %v, want %v", tt.name, err, tt.wantErr)
			continue
		}
		var ve *wire.ValidationError
		if tt.field != "" && (!errors.As(err, &ve) || ve.Field != tt.field) {
			t.Errorf("%s: err = %v, want a ValidationError on %s", tt.name, err, tt.field)
		}
	}
	info, err := js.Stream(ctx(t), "MESH")
	if err != nil {
		t.Fatal(err)
	}
	if n := info.CachedInfo().State.Msgs; n != 0 {
		t.Fatalf("%d messages were published", n)
	}
	for _, id := range []string{"", "a.b", "has space", strings.Repeat("x", 65)} {
		if _, err := agentkit.New(nc, id); !errors.Is(err, agentkit.ErrInvalidID) {
			t.Errorf("New(%q) err = %v, want ErrInvalidID", id, err)
		}
	}
	for _, opt := range []agentkit.Option{
		agentkit.WithConcurrency(0),
		agentkit.WithPolicy(wire.PriorityHigh, agentkit.DeliveryPolicy{MaxAckPending: -1}),
		agentkit.WithPolicy(wire.PriorityHigh, agentkit.DeliveryPolicy{BackOff: []time.Duration{time.Second, time.Second}, MaxDeliver: 1, ProcessingLimit: time.Second, Prefetch: 1, MaxAckPending: 1}),
		agentkit.WithPolicy("urgent", fastPolicy(time.Second)),
		agentkit.WithTopics("a.b"),
		agentkit.WithReplicas(0),
		agentkit.WithMaxEnvelopeBytes(1),
	} {
		if _, err := agentkit.New(nc, "x", opt); !errors.Is(err, agentkit.ErrInvalidOption) && !errors.Is(err, agentkit.ErrInvalidID) {
			t.Errorf("New with a bad option: err = %v, want ErrInvalidOption", err)
		}
	}
}

// A dead server is a clear error within the caller's deadline, not a hang.
func TestBadInput_DeadServer(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	nc := natstest.Connect(t, s, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	a, err := agentkit.New(nc, "sender", agentkit.WithPublishTimeout(800*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(nc)
	if err := agentkit.EnsureStream(ctx(t), js, agentkit.StreamConfig(subjects.Default, 1)); err != nil {
		t.Fatal(err)
	}
	s.Shutdown()
	start := time.Now()
	_, err = a.Send(context.Background(), "recv", "work", nil)
	// The message waits in the client's reconnect buffer and goes out if
	// the server comes back: it may yet be stored, not "not stored".
	if !errors.Is(err, agentkit.ErrPublishUnconfirmed) || errors.Is(err, agentkit.ErrPublish) || !agentkit.IsRetryable(err) {
		t.Fatalf("err = %v, want ErrPublishUnconfirmed", err)
	}
	if waited := time.Since(start); waited > 2*time.Second {
		t.Fatalf("Send took %v with an 800ms publish timeout", waited)
	}
	if a.Stats().PublishRetries == 0 {
		t.Fatal("no publish retries recorded")
	}
}
