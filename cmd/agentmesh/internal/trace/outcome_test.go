package trace_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/cmd/agentmesh/internal/trace"
	"github.com/agentmesh-io/agentmesh/dlq"
	"github.com/agentmesh-io/agentmesh/internal/natstest"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// TestAddOutcomes: acked, exhausted (dead-lettered), delivered, pending, a
// replay and a message to nobody, each told apart; without a dead-letter
// stream the settled ones are not called acked.
func TestAddOutcomes(t *testing.T) {
	t.Parallel()
	srv := natstest.RunServer(t)
	nc := natstest.Connect(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	js, _ := jetstream.New(nc)
	s := subjects.Default
	if err := agentkit.EnsureStream(ctx, js, agentkit.StreamConfig(s, 1)); err != nil {
		t.Fatal(err)
	}
	cfg, err := agentkit.ConsumerConfig(s, "planner_1", wire.PriorityHigh, agentkit.DefaultPolicies()[wire.PriorityHigh])
	if err != nil {
		t.Fatal(err)
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, s.Stream(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	orch, _ := agentkit.New(nc, "orch_1", agentkit.WithRegistration(false))
	var sent []*wire.Envelope
	for _, to := range []string{"planner_1", "planner_1", "planner_1", "planner_1", "nobody_1"} {
		e, err := orch.Send(ctx, to, "plan", nil, agentkit.WithPriority(wire.PriorityHigh), agentkit.WithCorrelationID("c1"))
		if err != nil {
			t.Fatal(err)
		}
		sent = append(sent, e)
	}
	// The planner acks the first, gives up on the second, holds the third
	// and has not fetched the fourth.
	batch, err := cons.Fetch(3, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var got []jetstream.Msg
	for m := range batch.Messages() {
		got = append(got, m)
	}
	if len(got) != 3 {
		t.Fatalf("fetched %d", len(got))
	}
	if err := got[0].DoubleAck(ctx); err != nil {
		t.Fatal(err)
	}
	if err := got[1].TermWithReason("exhausted"); err != nil {
		t.Fatal(err)
	}
	natstest.WaitFor(t, 5*time.Second, func() error {
		ci, err := cons.Info(ctx)
		if err != nil {
			return err
		}
		if ci.AckFloor.Stream < 2 {
			return errString("ack floor " + strconv.FormatUint(ci.AckFloor.Stream, 10))
		}
		return nil
	})

	outcomes := func() []string {
		t.Helper()
		entries, err := trace.Read(ctx, js, s, "c1")
		if err != nil {
			t.Fatal(err)
		}
		if err := trace.AddOutcomes(ctx, js, s, entries); err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, e := range entries {
			out = append(out, e.Outcome)
		}
		return out
	}
	if o := outcomes(); o[0] != trace.OutcomeSettled || o[1] != trace.OutcomeSettled || o[2] != trace.OutcomeDelivered ||
		o[3] != trace.OutcomePending || o[4] != trace.OutcomeNoConsumer {
		t.Fatalf("without dead letters: %q", o)
	}

	// The monitor's dead letter of the second, then its replay.
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: s.DLQStream(), Subjects: s.DLQSubjects()}); err != nil {
		t.Fatal(err)
	}
	md, _ := got[1].Metadata()
	h := nats.Header{}
	for k, v := range got[1].Headers() {
		h[k] = v
	}
	h.Set(wire.HeaderMsgID, sent[1].MessageID+":planner_1_high")
	h.Set(dlq.HeaderOriginalID, sent[1].MessageID)
	h.Set(dlq.HeaderReason, "max_deliveries")
	h.Set(dlq.HeaderStreamSeq, strconv.FormatUint(md.Sequence.Stream, 10))
	h.Set(dlq.HeaderSubject, got[1].Subject())
	dsubj, _ := s.DLQ("planner_1", "high", "orch_1")
	if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: dsubj, Header: h, Data: got[1].Data()}); err != nil {
		t.Fatal(err)
	}
	letter, err := dlq.Get(ctx, js, s, 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dlq.Replay(ctx, js, s, letter); err != nil {
		t.Fatal(err)
	}
	o := outcomes()
	if len(o) != 6 || o[0] != trace.OutcomeAcked || o[1] != "dead-lettered: max_deliveries (dead letter 1)" || o[5] != trace.OutcomePending {
		t.Fatalf("with the dead letter and its replay: %q", o)
	}
	entries, _ := trace.Read(ctx, js, s, "c1")
	_ = trace.AddOutcomes(ctx, js, s, entries)
	if entries[5].ReplayOf != 1 {
		t.Fatalf("replay not marked: %+v", entries[5])
	}
	var b strings.Builder
	trace.Render(&b, trace.Build(entries), s, time.Time{})
	for _, want := range []string{"→ dead-lettered: max_deliveries (dead letter 1)", "#6  replay of dead letter 1  → pending", "→ no consumer"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("render misses %q:\n%s", want, b.String())
		}
	}
}

type errString string

func (e errString) Error() string { return string(e) }
