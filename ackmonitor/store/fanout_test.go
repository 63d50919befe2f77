package store_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/agentmesh-io/agentmesh/ackmonitor/store"
)

func TestFanoutRows_SQLite(t *testing.T) {
	t.Parallel()
	testFanoutRows(t, SQLiteDB)
}

func TestFanoutRows_Postgres(t *testing.T) {
	t.Parallel()
	testFanoutRows(t, PostgresDB)
}

// testFanoutRows: the events of fan-out consumers carry no priority; the
// rows take their message's, whether the send is recorded before or after
// the events, and the sender's own fan-out consumers get no row.
func testFanoutRows(t *testing.T, db func(*testing.T) func() (store.Store, error)) {
	s, err := db(t)()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	base := time.Now().UTC().Truncate(time.Millisecond)
	n := 0
	ack := func(seq uint64, consumer, agent string, ms int) store.Event {
		n++
		return store.Event{ID: fmt.Sprintf("ev-%d", n), Kind: store.EventAck, Consumer: consumer, Receiver: agent,
			StreamSeq: seq, Deliveries: 1, AckTime: time.Millisecond, At: base.Add(time.Duration(ms) * time.Millisecond)}
	}
	// apply applies b; sendKnown says the sends of b's events are
	// recorded by then, so no row of the sender's own may be reported.
	apply := func(b store.Batch, sendKnown bool) store.Applied {
		t.Helper()
		a, err := s.Apply(ctx, b)
		if err != nil {
			t.Fatalf("Apply: %v", err)
		}
		for _, rs := range [][]store.Record{a.Resolved, a.Acked} {
			for _, r := range rs {
				if sendKnown && r.Receiver == "pub" {
					t.Errorf("Applied reports the sender's own row %d/%s", r.StreamSeq, r.Consumer)
				}
			}
		}
		return a
	}
	bcast := store.Send{StreamSeq: 1, MessageID: "m-1", Sender: "pub", Kind: "broadcast", Priority: "high", Action: "sync", SentAt: base}
	topic := store.Send{StreamSeq: 2, MessageID: "m-2", Sender: "pub", Topic: "news", Kind: "topic", Priority: "low", Action: "sync", SentAt: base}

	// 1: the send, then the events (an old-style direct consumer's row,
	// with its own priority, too).
	apply(store.Batch{Sends: []store.Send{bcast}}, true)
	old := ack(1, "b_high", "b", 5)
	old.Priority = "high"
	a := apply(store.Batch{Events: []store.Event{ack(1, "a_fanout-urgent", "a", 10), ack(1, "pub_fanout-urgent", "pub", 11), old}}, true)
	if len(a.Acked) != 2 {
		t.Errorf("send first: Acked = %+v, want the rows of a and b", a.Acked)
	}
	for _, e := range a.NewEvents {
		if e.Priority != "high" {
			t.Errorf("new event %s of %s has priority %q, want the message's", e.ID, e.Consumer, e.Priority)
		}
	}
	// 2: the events, then the send.
	ownEarly := ack(2, "pub_fanout-bulk", "pub", 21)
	apply(store.Batch{Events: []store.Event{ack(2, "a_fanout-bulk", "a", 20), ownEarly}}, false)
	a = apply(store.Batch{Sends: []store.Send{topic}}, true)
	if len(a.Acked) != 1 || a.Acked[0].Consumer != "a_fanout-bulk" || a.Acked[0].Priority != "low" {
		t.Errorf("events first: Acked = %+v, want a's row at low", a.Acked)
	}
	// Replays, and a late event of the sender's own consumer, add no row.
	apply(store.Batch{Sends: []store.Send{bcast, topic}, Events: []store.Event{ownEarly, ack(2, "pub_fanout-bulk", "pub", 30)}}, true)

	for _, tc := range []struct {
		seq           uint64
		consumer      string
		priority      string
		receiver, snd string
	}{{1, "a_fanout-urgent", "high", "a", "pub"}, {1, "b_high", "high", "b", "pub"}, {2, "a_fanout-bulk", "low", "a", "pub"}} {
		r, err := s.Get(ctx, store.Key{StreamSeq: tc.seq, Consumer: tc.consumer})
		if err != nil || r.Priority != tc.priority || r.Receiver != tc.receiver || r.Sender != tc.snd || r.Status != store.StatusACK || r.SentAt.IsZero() {
			t.Errorf("row %d/%s = %+v, %v; want ACK at %s from %s", tc.seq, tc.consumer, r, err, tc.priority, tc.snd)
		}
	}
	for _, k := range []store.Key{{StreamSeq: 1, Consumer: "pub_fanout-urgent"}, {StreamSeq: 2, Consumer: "pub_fanout-bulk"}} {
		if r, err := s.Get(ctx, k); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("the sender's own row %d/%s = %+v, %v; want ErrNotFound", k.StreamSeq, k.Consumer, r, err)
		}
	}
	if msgs, err := s.Messages(ctx, store.Query{Receiver: "pub"}); err != nil || len(msgs) != 0 {
		t.Errorf("Messages(pub) = %+v, %v; want none", msgs, err)
	}
	rates, err := s.Rates(ctx, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, r := range rates {
		got[r.Agent+"/"+r.Priority] = r.Acked
		if r.Nacked+r.TimedOut+r.Pending > 0 {
			t.Errorf("rate %+v: want ACKs only", r)
		}
	}
	if want := map[string]int64{"a/high": 1, "a/low": 1, "b/high": 1}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("ACKs per agent/priority = %v, want %v", got, want)
	}
}
