package dlq_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/dlq"
	"github.com/agentmesh-io/agentmesh/internal/natstest"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// mesh is an embedded server with the message and dead-letter streams of
// the default scheme.
func mesh(t *testing.T) (jetstream.JetStream, subjects.Scheme, context.Context) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	js, err := jetstream.New(natstest.Connect(t, natstest.RunServer(t)))
	if err != nil {
		t.Fatal(err)
	}
	scheme := subjects.Default
	for name, subs := range map[string][]string{scheme.Stream(): scheme.StreamSubjects(), scheme.DLQStream(): scheme.DLQSubjects()} {
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: subs}); err != nil {
			t.Fatal(err)
		}
	}
	return js, scheme, ctx
}

// deadLetter stores a dead letter of a request from orch_1 to planner_1 as
// the monitor writes it and returns its envelope.
func deadLetter(t *testing.T, ctx context.Context, js jetstream.JetStream, scheme subjects.Scheme, n int) *wire.Envelope {
	t.Helper()
	e := wire.NewEnvelope(wire.TypeRequest, "orch_1", "plan")
	e.ReceiverID, e.Priority = "planner_1", wire.PriorityHigh
	body, err := e.Encode()
	if err != nil {
		t.Fatal(err)
	}
	orig, _ := scheme.Direct("planner_1", "high", "orch_1")
	subj, _ := scheme.DLQ("planner_1", "high", "orch_1")
	h := nats.Header{}
	h.Set(wire.HeaderMsgID, e.MessageID+":"+strconv.Itoa(n)+":planner_1_high")
	h.Set(wire.HeaderAction, "plan")
	h.Set(dlq.HeaderReason, "max_deliveries")
	h.Set(dlq.HeaderStatus, "TIMEOUT")
	h.Set(dlq.HeaderDeliveries, "5")
	h.Set(dlq.HeaderConsumer, "planner_1_high")
	h.Set(dlq.HeaderSubject, orig)
	h.Set(dlq.HeaderOriginalID, e.MessageID)
	if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: subj, Header: h, Data: body}); err != nil {
		t.Fatal(err)
	}
	return e
}

