package ackmonitor

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/ackmonitor/store"
	"github.com/agentmesh-io/agentmesh/internal/natstest"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// TestDirectEvents: the ids of the last events written are remembered, the
// oldest forgotten beyond the capacity, and events without an id never
// match.
func TestDirectEvents(t *testing.T) {
	d := newDirectEvents(3)
	ev := func(ids ...string) []store.Event {
		var es []store.Event
		for _, id := range ids {
			es = append(es, store.Event{ID: id})
		}
		return es
	}
	d.add(ev("a", "b", "", "b"))
	d.add(ev("c", "d"))
	for id, want := range map[string]bool{"a": false, "b": true, "c": true, "d": true, "": false, "e": false} {
		if got := d.written(id); got != want {
			t.Errorf("written(%q) = %v, want %v", id, got, want)
		}
	}
	for i := range 10 {
		d.add(ev(fmt.Sprint(i)))
	}
	if n := len(d.ids); n != 3 {
		t.Errorf("remembers %d ids, want 3", n)
	}
}

// The events intake leaves out the stream copies of events directIntake
// wrote, and still counts them and their time for the lag.
func TestEventsBatch_SkipsWrittenEvents(t *testing.T) {
	ctx := context.Background()
	s := natstest.RunServer(t)
	nc := natstest.Connect(t, s)
	st, err := store.OpenSQLite(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	m, err := New(nc, Config{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(nc)
	scheme := m.cfg.Scheme
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: scheme.EventsStream(), Subjects: scheme.EventsSubjects()}); err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	subject, _ := subjects.EventSubject(subjects.EventAck, scheme.Stream(), "worker_normal")
	for id, ts := range map[string]time.Time{"new": at, "written": at.Add(time.Second)} {
		data, _ := json.Marshal(advisory{ID: id, Timestamp: ts, Stream: scheme.Stream(), Consumer: "worker_normal", StreamSeq: 1, Deliveries: 1})
		if _, err := js.Publish(ctx, subject, data); err != nil {
			t.Fatal(err)
		}
	}
	cons, err := js.OrderedConsumer(ctx, scheme.EventsStream(), jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(2)
	if err != nil {
		t.Fatal(err)
	}
	var msgs []jetstream.Msg
	for msg := range batch.Messages() {
		msgs = append(msgs, msg)
	}
	m.intake.direct.add([]store.Event{{ID: "written"}})
	b := m.intake.eventsBatch(ctx, msgs)
	if len(b.Events) != 1 || b.Events[0].ID != "new" || !slices.Equal(b.kinds, []string{"ACK", "ACK"}) || !b.newest.Equal(at.Add(time.Second)) {
		t.Errorf("batch events %+v, kinds %v, newest %v; want only %q, two ACKs, the written one's %v", b.Events, b.kinds, b.newest, "new", at.Add(time.Second))
	}
}
