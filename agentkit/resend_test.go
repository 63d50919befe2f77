package agentkit_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
)

// A Send whose publish was never acked may have been stored; Resend of
// the envelope it returned, once acks are back, stores nothing new and
// reports that the stream held it.
func TestResend_UnconfirmedSendWasHeld(t *testing.T) {
	t.Parallel()
	m, stream := noAckMesh(t)
	sender := m.agent("sender", agentkit.WithRegistration(false), agentkit.WithPublishTimeout(400*time.Millisecond))
	env, err := sender.Send(context.Background(), "recv", "work", nil)
	if !errors.Is(err, agentkit.ErrPublishUnconfirmed) {
		t.Fatalf("Send: %v, want ErrPublishUnconfirmed", err)
	}
	eventually(t, 10*time.Second, "the unconfirmed message stored", func() bool { return msgCount(t, stream) == 1 })
	cfg := stream.CachedInfo().Config
	cfg.NoAck = false
	js, err := jetstream.New(m.conn())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.UpdateStream(ctx(t), cfg); err != nil {
		t.Fatal(err)
	}
	held, err := sender.Resend(ctx(t), env)
	if err != nil || !held {
		t.Fatalf("Resend: held %v, err %v; want held, no error", held, err)
	}
	if n := msgCount(t, stream); n != 1 {
		t.Fatalf("stream holds %d messages after the resend, want 1", n)
	}
}

// Resend of an envelope the stream does not hold stores it and says so.
func TestResend_NewEnvelopeIsStored(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	sender := m.started("sender", nil, agentkit.WithRegistration(false)) // the start creates the stream
	env, err := sender.NewRequest(ctx(t), "recv", "work", nil)
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []bool{false, true} {
		held, err := sender.Resend(ctx(t), env)
		if err != nil || held != want {
			t.Fatalf("Resend %d: held %v, err %v; want held %v", i+1, held, err, want)
		}
	}
	if n := msgCount(t, m.meshStream()); n != 1 {
		t.Fatalf("stream holds %d messages, want 1", n)
	}
	if _, err := sender.Resend(ctx(t), nil); !errors.Is(err, wire.ErrInvalidEnvelope) {
		t.Fatalf("Resend(nil): %v, want ErrInvalidEnvelope", err)
	}
}

// A SendAndWait whose publish is never acked fails with
// ErrPublishUnconfirmed before it waits for any reply, with or without an
// id of the caller's (which publishes alone).
func TestSendAndWait_NoAckIsUnconfirmed(t *testing.T) {
	t.Parallel()
	m, _ := noAckMesh(t)
	sender := m.started("sender", nil, agentkit.WithRegistration(false), agentkit.WithPublishTimeout(400*time.Millisecond))
	for name, opts := range map[string][]agentkit.SendOption{
		"new id":   nil,
		"given id": {agentkit.WithMessageID(wire.NewMessageID())},
	} {
		c, cancel := context.WithTimeout(ctx(t), 500*time.Millisecond)
		_, err := sender.SendAndWait(c, "recv", "work", nil, opts...)
		cancel()
		if !errors.Is(err, agentkit.ErrPublishUnconfirmed) || errors.Is(err, agentkit.ErrPublish) {
			t.Errorf("SendAndWait, %s: %v, want ErrPublishUnconfirmed alone", name, err)
		}
	}
}
