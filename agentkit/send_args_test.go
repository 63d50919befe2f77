package agentkit_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/subjects"
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
	if !errors.Is(err, wire.ErrInvalidEnvelope) {
		t.Errorf("SendEnvelope(nil): %v, want ErrInvalidEnvelope", err)
	}
	envs := requests(t, sender, 3, nil)
	envs[1] = nil
	err = noPanic(t, "SendBatch with a nil item", func() error { return sender.SendBatch(context.Background(), envs) })
	if !errors.Is(err, wire.ErrInvalidEnvelope) || !strings.Contains(err.Error(), "item 1") {
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

// Every value a sender mirrors into a header (Nats-Msg-Id = message_id,
// Mesh-*) or a span comes from an envelope field that is validated before
// anything leaves the process, whichever way the agent sends: an oversize
// id or action is ErrInvalidEnvelope, and no message and no span carries
// it.
func TestSend_OversizeValuesLeaveNothing(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	_, exp, opts := traced(t)
	sender := m.started("sender", nil, opts...)
	stream := m.meshStream()
	long := strings.Repeat("x", 64<<10)
	for _, tc := range []struct {
		field  string
		action string
		opt    agentkit.SendOption
	}{
		{"action", long, nil},
		{"message_id", "work", agentkit.WithMessageID(long)},
		{"correlation_id", "work", agentkit.WithCorrelationID(long)},
		{"workflow_id", "work", agentkit.WithWorkflowID(long)},
		{"task_id", "work", agentkit.WithTaskID(long)},
		{"session_id", "work", agentkit.WithSessionID(long)},
		{"receiver_type", "work", agentkit.WithReceiverType(long)},
	} {
		var opts []agentkit.SendOption
		if tc.opt != nil {
			opts = append(opts, tc.opt)
		}
		for path, err := range sendPathsWith(t, sender, ctx(t), tc.action, opts...) {
			if !errors.Is(err, wire.ErrInvalidEnvelope) {
				t.Errorf("%s with an oversize %s: %v, want ErrInvalidEnvelope", path, tc.field, err)
			}
		}
	}
	// A reply's in_reply_to and status are mirrored too.
	for field, edit := range map[string]func(*wire.Envelope){
		"in_reply_to": func(e *wire.Envelope) { e.InReplyTo = long },
		"status":      func(e *wire.Envelope) { e.InReplyTo, e.Status = "m1", long },
	} {
		e, err := sender.NewRequest(ctx(t), "recv", "done", nil)
		if err != nil {
			t.Fatal(err)
		}
		e.MessageType = wire.TypeResponse
		edit(e)
		if err := sender.SendEnvelope(ctx(t), e); !errors.Is(err, wire.ErrInvalidEnvelope) {
			t.Errorf("a response with an oversize %s: %v, want ErrInvalidEnvelope", field, err)
		}
	}
	for _, s := range exp.GetSpans() {
		t.Errorf("span %.40q recorded for an invalid envelope", s.Name)
	}
	if _, err := sender.Send(ctx(t), "recv", "marker", nil); err != nil {
		t.Fatal(err)
	}
	if n := msgCount(t, stream); n != 1 {
		t.Fatalf("stream holds %d messages, want only the marker", n)
	}
}

// SendBatch checks every envelope before it sends any: a batch with an
// invalid one stores nothing, not even the object of a large envelope
// ahead of it.
func TestSendBatch_ChecksEveryEnvelopeFirst(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	m.createStream(func(*jetstream.StreamConfig) {})
	sender := m.agent("sender", agentkit.WithRegistration(false))
	// Larger than the server's max payload (1 MiB): it goes through the object store.
	big, err := sender.NewRequest(ctx(t), "recv", "work", map[string]string{"text": strings.Repeat("x", 2<<20)})
	if err != nil {
		t.Fatal(err)
	}
	bad, err := sender.NewRequest(ctx(t), "recv", "work", nil, agentkit.WithTaskID(strings.Repeat("x", 300)))
	if err != nil {
		t.Fatal(err)
	}
	if err := sender.SendBatch(ctx(t), []*wire.Envelope{big, bad}); !errors.Is(err, wire.ErrInvalidEnvelope) || !strings.Contains(err.Error(), "item 1") {
		t.Fatalf("SendBatch: %v, want ErrInvalidEnvelope naming item 1", err)
	}
	js, err := jetstream.New(m.conn())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.ObjectStore(ctx(t), subjects.Default.PayloadsBucket()); !errors.Is(err, jetstream.ErrBucketNotFound) {
		t.Fatalf("payload store: %v, want none: the batch stored the large envelope before it checked the next", err)
	}
}
