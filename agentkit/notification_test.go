package agentkit_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// A notification asks for no reply: when its handler rejects it, its
// sender hears nothing. One that set requires_ack gets its NACK, and
// nothing else.
func TestNotification_RejectedGetsNoReply(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	recv := m.started("recv", map[string]agentkit.HandlerFunc{
		"note": func(context.Context, *agentkit.Message) error {
			return agentkit.Reject(wire.CodeNotFound, "no such thing")
		},
	})
	sender := m.started("sender", nil)
	js, err := jetstream.New(m.conn())
	if err != nil {
		t.Fatal(err)
	}
	stream, err := js.Stream(ctx(t), subjects.Default.Stream())
	if err != nil {
		t.Fatal(err)
	}
	// toSender returns the stream's messages to sender, per subject.
	toSender := func() map[string]uint64 {
		t.Helper()
		got := map[string]uint64{}
		for _, p := range subjects.Priorities {
			filter, err := subjects.Default.DirectFilter("sender", p)
			if err != nil {
				t.Fatal(err)
			}
			info, err := stream.Info(ctx(t), jetstream.WithSubjectFilter(filter))
			if err != nil {
				t.Fatal(err)
			}
			for subj, n := range info.State.Subjects {
				got[subj] += n
			}
		}
		return got
	}

	if _, err := sender.Send(ctx(t), "recv", "note", map[string]string{"k": "v"}, agentkit.WithMessageType(wire.TypeNotification)); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the notification terminated", func() bool { return recv.Stats().Outcomes[agentkit.OutcomeTerm] == 1 })
	// The settle path publishes a reply before it counts the outcome.
	if got := toSender(); len(got) != 0 {
		t.Fatalf("rejected notification: the stream holds messages to its sender %v; want none", got)
	}

	ack, err := sender.SendAndWait(ctx(t), "recv", "note", map[string]string{"k": "v"}, agentkit.WithMessageType(wire.TypeNotification))
	var we *wire.Error
	if ack == nil || ack.OK || !errors.As(err, &we) || we.Code != wire.CodeNotFound || ack.Envelope.MessageType != wire.TypeAck {
		t.Fatalf("notification with requires_ack: ack %+v, err %v; want a NACK with NOT_FOUND", ack, err)
	}
	var n uint64
	for _, c := range toSender() {
		n += c
	}
	out := sender.Stats().Outcomes
	if n != 1 || out[agentkit.OutcomeReply] != 1 || out[agentkit.OutcomeLateReply] != 0 {
		t.Fatalf("the sender got %d messages, outcomes %v; want the NACK alone", n, out)
	}
}
