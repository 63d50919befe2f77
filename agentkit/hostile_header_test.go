package agentkit_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
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

// Headers and fields a peer controls are bounded before the runtime builds
// a subject, a reason or a log record from them: each message below is
// terminated as INVALID with a short reason, and the receiving agent keeps
// its connection and keeps consuming. A Mesh-Envelope-Ref of 3,100
// characters used to make the server close the receiver's connection (the
// object's subject exceeded the server's control line).
func TestHostileInput_BoundedBeforeUse(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	adv := m.watchAdvisories()
	var rec recorder
	errs := &asyncErrors{}
	recv := m.started("recv", map[string]agentkit.HandlerFunc{"work": rec.handle(nil)}, agentkit.WithErrorHandler(errs.add))
	js, err := jetstream.New(m.conn())
	if err != nil {
		t.Fatal(err)
	}
	valid := func() []byte { return rawEnvelope(t, func(map[string]any) {}) }
	withID := func(id string) []byte { return rawEnvelope(t, func(m map[string]any) { m["message_id"] = id }) }
	long := strings.Repeat("r", 3100)
	tests := []struct {
		name   string
		data   []byte
		header nats.Header
		reason string // must appear in the TERM reason
	}{
		{"oversize envelope ref", valid(), nats.Header{wire.HeaderEnvelopeRef: {long}}, "Mesh-Envelope-Ref"},
		{"oversize envelope ref naming the message", withID(long), nats.Header{wire.HeaderEnvelopeRef: {long}, wire.HeaderMsgID: {long}}, "message_id"},
		{"envelope ref not the message id", valid(), nats.Header{wire.HeaderEnvelopeRef: {"other"}, wire.HeaderMsgID: {"mine"}}, `"other" is not the message's Nats-Msg-Id "mine"`},
		{"envelope ref with a line break", withID("a\r\nb"), nats.Header{wire.HeaderEnvelopeRef: {"a\r\nb"}}, "Mesh-Envelope-Ref"},
		{"oversize task header", rawEnvelope(t, func(m map[string]any) { m["task_id"] = "t1" }),
			nats.Header{wire.HeaderTaskID: {strings.Repeat("t", 60<<10)}}, "(61440 bytes)"},
		{"oversize action", rawEnvelope(t, func(m map[string]any) { m["action"] = strings.Repeat("a", 100<<10) }), nil, "action: longer than 256 characters"},
		{"oversize priority", rawEnvelope(t, func(m map[string]any) { m["priority"] = strings.Repeat("p", 100<<10) }), nil, "unknown priority"},
		{"control character in an id", rawEnvelope(t, func(m map[string]any) { m["correlation_id"] = "c\r\nNats-Msg-Id: x" }), nil, "correlation_id: contains a control character"},
		{"oversize unknown member", rawEnvelope(t, func(m map[string]any) { m[strings.Repeat("k", 50<<10)] = 1 }), nil, "not a JSON envelope"},
	}
	for _, tt := range tests {
		ack, err := js.PublishMsg(ctx(t), &nats.Msg{Subject: "mesh.agent.recv.normal.sender", Data: tt.data, Header: tt.header})
		if err != nil {
			t.Fatalf("%s: publish: %v", tt.name, err)
		}
		eventually(t, 10*time.Second, tt.name+" terminated", func() bool { return len(adv.of(subjects.EventTerminated, ack.Sequence)) == 1 })
		reason := adv.of(subjects.EventTerminated, ack.Sequence)[0].Reason
		if !strings.HasPrefix(reason, "INVALID: ") || !strings.Contains(reason, tt.reason) {
			t.Errorf("%s: TERM reason %q, want it to contain %q", tt.name, reason, tt.reason)
		}
		if len(reason) > 512 {
			t.Errorf("%s: TERM reason of %d bytes, want at most 512", tt.name, len(reason))
		}
	}
	if rec.count() != 0 {
		t.Fatalf("a handler saw %d bad messages", rec.count())
	}
	for _, err := range errs.got {
		if len(err.Error()) > 2048 {
			t.Errorf("error handler got a %d byte error: %.200s", len(err.Error()), err)
		}
	}
	sender := m.agent("sender")
	if _, err := sender.Send(ctx(t), "recv", "work", nil); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "a valid message after the bad ones", func() bool { return rec.count() == 1 })
	select {
	case <-recv.Closed():
		t.Fatal("the receiver stopped")
	default:
	}
	if err := recv.Err(); err != nil {
		t.Fatalf("Err() = %v", err)
	}
}

