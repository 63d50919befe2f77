package agentkit_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/dlq"
	"github.com/agentmesh-io/agentmesh/internal/natstest"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// Envelopes above the server's max payload (1 MiB by default) travel
// through the object store; handlers see the payload as if inline, and the
// object is removed once the message is acked.
func TestLargePayload_ClaimCheck(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	if max := m.conn().MaxPayload(); max != 1<<20 {
		t.Fatalf("server max payload %d, want the 1 MiB default", max)
	}
	got := make(chan *agentkit.Message, 2)
	m.started("analyst", map[string]agentkit.HandlerFunc{"analyze": func(ctx context.Context, msg *agentkit.Message) error {
		got <- msg
		return msg.Reply(ctx, "analyzed", map[string]int{"bytes": len(msg.Payload)})
	}})
	orch := m.started("orch", nil)
	js, _ := jetstream.New(m.conn())
	for _, size := range []int{1 << 20, 8 << 20} {
		raw := make([]byte, size*3/4)
		rand.Read(raw)
		payload, _ := json.Marshal(map[string]string{"blob": base64.StdEncoding.EncodeToString(raw)})
		reply, err := orch.Request(ctx(t), "analyst", "analyze", json.RawMessage(payload))
		if err != nil {
			t.Fatalf("%d bytes: %v", size, err)
		}
		msg := <-got
		if !bytes.Equal(msg.Payload, payload) {
			t.Fatalf("%d bytes: handler saw %d payload bytes, not the %d sent", size, len(msg.Payload), len(payload))
		}
		var ans struct{ Bytes int }
		if json.Unmarshal(reply.Payload, &ans); ans.Bytes != len(payload) {
			t.Fatalf("reply %s", reply.Payload)
		}
		// Stored out of band: the stream holds only the stub.
		stream, err := js.Stream(ctx(t), "MESH")
		if err != nil {
			t.Fatal(err)
		}
		raw1, err := stream.GetMsg(ctx(t), msg.StreamSeq)
		if err != nil {
			t.Fatal(err)
		}
		if len(raw1.Data) > 4096 || raw1.Header.Get(wire.HeaderEnvelopeRef) != msg.MessageID {
			t.Fatalf("stream message is %d bytes with ref %q", len(raw1.Data), raw1.Header.Get(wire.HeaderEnvelopeRef))
		}
		obs, err := js.ObjectStore(ctx(t), "mesh_payloads")
		if err != nil {
			t.Fatal(err)
		}
		eventually(t, 5*time.Second, "object removed after ack", func() bool {
			_, err := obs.GetInfo(ctx(t), msg.MessageID)
			return errors.Is(err, jetstream.ErrObjectNotFound)
		})
	}
}

// A redelivery of a large message already handled (a lost ack, a
// consumer reset) is acked as a duplicate without fetching its envelope,
// which its first ack removed from the object store.
func TestLargePayload_RedeliveryIsADuplicate(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	var handled atomic.Int64
	recv := m.started("recv", map[string]agentkit.HandlerFunc{"analyze": func(context.Context, *agentkit.Message) error {
		handled.Add(1)
		return nil
	}})
	sender := m.agent("sender")
	raw := make([]byte, 2<<20)
	rand.Read(raw)
	payload, _ := json.Marshal(map[string]string{"blob": base64.StdEncoding.EncodeToString(raw)})
	if _, err := sender.Send(ctx(t), "recv", "analyze", json.RawMessage(payload)); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "handled and acked", func() bool { return recv.Stats().Outcomes[agentkit.OutcomeAck] == 1 })
	js, _ := jetstream.New(m.conn())
	if _, err := js.ResetConsumerToSequence(ctx(t), "MESH", "recv_normal", 1); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the redelivery settled", func() bool {
		st := recv.Stats().Outcomes
		return st[agentkit.OutcomeDuplicate]+st[agentkit.OutcomeInvalid] > 0
	})
	if st := recv.Stats().Outcomes; st[agentkit.OutcomeDuplicate] != 1 || st[agentkit.OutcomeInvalid] != 0 || handled.Load() != 1 {
		t.Fatalf("outcomes %v, handled %d; want the redelivery acked as a duplicate", st, handled.Load())
	}
}

