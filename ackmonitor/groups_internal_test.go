package ackmonitor

import (
	"context"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/ackmonitor/store"
	"github.com/agentmesh-io/agentmesh/internal/natstest"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// A group consumer's members are the agents whose exact direct filters it
// has: a wildcard or another kind of subject names nobody, and the count
// is bounded.
func TestGroupMembers_FromFilters(t *testing.T) {
	g := newGroupMembers(nil, subjects.Default, slog.New(slog.DiscardHandler))
	filters := []string{"mesh.agent.a.normal.*", "mesh.agent.*.normal.*", "mesh.topic.t.normal.*", "mesh.agent.b.bogus.*",
		"mesh.agent.c.high.x", "mesh.agent.d.high.>", "other.agent.e.high.*", "mesh.agent.f.low.*", "mesh.agent.a.normal.*"}
	if got := slices.Sorted(maps.Keys(g.membersOf(filters, 10))); !slices.Equal(got, []string{"a_normal", "f_low"}) {
		t.Errorf("members %v, want a_normal and f_low", got)
	}
	if got := g.membersOf(filters, 1); len(got) != 1 {
		t.Errorf("%d members kept, want the limit, 1", len(got))
	}
}

// The seq memory forgets the oldest beyond its capacity.
func TestSeqReceivers_Bounded(t *testing.T) {
	s := newSeqReceivers(2)
	s.add(0, directTo{"x", "normal"}) // no stream sequence: ignored
	s.add(1, directTo{"a", "normal"})
	s.add(2, directTo{})
	s.add(1, directTo{"b", "normal"}) // replaced, not added twice
	s.add(3, directTo{"c", "high"})
	if _, ok := s.get(1); ok {
		t.Error("seq 1 remembered beyond the capacity")
	}
	if to, ok := s.get(3); !ok || to.receiver != "c" {
		t.Errorf("seq 3: %+v, %v", to, ok)
	}
	if len(s.m) != 2 {
		t.Errorf("%d remembered, want 2", len(s.m))
	}
}

// A group's event is attributed from the stream when the intake has not
// seen its send: to the message's receiver if the group's filters name it,
// to nobody if they do not or the sequence holds no direct message. A
// member that joined after the membership was read is found, as the event
// came after; a failed look-up puts the event off until its last tries.
func TestAttributeGroupEvents(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := natstest.RunServer(t)
	nc := natstest.Connect(t, s)
	st, err := store.OpenSQLite(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	m, err := New(nc, Config{Store: st, Logger: slog.New(slog.NewTextHandler(t.Output(), nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.provision(ctx); err != nil {
		t.Fatal(err)
	}
	m.intake.mesh = m.mesh
	js, _ := jetstream.New(nc)
	group := func(ids ...string) {
		t.Helper()
		cfg := jetstream.ConsumerConfig{Durable: "host_group-normal", AckPolicy: jetstream.AckExplicitPolicy, DeliverPolicy: jetstream.DeliverAllPolicy}
		for _, id := range ids {
			f, _ := subjects.Default.DirectFilter(id, "normal")
			cfg.FilterSubjects = append(cfg.FilterSubjects, f)
		}
		if _, err := js.CreateOrUpdateConsumer(ctx, "MESH", cfg); err != nil {
			t.Fatal(err)
		}
	}
	publish := func(subject string) uint64 {
		t.Helper()
		ack, err := js.Publish(ctx, subject, []byte("{}"))
		if err != nil {
			t.Fatal(err)
		}
		return ack.Sequence
	}
	group("g1")
	toG1 := publish("mesh.agent.g1.normal.client")
	toG2 := publish("mesh.agent.g2.normal.client")
	toOutsider := publish("mesh.agent.outsider.normal.client")
	broadcast := publish("mesh.broadcast.normal.client")
	badSender := publish("mesh.agent.g1.normal.bad!sender") // attributed like its send: the receiver is valid

	ev := func(consumer string, seq uint64) *store.Event {
		return &store.Event{ID: "e", Kind: store.EventAck, Consumer: consumer, Priority: "normal", StreamSeq: seq}
	}
	events := []*store.Event{ev("host_group-normal", toG1), ev("host_group-normal", toOutsider),
		ev("host_group-normal", broadcast), ev("host_group-normal", broadcast+100), ev("g1_normal", toG1),
		ev("host_group-normal", badSender)}
	tries := []uint64{1, 1, 1, 1, 1, 1}
	got := m.intake.attributeGroupEvents(ctx, events, tries, time.Now())
	want := []verdict{eventKept, eventIgnored, eventIgnored, eventIgnored, eventKept, eventKept}
	if !slices.Equal(got, want) {
		t.Errorf("verdicts %v, want %v", got, want)
	}
	for _, i := range []int{0, 4, 5} {
		if e := events[i]; e.Consumer != "g1_normal" || e.Receiver != "g1" && i != 4 || e.Priority != "normal" {
			t.Errorf("event %d attributed to %q, receiver %q, priority %q; want g1_normal", i, e.Consumer, e.Receiver, e.Priority)
		}
	}

	// g2 joins; an event received before the membership was read again
	// does not make it read again, one received after does.
	read := time.Now()
	group("g1", "g2")
	if got := m.intake.attributeGroupEvents(ctx, []*store.Event{ev("host_group-normal", toG2)}, []uint64{1}, read.Add(-time.Hour)); got[0] != eventIgnored {
		t.Errorf("an event from before the last read: %v, want ignored", got[0])
	}
	e := ev("host_group-normal", toG2)
	if got := m.intake.attributeGroupEvents(ctx, []*store.Event{e}, []uint64{1}, time.Now()); got[0] != eventKept || e.Consumer != "g2_normal" || e.Receiver != "g2" {
		t.Errorf("an event after g2 joined: %v, %+v; want attributed to g2", got[0], e)
	}

	// late joins while a listing finds it in the filters before its
	// catch-up is made: the group's events about the catch-up's messages
	// are still ignored, those about later ones attributed.
	early := publish("mesh.agent.late.normal.client")
	group("g1", "g2", "late")
	if err := m.groups.list(ctx, time.Now()); err != nil {
		t.Fatal(err)
	}
	catchUp := jetstream.ConsumerConfig{Durable: "late_normal", AckPolicy: jetstream.AckExplicitPolicy, FilterSubject: "mesh.agent.late.normal.*",
		Metadata: map[string]string{subjects.CatchUpKey: strconv.FormatUint(early, 10)}}
	if _, err := js.CreateOrUpdateConsumer(ctx, "MESH", catchUp); err != nil {
		t.Fatal(err)
	}
	later := publish("mesh.agent.late.normal.client")
	events = []*store.Event{ev("host_group-normal", early), ev("host_group-normal", later)}
	if got := m.intake.attributeGroupEvents(ctx, events, []uint64{1, 1}, time.Now()); !slices.Equal(got, []verdict{eventIgnored, eventKept}) ||
		events[1].Consumer != "late_normal" {
		t.Errorf("events about a catch-up's message and a later one: %v, %+v; want ignored, then attributed to late", got, events[1])
	}

	// Unknown sends without a stream to read them from: put off, then
	// ignored at the last try, and never put off for directIntake (nil tries).
	m.intake.mesh = nil
	events = []*store.Event{ev("host_group-normal", 1000), ev("host_group-normal", 1001)}
	if got := m.intake.attributeGroupEvents(ctx, events, []uint64{1, attributeReadDeliveries}, time.Now()); !slices.Equal(got, []verdict{eventLater, eventIgnored}) {
		t.Errorf("failed look-ups: %v, want put off, then ignored", got)
	}
	if got := m.intake.attributeGroupEvents(ctx, events[:1], nil, time.Now()); got[0] != eventLater {
		t.Errorf("a failed look-up of directIntake: %v, want left to the stream", got[0])
	}
}