// An agent whose connection the server closes stops, says why through its
// error handler and Err, and fires Closed; it used to keep running with
// dead readers, its only sign an error every few seconds.
func TestConnectionClosed_StopsTheAgent(t *testing.T) {
	t.Parallel()
	for _, by := range []string{"server", "owner"} {
		t.Run(by, func(t *testing.T) {
			t.Parallel()
			m := newMesh(t)
			nc := natstest.Connect(t, m.s, nats.NoReconnect())
			errs := &asyncErrors{}
			a, err := agentkit.New(nc, "recv", agentkit.WithErrorHandler(errs.add))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(a.Stop)
			if err := a.HandleFunc("work", func(context.Context, *agentkit.Message) error { return nil }); err != nil {
				t.Fatal(err)
			}
			if err := a.Start(ctx(t)); err != nil {
				t.Fatal(err)
			}
			if by == "server" {
				id, err := nc.GetClientID()
				if err != nil {
					t.Fatal(err)
				}
				if err := m.s.DisconnectClientByID(id); err != nil {
					t.Fatal(err)
				}
			} else {
				nc.Close()
			}
			select {
			case <-a.Closed():
			case <-ctx(t).Done():
				t.Fatal("Closed() did not fire after the connection closed")
			}
			if err := a.Err(); !errors.Is(err, agentkit.ErrConnClosed) {
				t.Fatalf("Err() = %v, want ErrConnClosed", err)
			}
			if errs.count(agentkit.ErrConnClosed) != 1 {
				t.Fatalf("error handler got ErrConnClosed %d times, want once", errs.count(agentkit.ErrConnClosed))
			}
			if err := a.Start(ctx(t)); err == nil {
				t.Fatal("a stopped agent started again")
			}
		})
	}
}

// A sender cannot flood the receiver's log: of 200 invalid messages, a
// handful are logged, each saying how many were left out; all 200 are
// counted.
func TestInvalidInput_LogIsSampled(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	var buf natstest.SyncBuffer
	logger := slog.New(slog.NewTextHandler(&buf, nil))
	recv := m.started("recv", map[string]agentkit.HandlerFunc{"work": func(context.Context, *agentkit.Message) error { return nil }},
		agentkit.WithLogger(logger))
	nc := m.conn()
	const n = 200
	for range n {
		if err := nc.Publish("mesh.agent.recv.normal.sender", []byte("not an envelope")); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 20*time.Second, "every invalid message terminated", func() bool {
		return recv.Stats().Outcomes[agentkit.OutcomeInvalid] == n
	})
	records := bytes.Count([]byte(buf.String()), []byte("invalid message terminated"))
	if records == 0 || records > 20 {
		t.Fatalf("%d log records for %d invalid messages, want between 1 and 20", records, n)
	}
}

// A nil handler is refused when it is registered, not found per message.
func TestHandleFunc_NilRefused(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	a := m.agent("recv")
	if err := a.HandleFunc("work", nil); !errors.Is(err, agentkit.ErrInvalidOption) {
		t.Fatalf("HandleFunc(nil) err = %v, want ErrInvalidOption", err)
	}
	if err := a.Handle(strings.Repeat("a", 300), agentkit.HandlerFunc(func(context.Context, *agentkit.Message) error { return nil })); !errors.Is(err, agentkit.ErrInvalidOption) {
		t.Fatalf("Handle(300-character action) err = %v, want ErrInvalidOption", err)
	}
}

// A forged Nats-Pin-Id header is terminated as INVALID, and the agent
// keeps reading that priority: nats.go had taken the header for a pin and
// sent it with every later pull, which the server refused (400) for good.
func TestHostileInput_ForgedPinID(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	adv := m.watchAdvisories()
	var rec recorder
	recv := m.started("recv", map[string]agentkit.HandlerFunc{"work": rec.handle(nil)})
	forgePin(t, m, adv, "recv")
	sender := m.agent("sender")
	for i := range 3 {
		if _, err := sender.Send(ctx(t), "recv", "work", nil); err != nil {
			t.Fatal(err)
		}
		eventually(t, 20*time.Second, "a good message after the forged pin", func() bool { return rec.count() == i+1 })
	}
	if err := recv.Err(); err != nil {
		t.Fatalf("Err() = %v after the reader read again", err)
	}
}

// forgePin publishes to receiver a message carrying a forged Nats-Pin-Id
// header and waits until the receiver terminated it.
func forgePin(t *testing.T, m *mesh, adv *advisories, receiver string) {
	t.Helper()
	js, err := jetstream.New(m.conn())
	if err != nil {
		t.Fatal(err)
	}
	ack, err := js.PublishMsg(ctx(t), &nats.Msg{Subject: "mesh.agent." + receiver + ".normal.sender", Data: rawEnvelope(t, func(map[string]any) {}),
		Header: nats.Header{"Nats-Pin-Id": {"forged-pin"}}})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the forged pin terminated", func() bool { return len(adv.of(subjects.EventTerminated, ack.Sequence)) == 1 })
}

