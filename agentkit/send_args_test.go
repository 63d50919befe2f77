package agentkit_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/agentkit"
)

// noPanic runs send and returns its error, or fails the test if it
// panicked.
func noPanic(t *testing.T, what string, send func() error) (err error) {
	t.Helper()
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("panicked: %v", p)
			t.Errorf("%s panicked: %v", what, p)
		}
	}()
	return send()
}

// A nil envelope is a caller's mistake the agent reports as an invalid
// envelope, alone or in a batch, instead of panicking; a batch with one
// publishes none of its messages.
func TestSend_NilEnvelope(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	m.createStream(func(*jetstream.StreamConfig) {})
	sender := m.agent("sender", agentkit.WithRegistration(false))
	stream := m.meshStream()
	err := noPanic(t, "SendEnvelope(nil)", func() error { return sender.SendEnvelope(context.Background(), nil) })
	if !errors.Is(err, agentkit.ErrInvalidEnvelope) {
		t.Errorf("SendEnvelope(nil): %v, want ErrInvalidEnvelope", err)
	}
	envs := requests(t, sender, 3, nil)
	envs[1] = nil
	err = noPanic(t, "SendBatch with a nil item", func() error { return sender.SendBatch(context.Background(), envs) })
	if !errors.Is(err, agentkit.ErrInvalidEnvelope) || !strings.Contains(err.Error(), "item 1") {
		t.Errorf("SendBatch with a nil item 1: %v, want ErrInvalidEnvelope naming item 1", err)
	}
	// A later message on the sender's connection, once acked, comes after
	// anything the batch had published.
	if _, err := sender.Send(ctx(t), "recv", "marker", nil); err != nil {
		t.Fatal(err)
	}
	if n := msgCount(t, stream); n != 1 {
		t.Fatalf("stream holds %d messages, want only the marker", n)
	}
}