func TestRead(t *testing.T) {
	t.Parallel()
	js, scheme, ctx := mesh(t)
	var ids []string
	for i := range 5 {
		ids = append(ids, deadLetter(t, ctx, js, scheme, i).MessageID)
	}
	all, err := dlq.Read(ctx, js, scheme, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 5 {
		t.Fatalf("read %d dead letters, want 5", len(all))
	}
	for i, l := range all {
		if l.Seq != uint64(i+1) || l.MessageID() != ids[i] || l.Reason() != "max_deliveries" || l.Status() != "TIMEOUT" ||
			l.Deliveries() != 5 || l.Consumer() != "planner_1_high" {
			t.Fatalf("letter %d: seq %d id %q reason %q status %q deliveries %d consumer %q", i, l.Seq, l.MessageID(),
				l.Reason(), l.Status(), l.Deliveries(), l.Consumer())
		}
	}
	newest, err := dlq.Read(ctx, js, scheme, 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(newest) != 2 || newest[0].Seq != 4 || newest[1].Seq != 5 {
		t.Fatalf("limit 2: %+v", newest)
	}
	got, err := dlq.Get(ctx, js, scheme, 3)
	if err != nil || got.MessageID() != ids[2] {
		t.Fatalf("Get(3) = %q, %v; want %q", got.MessageID(), err, ids[2])
	}
	if _, err := dlq.Get(ctx, js, scheme, 99); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Fatalf("Get(99): %v, want ErrMsgNotFound", err)
	}
}

func TestNoStream(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	js, err := jetstream.New(natstest.Connect(t, natstest.RunServer(t)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dlq.Read(ctx, js, subjects.Default, 0); !errors.Is(err, dlq.ErrNoStream) {
		t.Fatalf("Read: %v, want ErrNoStream", err)
	}
	if _, err := dlq.Get(ctx, js, subjects.Default, 1); !errors.Is(err, dlq.ErrNoStream) {
		t.Fatalf("Get: %v, want ErrNoStream", err)
	}
}

// A replay goes to the original subject with the original's headers but
// none of the dead letter's or the server's, and a second replay of the
// same letter is a duplicate the stream stores once.
func TestReplay(t *testing.T) {
	t.Parallel()
	js, scheme, ctx := mesh(t)
	e := deadLetter(t, ctx, js, scheme, 1)
	l, err := dlq.Get(ctx, js, scheme, 1)
	if err != nil {
		t.Fatal(err)
	}
	msg, err := dlq.ReplayMsg(scheme, l)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := scheme.Direct("planner_1", "high", "orch_1")
	if msg.Subject != want || msg.Header.Get(wire.HeaderMsgID) != e.MessageID+":replay:1" ||
		msg.Header.Get(dlq.HeaderReplayOf) != "1" || msg.Header.Get(wire.HeaderAction) != "plan" {
		t.Fatalf("replay message: %s %v", msg.Subject, msg.Header)
	}
	for k := range msg.Header {
		if k != wire.HeaderMsgID && (strings.HasPrefix(k, "Nats-") || strings.HasPrefix(k, dlq.HeaderPrefix)) {
			t.Fatalf("replay carries %s", k)
		}
	}
	for i, dup := range []bool{false, true} {
		r, err := dlq.Replay(ctx, js, scheme, l)
		if err != nil {
			t.Fatal(err)
		}
		if r.Duplicate != dup || r.Subject != want || r.Stream != scheme.Stream() {
			t.Fatalf("replay %d: %+v, want duplicate %v to %s in %s", i+1, r, dup, want, scheme.Stream())
		}
	}
}

// A letter whose body was left out, or whose subject is not a mesh one,
// cannot be replayed; it says which letter and why.
func TestReplayRefusesWhatIsNotAMessage(t *testing.T) {
	t.Parallel()
	good := wire.NewEnvelope(wire.TypeRequest, "orch_1", "plan")
	good.ReceiverID = "planner_1"
	body, err := good.Encode()
	if err != nil {
		t.Fatal(err)
	}
	dlqSubj, _ := subjects.Default.DLQ("planner_1", "high", "orch_1")
	for name, l := range map[string]dlq.Letter{
		"body omitted":    {Seq: 7, Subject: dlqSubj, Header: nats.Header{dlq.HeaderBodyOmitted: {"2000000"}}},
		"foreign subject": {Seq: 8, Subject: "elsewhere.x", Header: nats.Header{}, Data: body},
		"bad original":    {Seq: 9, Subject: dlqSubj, Header: nats.Header{dlq.HeaderSubject: {"mesh.agent.x"}}, Data: body},
	} {
		if _, err := dlq.ReplayMsg(subjects.Default, l); err == nil {
			t.Errorf("%s: replayed", name)
		} else if want := fmt.Sprintf("dead letter %d", l.Seq); !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v does not name %q", name, err, want)
		}
	}
}

// TestRemove deletes a dead letter; a sequence with none fails with
// ErrNotFound, saying which, never with the server's API error.
func TestRemove(t *testing.T) {
	t.Parallel()
	js, scheme, ctx := mesh(t)
	deadLetter(t, ctx, js, scheme, 0)
	keep := deadLetter(t, ctx, js, scheme, 1)
	if err := dlq.Remove(ctx, js, scheme, 1); err != nil {
		t.Fatal(err)
	}
	left, err := dlq.Read(ctx, js, scheme, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 1 || left[0].MessageID() != keep.MessageID {
		t.Fatalf("after removing 1: %d letters left", len(left))
	}
	for name, err := range map[string]error{
		"remove again": dlq.Remove(ctx, js, scheme, 1),
		"remove 7":     dlq.Remove(ctx, js, scheme, 7),
		"get removed":  func() error { _, err := dlq.Get(ctx, js, scheme, 1); return err }(),
	} {
		if !errors.Is(err, dlq.ErrNotFound) || strings.Contains(err.Error(), "API error") || !strings.Contains(err.Error(), "dead letter") {
			t.Errorf("%s: %v, want ErrNotFound naming the dead letter", name, err)
		}
	}
}

// TestLetterAction: the action comes from Mesh-Action, or from the body
// of a letter whose sender mirrored no headers; a body that is no
// envelope names none.
func TestLetterAction(t *testing.T) {
	t.Parallel()
	e := wire.NewEnvelope(wire.TypeRequest, "orch_1", "plan")
	e.ReceiverID, e.Priority = "planner_1", wire.PriorityHigh
	body, err := e.Encode()
	if err != nil {
		t.Fatal(err)
	}
	mirrored := nats.Header{}
	mirrored.Set(wire.HeaderType, string(wire.TypeRequest))
	for _, c := range []struct {
		name   string
		header nats.Header
		data   []byte
		want   string
	}{
		{"header", nats.Header{wire.HeaderAction: {"from_header"}}, body, "from_header"},
		{"headerless", nats.Header{}, body, "plan"},
		{"mirrored without action", mirrored, body, ""},
		{"not an envelope", nats.Header{}, []byte(`{"action":`), ""},
		{"body omitted", nats.Header{}, nil, ""},
	} {
		if got := (dlq.Letter{Header: c.header, Data: c.data}).Action(); got != c.want {
			t.Errorf("%s: Action() = %q, want %q", c.name, got, c.want)
		}
	}
}