// A large envelope whose object the sender made wrong (a link, metadata
// that is not JSON) is terminated as INVALID at once, never retried: it
// used to be NAKed as if the store were unreachable until its attempts ran
// out, and a link was followed past the size limit.
func TestHostileInput_PayloadObjectFaults(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	adv := m.watchAdvisories()
	var rec recorder
	m.started("recv", map[string]agentkit.HandlerFunc{"work": rec.handle(nil)}, agentkit.WithMaxEnvelopeBytes(64<<10))
	nc := m.conn()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	store, err := js.CreateOrUpdateObjectStore(ctx(t), jetstream.ObjectStoreConfig{Bucket: subjects.Default.PayloadsBucket()})
	if err != nil {
		t.Fatal(err)
	}
	big, err := store.PutBytes(ctx(t), "big", []byte(strings.Repeat("x", 128<<10)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.AddLink(ctx(t), "link-id", big); err != nil {
		t.Fatal(err)
	}
	// Metadata that is not JSON, where the object store keeps it.
	if _, err := js.Publish(ctx(t), "$O."+subjects.Default.PayloadsBucket()+".M.YmFkLWlk", []byte("not json")); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct{ id, reason string }{
		{"link-id", "is a link"},
		{"bad-id", "metadata is not valid"},
	} {
		data := rawEnvelope(t, func(m map[string]any) { m["message_id"] = tt.id })
		ack, err := js.PublishMsg(ctx(t), &nats.Msg{Subject: "mesh.agent.recv.normal.sender", Data: data,
			Header: nats.Header{wire.HeaderEnvelopeRef: {tt.id}, wire.HeaderMsgID: {tt.id}}})
		if err != nil {
			t.Fatal(err)
		}
		eventually(t, 10*time.Second, tt.id+" terminated", func() bool { return len(adv.of(subjects.EventTerminated, ack.Sequence)) == 1 })
		if reason := adv.of(subjects.EventTerminated, ack.Sequence)[0].Reason; !strings.Contains(reason, tt.reason) {
			t.Errorf("%s: TERM reason %q, want it to contain %q", tt.id, reason, tt.reason)
		}
		if naks := adv.of(subjects.EventNak, ack.Sequence); len(naks) != 0 {
			t.Errorf("%s: NAKed %d times before its TERM", tt.id, len(naks))
		}
	}
	if rec.count() != 0 {
		t.Fatalf("a handler saw %d bad messages", rec.count())
	}
}

// An empty body with a Status header is taken by nats.go for a status
// message of the server, whatever subject it came on: the runtime never
// sees it, so it cannot terminate it; it is redelivered until its
// attempts run out (MAX_DELIVERIES, which the ack monitor dead-letters and
// holds against the sender), and a 409 or 400 ends the reader's iterator,
// which costs messages in flight an attempt. This pins down that known
// limit of the client library: the agent neither handles such a message
// nor stops consuming because of it.
func TestHostileInput_ForgedStatusMessages(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	adv := m.watchAdvisories()
	var rec recorder
	short := fastPolicy(300*time.Millisecond, 300*time.Millisecond)
	recv := m.started("recv", map[string]agentkit.HandlerFunc{"work": rec.handle(nil)}, agentkit.WithPolicy(wire.PriorityBatch, short))
	js, err := jetstream.New(m.conn())
	if err != nil {
		t.Fatal(err)
	}
	var seqs []uint64
	for _, h := range []nats.Header{
		{"Status": {"404"}, "Description": {"No Messages"}},
		{"Status": {"409"}, "Description": {"Consumer Deleted"}},
		{"Status": {"100"}, "Description": {"Idle Heartbeat"}},
		{"Status": {"408"}, "Nats-Pending-Messages": {"lots"}},
		{"Status": {"400"}, "Description": {"Bad Request"}},
	} {
		ack, err := js.PublishMsg(ctx(t), &nats.Msg{Subject: "mesh.agent.recv.batch.sender", Header: h})
		if err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, ack.Sequence)
	}
	for _, seq := range seqs {
		eventually(t, 30*time.Second, "the forged status message exhausted", func() bool {
			return len(adv.of(subjects.EventMaxDeliveries, seq)) == 1
		})
	}
	sender := m.agent("sender")
	if _, err := sender.Send(ctx(t), "recv", "work", nil, agentkit.WithPriority(wire.PriorityBatch)); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "a good message after the forged ones", func() bool { return rec.count() == 1 })
	if n := recv.Stats().Outcomes[agentkit.OutcomeInvalid]; n != 0 {
		t.Fatalf("%d forged status messages reached the runtime: nats.go now passes them on, so this limit is gone; update the test and the docs", n)
	}
	select {
	case <-recv.Closed():
		t.Fatal("the receiver stopped")
	default:
	}
}