// An error reply to a request with a large context is large too (replies
// carry the context): it travels through the object store like any other
// envelope, and the requester gets the remote error, not a timeout.
func TestLargePayload_ErrorReply(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	m.started("analyst", map[string]agentkit.HandlerFunc{"analyze": func(ctx context.Context, msg *agentkit.Message) error {
		return agentkit.Reject(wire.CodeInvalid, "cannot analyze that")
	}})
	orch := m.started("orch", nil)
	big, _ := json.Marshal(map[string]string{"notes": string(bytes.Repeat([]byte("x"), 1200<<10))})
	_, err := orch.Request(ctx(t), "analyst", "analyze", map[string]int{"n": 1}, agentkit.WithSessionContext(big))
	var remote *wire.Error
	if !errors.As(err, &remote) || !wire.IsRemote(err) || remote.Code != wire.CodeInvalid || remote.Message != "cannot analyze that" {
		t.Fatalf("Request = %v, want the remote INVALID error", err)
	}
}

// On a server whose max payload is below the object store client's
// default chunk size, a large envelope is still offloaded: its chunks fit.
func TestLargePayload_SmallServerMaxPayload(t *testing.T) {
	t.Parallel()
	m := &mesh{t: t, s: natstest.RunServer(t, func(o *server.Options) { o.MaxPayload = 64 << 10 })}
	got := make(chan *agentkit.Message, 1)
	m.started("analyst", map[string]agentkit.HandlerFunc{"analyze": func(_ context.Context, msg *agentkit.Message) error {
		got <- msg
		return nil
	}})
	orch := m.started("orch", nil)
	raw := make([]byte, 300<<10)
	rand.Read(raw)
	payload, _ := json.Marshal(map[string]string{"blob": base64.StdEncoding.EncodeToString(raw)})
	if _, err := orch.Send(ctx(t), "analyst", "analyze", json.RawMessage(payload)); err != nil {
		t.Fatal(err)
	}
	select {
	case msg := <-got:
		if !bytes.Equal(msg.Payload, payload) {
			t.Fatalf("handler saw %d payload bytes, not the %d sent", len(msg.Payload), len(payload))
		}
	case <-ctx(t).Done():
		t.Fatal("the large envelope never arrived")
	}
}

// A large envelope's dead letter, replayed, is handled with its full
// envelope: the replay's Nats-Msg-Id is a replay id of the message id
// that names the object, which stays for a later replay after the ack.
func TestLargePayload_ReplayOfADeadLetter(t *testing.T) {
	t.Parallel()
	m := &mesh{t: t, s: natstest.RunServer(t, func(o *server.Options) { o.MaxPayload = 64 << 10 })}
	adv := m.watchAdvisories()
	got := make(chan *agentkit.Message, 2)
	var calls atomic.Int32
	analyst := m.started("analyst", map[string]agentkit.HandlerFunc{"analyze": func(_ context.Context, msg *agentkit.Message) error {
		got <- msg
		if calls.Add(1) == 1 {
			return agentkit.Reject(wire.CodeRejected, "not today")
		}
		return nil
	}})
	orch := m.started("orch", nil)
	raw := make([]byte, 100<<10)
	rand.Read(raw)
	payload, _ := json.Marshal(map[string]string{"blob": base64.StdEncoding.EncodeToString(raw)})
	if _, err := orch.Send(ctx(t), "analyst", "analyze", json.RawMessage(payload)); err != nil {
		t.Fatal(err)
	}
	first := <-got
	js, _ := jetstream.New(m.conn())
	stream, err := js.Stream(ctx(t), "MESH")
	if err != nil {
		t.Fatal(err)
	}
	orig, err := stream.GetMsg(ctx(t), first.StreamSeq)
	if err != nil {
		t.Fatal(err)
	}
	// The dead letter as the monitor copies it: the stub and its headers.
	letter := dlq.Letter{Seq: 7, Subject: "mesh.dlq.analyst.normal.orch", Header: orig.Header, Data: orig.Data}
	letter.Header.Set(dlq.HeaderOriginalID, first.MessageID)
	letter.Header.Set(dlq.HeaderSubject, orig.Subject)
	replay, err := dlq.ReplayMsg(subjects.Default, letter)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.PublishMsg(ctx(t), replay); err != nil {
		t.Fatal(err)
	}
	select {
	case msg := <-got:
		if !bytes.Equal(msg.Payload, payload) {
			t.Fatalf("the replay's handler saw %d payload bytes, not the %d sent", len(msg.Payload), len(payload))
		}
	case <-ctx(t).Done():
		t.Fatalf("the replay never reached the handler: outcomes %v, TERMs %+v", analyst.Stats().Outcomes, adv.of(subjects.EventTerminated, 0))
	}
	obs, err := js.ObjectStore(ctx(t), "mesh_payloads")
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the replay acked", func() bool {
		return analyst.Stats().Outcomes[agentkit.OutcomeAck] == 1
	})
	if _, err := obs.GetInfo(ctx(t), first.MessageID); err != nil {
		t.Fatalf("the original's object after the replay's ack: %v", err)
	}
}
