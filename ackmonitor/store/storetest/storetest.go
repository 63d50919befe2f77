// Package storetest is the conformance suite every ack ledger
// implementation must pass: both store.OpenSQLite and store.OpenPostgres
// run it (see store_test.go).
package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentmesh-io/agentmesh/ackmonitor/store"
)

// Database gives each test a fresh, empty database and returns a function
// that opens it; the function may be called several times (the suite
// reopens a database to check migrations are idempotent). Opened stores
// are closed by the suite.
type Database func(t *testing.T) (open func() (store.Store, error))

// Run runs the conformance suite, each case in parallel on its own database.
func Run(t *testing.T, db Database) {
	cases := []struct {
		name string
		f    func(*testing.T, store.Store)
	}{
		{"OutcomesFromHistory", testOutcomes},
		{"OutOfOrderAndReplays", testOutOfOrder},
		{"ConcurrentWritersLoseNothing", testConcurrentWriters},
		{"ManyWritersOnColdStatements", testColdStatements},
		{"TopicFansOutPerConsumer", testTopic},
		{"EveryAckLatencyOnce", testAckedOnce},
		{"RatesWindowAndSeries", testRates},
		{"NakExhaustedIsNoTimeout", testNakExhausted},
		{"LateAcksAreNoTimeouts", testLateAcks},
		{"HourlyRollup", testHourly},
		{"FollowUps", testFollowUps},
		{"FollowUpsFailedAndGivenUp", testGiveUp},
		{"InferredAcksAndPending", testInferred},
		{"Health", testHealth},
		{"Alerts", testAlerts},
		{"TextFromAnyPublisher", testText},
		{"InvalidInputIsTheSenders", testInvalid},
		{"RefusedEventsAndProbe", testRefused},
		{"PendingRowsListedAndCounted", testPendingRows},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			open := db(t)
			s, err := open()
			if err != nil {
				t.Fatalf("open: %v", err)
			}
			t.Cleanup(func() { s.Close() })
			c.f(t, s)
		})
	}
	t.Run("ConcurrentOpensOfANewDatabase", func(t *testing.T) {
		t.Parallel()
		for range 5 { // monitors starting together on a new database
			open := db(t)
			var wg sync.WaitGroup
			errs := make(chan error, 6)
			for range cap(errs) {
				wg.Go(func() {
					s, err := open()
					if err == nil {
						err = s.Close()
					}
					errs <- err
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Fatalf("concurrent open: %v", err)
				}
			}
		}
	})
	t.Run("MigrationsIdempotent", func(t *testing.T) {
		t.Parallel()
		open := db(t)
		s, err := open()
		if err != nil {
			t.Fatal(err)
		}
		base := time.Now().UTC().Truncate(time.Second)
		mustApply(t, s, store.Batch{Sends: []store.Send{send(1, "a", "b", base)}})
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		if err := s.Close(); err != nil {
			t.Fatalf("second Close: %v", err)
		}
		s2, err := open()
		if err != nil {
			t.Fatalf("reopen: %v", err)
		}
		defer s2.Close()
		r, err := s2.Get(ctx(t), store.Key{StreamSeq: 1, Consumer: "b_normal"})
		if err != nil || r.Sender != "a" {
			t.Fatalf("after reopen Get = %+v, %v", r, err)
		}
	})
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

func send(seq uint64, from, to string, at time.Time) store.Send {
	return store.Send{StreamSeq: seq, MessageID: fmt.Sprintf("m-%d", seq), Sender: from, Receiver: to, Kind: "agent",
		Priority: "normal", MessageType: "request", Action: "work", Correlation: fmt.Sprintf("c-%d", seq),
		Workflow: "wf", SentAt: at}
}

var evID atomic.Int64

func ev(kind store.EventKind, seq uint64, consumer string, deliveries uint64, at time.Time) store.Event {
	id := evID.Add(1)
	agent, prio := consumer, "normal"
	for i := len(consumer) - 1; i > 0; i-- {
		if consumer[i] == '_' {
			agent, prio = consumer[:i], consumer[i+1:]
			break
		}
	}
	return store.Event{ID: fmt.Sprintf("ev-%d-%d-%s", id, seq, kind), Kind: kind, Consumer: consumer, Receiver: agent,
		Priority: prio, StreamSeq: seq, Deliveries: deliveries, At: at}
}

func mustApply(t *testing.T, s store.Store, b store.Batch) store.Applied {
	t.Helper()
	a, err := s.Apply(ctx(t), b)
	if err != nil {
		t.Fatalf("Apply: %v", err)
	}
	return a
}

func get(t *testing.T, s store.Store, seq uint64, consumer string) store.Record {
	t.Helper()
	r, err := s.Get(ctx(t), store.Key{StreamSeq: seq, Consumer: consumer})
	if err != nil {
		t.Fatalf("Get(%d, %s): %v", seq, consumer, err)
	}
	return r
}

func testOutcomes(t *testing.T, s store.Store) {
	base := time.Now().UTC().Truncate(time.Millisecond)
	at := func(ms int) time.Time { return base.Add(time.Duration(ms) * time.Millisecond) }
	ack := func(seq uint64, d uint64, ms int, ackTime time.Duration) store.Event {
		e := ev(store.EventAck, seq, "b_normal", d, at(ms))
		e.AckTime = ackTime
		return e
	}
	term := ev(store.EventTerm, 3, "b_normal", 1, at(30))
	term.Reason = "NOT_FOUND: customer not found"
	b := store.Batch{
		Sends: []store.Send{send(1, "a", "b", base), send(2, "a", "b", base), send(3, "a", "b", base),
			send(4, "a", "b", base), send(5, "a", "b", base), send(6, "a", "b", base)},
		Events: []store.Event{
			ack(1, 1, 10, 2*time.Millisecond),
			ev(store.EventNak, 2, "b_normal", 1, at(10)), ev(store.EventNak, 2, "b_normal", 2, at(20)), ack(2, 3, 40, time.Millisecond),
			term,
			ev(store.EventNak, 4, "b_normal", 1, at(10)), ev(store.EventNak, 4, "b_normal", 2, at(20)), ev(store.EventMax, 4, "b_normal", 2, at(50)),
			ev(store.EventMax, 5, "b_normal", 3, at(60)),
			ack(6, 3, 70, 5*time.Millisecond),
		},
	}
	a := mustApply(t, s, b)
	if len(a.NewSends) != 6 || len(a.NewEvents) != len(b.Events) || len(a.Resolved) != 6 {
		t.Fatalf("applied %d sends, %d events, %d resolved; want 6, %d, 6", len(a.NewSends), len(a.NewEvents), len(a.Resolved), len(b.Events))
	}
	want := []struct {
		seq                        uint64
		status, reason             string
		deliveries, naks, timeouts int
		procMS                     float64
	}{
		{1, store.StatusACK, "", 1, 0, 0, 2},
		{2, store.StatusACK, "", 3, 2, 0, 1},
		{3, store.StatusNACK, "NOT_FOUND: customer not found", 1, 0, 0, 0},
		{4, store.StatusTimeout, "", 2, 2, 0, 0},
		{5, store.StatusTimeout, "", 3, 0, 3, 0},
		{6, store.StatusACK, "", 3, 0, 2, 5},
	}
	for _, w := range want {
		r := get(t, s, w.seq, "b_normal")
		if r.Status != w.status || r.NackReason != w.reason || r.Deliveries != w.deliveries || r.Naks != w.naks ||
			r.Timeouts != w.timeouts || r.RetryCount != w.deliveries-1 || r.ProcessingTime.Seconds()*1000 != w.procMS {
			t.Errorf("row %d = status %q reason %q deliveries %d naks %d timeouts %d retries %d proc %v; want %+v",
				w.seq, r.Status, r.NackReason, r.Deliveries, r.Naks, r.Timeouts, r.RetryCount, r.ProcessingTime, w)
		}
		if r.Sender != "a" || r.Receiver != "b" || r.MessageID != fmt.Sprintf("m-%d", w.seq) || !r.SentAt.Equal(base) ||
			r.Correlation != fmt.Sprintf("c-%d", w.seq) || r.Workflow != "wf" || r.Priority != "normal" {
			t.Errorf("row %d send fields = %+v", w.seq, r)
		}
	}
	if r := get(t, s, 2, "b_normal"); !r.AcknowledgedAt.Equal(at(40)) || r.Latency() != 40*time.Millisecond {
		t.Errorf("row 2 acknowledged %v latency %v; want %v, 40ms", r.AcknowledgedAt, r.Latency(), at(40))
	}
}

func testOutOfOrder(t *testing.T, s store.Store) {
	base := time.Now().UTC().Truncate(time.Millisecond)
	ackEv := ev(store.EventAck, 7, "b_high", 2, base.Add(30*time.Millisecond))
	nakEv := ev(store.EventNak, 7, "b_high", 1, base.Add(10*time.Millisecond))
	snd := send(7, "a", "b", base)
	snd.Priority = "high"
	// The ACK arrives first, then the send, then the NAK of an earlier delivery.
	mustApply(t, s, store.Batch{Events: []store.Event{ackEv}})
	r := get(t, s, 7, "b_high")
	if r.Status != store.StatusACK || r.Sender != "" || !r.SentAt.IsZero() || r.Timeouts != 1 {
		t.Fatalf("after ACK only: %+v", r)
	}
	mustApply(t, s, store.Batch{Sends: []store.Send{snd}})
	mustApply(t, s, store.Batch{Events: []store.Event{nakEv}})
	r = get(t, s, 7, "b_high")
	if r.Status != store.StatusACK || r.Sender != "a" || !r.SentAt.Equal(base) || r.Naks != 1 || r.Timeouts != 0 || len(r.History) != 2 {
		t.Fatalf("after send and NAK: %+v", r)
	}
	// Replays change nothing and report nothing.
	for range 2 {
		a := mustApply(t, s, store.Batch{Sends: []store.Send{snd}, Events: []store.Event{nakEv, ackEv}})
		if len(a.NewSends)+len(a.NewEvents)+len(a.Resolved) != 0 {
			t.Fatalf("replay applied %+v", a)
		}
	}
	if r2 := get(t, s, 7, "b_high"); r2.Naks != 1 || len(r2.History) != 2 || r2.Status != store.StatusACK {
		t.Fatalf("after replays: %+v", r2)
	}
	rates, err := s.Rates(ctx(t), time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if len(rates) != 1 || rates[0].Sent != 1 || rates[0].Acked != 1 || rates[0].Naks != 1 {
		t.Fatalf("rates = %+v", rates)
	}
	// A duplicate within one batch counts once.
	e := ev(store.EventNak, 8, "b_normal", 1, base)
	a := mustApply(t, s, store.Batch{Events: []store.Event{e, e}})
	if len(a.NewEvents) != 1 || get(t, s, 8, "b_normal").Naks != 1 {
		t.Fatalf("duplicate in batch applied %d", len(a.NewEvents))
	}
}

// Writers apply at once (the monitor's event, core NATS and send intakes,
// and an instance still finishing a write after a takeover): events that
// reach the same row in different transactions all stay in its history,
// also when the row does not exist yet, and every row gets its send's
// fields. The first half are direct messages to b, the second half
// messages on a topic b subscribes to.
func testConcurrentWriters(t *testing.T, s store.Store) {
	const writers, rows, batch = 4, 400, 50
	base := time.Now().UTC().Truncate(time.Millisecond)
	var wg sync.WaitGroup
	errs := make(chan error, writers+1)
	for w := range writers {
		wg.Go(func() {
			for first := uint64(1); first <= rows; first += batch {
				var b store.Batch
				for seq := first; seq < first+batch; seq++ {
					b.Events = append(b.Events, ev(store.EventNak, seq, "b_normal", uint64(w+1), base.Add(time.Duration(w)*time.Millisecond)))
				}
				if _, err := s.Apply(ctx(t), b); err != nil {
					errs <- fmt.Errorf("writer %d: %w", w, err)
					return
				}
			}
		})
	}
	wg.Go(func() {
		for first := uint64(1); first <= rows; first += batch {
			var b store.Batch
			for seq := first; seq < first+batch; seq++ {
				snd := send(seq, "a", "b", base)
				if seq > rows/2 {
					snd.Receiver, snd.Topic, snd.Kind = "", "news", "topic"
				}
				b.Sends = append(b.Sends, snd)
			}
			if _, err := s.Apply(ctx(t), b); err != nil {
				errs <- fmt.Errorf("sends: %w", err)
				return
			}
		}
	})
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	lost := 0
	for seq := uint64(1); seq <= rows; seq++ {
		r := get(t, s, seq, "b_normal")
		if r.Naks != writers || len(r.History) != writers || r.Sender != "a" {
			if lost++; lost <= 3 {
				t.Errorf("row %d: %d NAKs, %d events in its history, sender %q; want %d, %d and \"a\"", seq, r.Naks, len(r.History), r.Sender, writers, writers)
			}
		}
	}
	if lost > 0 {
		t.Fatalf("%d of %d rows lost an event or their send", lost, rows)
	}
}

// testColdStatements runs more concurrent writes than a store has
// connections, each starting with statements not prepared before (a fresh
// store's probes, sends and events): preparing one must not wait for a
// connection that only the waiting writes hold.
func testColdStatements(t *testing.T, s store.Store) {
	const writers = 24
	base := time.Now().UTC().Truncate(time.Millisecond)
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Go(func() {
			var b store.Batch // every third an empty batch: the probe
			switch seq := uint64(5000 + w); w % 3 {
			case 1:
				b.Sends = []store.Send{send(seq, "a", "cold", base)}
			case 2:
				b.Events = []store.Event{ev(store.EventNak, seq, "cold_normal", 1, base)}
			}
			if _, err := s.Apply(ctx(t), b); err != nil {
				errs <- fmt.Errorf("writer %d: %w", w, err)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func testTopic(t *testing.T, s store.Store) {
	base := time.Now().UTC().Truncate(time.Millisecond)
	snd := store.Send{StreamSeq: 9, MessageID: "t-9", Sender: "pub", Topic: "news", Kind: "topic", Priority: "low", SentAt: base}
	mustApply(t, s, store.Batch{
		Events: []store.Event{ev(store.EventAck, 9, "sub1_low", 1, base.Add(time.Millisecond))},
		Sends:  []store.Send{snd},
	})
	mustApply(t, s, store.Batch{Events: []store.Event{ev(store.EventMax, 9, "sub2_low", 2, base.Add(time.Second))}})
	r1, r2 := get(t, s, 9, "sub1_low"), get(t, s, 9, "sub2_low")
	if r1.Receiver != "sub1" || r1.Sender != "pub" || r1.Status != store.StatusACK || !r1.SentAt.Equal(base) {
		t.Fatalf("sub1 row = %+v", r1)
	}
	if r2.Receiver != "sub2" || r2.Sender != "pub" || r2.Status != store.StatusTimeout || r2.Priority != "low" {
		t.Fatalf("sub2 row = %+v", r2)
	}
	msgs, err := s.Messages(ctx(t), store.Query{Receiver: "sub2"})
	if err != nil || len(msgs) != 1 {
		t.Fatalf("Messages(sub2) = %d, %v", len(msgs), err)
	}
}

// Each ACK is reported in Applied.Acked exactly once, with its send time,
// whatever order its send and events arrive in: the send-to-ACK latency
// histogram observes every ACK once. An inferred ACK has no time and is
// never reported.
func testAckedOnce(t *testing.T, s store.Store) {
	base := time.Now().UTC().Truncate(time.Millisecond)
	acked := map[store.Key]time.Duration{}
	apply := func(b store.Batch) {
		t.Helper()
		for _, r := range mustApply(t, s, b).Acked {
			if _, dup := acked[r.Key()]; dup {
				t.Errorf("row %d/%s reported twice", r.StreamSeq, r.Consumer)
			}
			if r.SentAt.IsZero() || r.Sender != "a" && r.Sender != "pub" {
				t.Errorf("row %d/%s reported without its send: %+v", r.StreamSeq, r.Consumer, r)
			}
			acked[r.Key()] = r.Latency()
		}
	}
	at := func(ms int) time.Time { return base.Add(time.Duration(ms) * time.Millisecond) }
	ack1 := ev(store.EventAck, 1, "b_normal", 1, at(10))
	ack2 := ev(store.EventAck, 2, "b_normal", 1, at(20))
	ack3 := ev(store.EventAck, 3, "b_normal", 2, at(30))
	nak3 := ev(store.EventNak, 3, "b_normal", 1, at(5))
	inferred := ev(store.EventAck, 4, "b_normal", 0, at(40))
	inferred.Inferred = true
	topic := store.Send{StreamSeq: 5, MessageID: "t-5", Sender: "pub", Topic: "news", Kind: "topic", Priority: "normal", SentAt: base}
	ackT1, ackT2 := ev(store.EventAck, 5, "x_normal", 1, at(50)), ev(store.EventAck, 5, "y_normal", 1, at(60))
	// 1: send, then its ACK. 2: ACK, then its send. 3: NAK and ACK before
	// the send, replayed after it. 4: inferred. 5: a topic's ACKs first.
	apply(store.Batch{Sends: []store.Send{send(1, "a", "b", base)}})
	apply(store.Batch{Events: []store.Event{ack1, ack2, nak3, ack3, inferred, ackT1, ackT2}})
	apply(store.Batch{Sends: []store.Send{send(2, "a", "b", base), send(3, "a", "b", base), send(4, "a", "b", base), topic}})
	for range 2 {
		apply(store.Batch{Sends: []store.Send{send(1, "a", "b", base), send(2, "a", "b", base), send(3, "a", "b", base), topic},
			Events: []store.Event{ack1, ack2, nak3, ack3, inferred, ackT1, ackT2}})
	}
	want := map[store.Key]time.Duration{
		{StreamSeq: 1, Consumer: "b_normal"}: 10 * time.Millisecond, {StreamSeq: 2, Consumer: "b_normal"}: 20 * time.Millisecond,
		{StreamSeq: 3, Consumer: "b_normal"}: 30 * time.Millisecond, {StreamSeq: 5, Consumer: "x_normal"}: 50 * time.Millisecond,
		{StreamSeq: 5, Consumer: "y_normal"}: 60 * time.Millisecond,
	}
	if len(acked) != len(want) {
		t.Fatalf("Acked reported %v; want %v", acked, want)
	}
	for k, l := range want {
		if got, ok := acked[k]; !ok || got != l {
			t.Errorf("row %d/%s latency %v (reported %v); want %v", k.StreamSeq, k.Consumer, got, ok, l)
		}
	}
}

func testRates(t *testing.T, s store.Store) {
	now := time.Now().UTC()
	old := now.Add(-time.Hour)
	var b store.Batch
	seq := uint64(0)
	add := func(at time.Time, to string, kind store.EventKind, ackTime time.Duration) {
		seq++
		b.Sends = append(b.Sends, send(seq, "a", to, at))
		if kind != "" {
			e := ev(kind, seq, to+"_normal", 1, at.Add(10*time.Millisecond))
			e.AckTime = ackTime
			b.Events = append(b.Events, e)
		}
	}
	for range 3 {
		add(old, "b", store.EventAck, time.Millisecond) // outside the window
	}
	for range 8 {
		add(now, "b", store.EventAck, 4*time.Millisecond)
	}
	add(now, "b", store.EventTerm, 0)
	add(now, "b", store.EventMax, 0)
	add(now, "b", "", 0) // pending
	add(now, "c", store.EventAck, 2*time.Millisecond)
	mustApply(t, s, b)
	rates, err := s.Rates(ctx(t), now.Add(-5*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if len(rates) != 2 {
		t.Fatalf("rates = %+v", rates)
	}
	rb := rates[0]
	if rb.Agent != "b" || rb.Sent != 11 || rb.Acked != 8 || rb.Nacked != 1 || rb.TimedOut != 1 || rb.Pending != 1 || rb.Resolved() != 10 {
		t.Fatalf("rate b = %+v", rb)
	}
	if rb.AckRate() != 0.8 || rb.NackRate() != 0.1 || rb.TimeoutRate() != 0.1 || rb.AvgAckTimeMS != 4 {
		t.Fatalf("rate b ratios %v %v %v avg %v", rb.AckRate(), rb.NackRate(), rb.TimeoutRate(), rb.AvgAckTimeMS)
	}
	if rb.AvgLatencyMS < 9.9 || rb.AvgLatencyMS > 10.1 {
		t.Fatalf("avg latency %v, want 10ms", rb.AvgLatencyMS)
	}
	all, err := s.Rates(ctx(t), time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if all[0].Acked != 11 || all[0].Sent != 14 {
		t.Fatalf("all-time rate b = %+v", all[0])
	}
	if m := all[0].Merge(all[1]); m.Acked != 12 || m.Sent != 15 {
		t.Fatalf("merged = %+v", m)
	}
	pts, err := s.Series(ctx(t), "", now.Add(-2*time.Hour), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	var acked, nacked, timedOut int64
	for _, p := range pts {
		acked, nacked, timedOut = acked+p.Acked, nacked+p.Nacked, timedOut+p.TimedOut
	}
	if len(pts) < 2 || acked != 12 || nacked != 1 || timedOut != 1 {
		t.Fatalf("series = %+v", pts)
	}
	one, err := s.Series(ctx(t), "c", now.Add(-time.Minute), time.Minute)
	if err != nil || len(one) == 0 || one[len(one)-1].Acked != 1 {
		t.Fatalf("series(c) = %+v, %v", one, err)
	}
}

// A message whose every delivery was NAKed until its attempts ran out is
// TIMEOUT (exhausted, followed up as such) but counts apart: nothing timed
// out, so the timeout rate leaves it out. One whose last attempt timed
// out is a timeout.
func testNakExhausted(t *testing.T, s store.Store) {
	now := time.Now().UTC().Truncate(time.Millisecond)
	at := func(ms int) time.Time { return now.Add(time.Duration(ms) * time.Millisecond) }
	b := store.Batch{Sends: []store.Send{send(1, "a", "b", now), send(2, "a", "b", now), send(3, "a", "b", now), send(4, "a", "b", now)},
		Events: []store.Event{
			ev(store.EventNak, 1, "b_normal", 1, at(1)), ev(store.EventNak, 1, "b_normal", 2, at(2)), ev(store.EventMax, 1, "b_normal", 2, at(3)),
			ev(store.EventNak, 2, "b_normal", 1, at(1)), ev(store.EventMax, 2, "b_normal", 2, at(3)),
			ev(store.EventAck, 3, "b_normal", 1, at(1)), ev(store.EventAck, 4, "b_normal", 1, at(1)),
		}}
	mustApply(t, s, b)
	if r := get(t, s, 1, "b_normal"); r.Status != store.StatusTimeout || !r.NakExhausted || r.Timeouts != 0 {
		t.Errorf("row exhausted by NAKs = status %s nak_exhausted %v timeouts %d", r.Status, r.NakExhausted, r.Timeouts)
	}
	if r := get(t, s, 2, "b_normal"); r.Status != store.StatusTimeout || r.NakExhausted || r.Timeouts != 1 {
		t.Errorf("row that timed out = status %s nak_exhausted %v timeouts %d", r.Status, r.NakExhausted, r.Timeouts)
	}
	rates, err := s.Rates(ctx(t), now.Add(-time.Minute))
	if err != nil || len(rates) != 1 {
		t.Fatalf("rates = %+v, %v", rates, err)
	}
	if r := rates[0]; r.TimedOut != 2 || r.NakExhausted != 1 || r.Resolved() != 4 || r.TimeoutRate() != 0.25 || r.AckRate() != 0.5 {
		t.Errorf("rate = %+v, timeout rate %v ack rate %v; want 2 exhausted, 1 by NAKs, 25 %% and 50 %%", r, r.TimeoutRate(), r.AckRate())
	}
	pts, err := s.Series(ctx(t), "b", now.Add(-time.Minute), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	var timedOut, byNaks int64
	for _, p := range pts {
		timedOut, byNaks = timedOut+p.TimedOut, byNaks+p.NakExhausted
	}
	if timedOut != 2 || byNaks != 1 {
		t.Errorf("series = %+v; want 2 exhausted, 1 by NAKs", pts)
	}
	// The hourly rollup counts them as the rates do.
	if err := s.Rollup(ctx(t)); err != nil {
		t.Fatal(err)
	}
	hs, err := s.Hourly(ctx(t), now)
	if err != nil || len(hs) != 1 {
		t.Fatalf("hourly = %+v, %v", hs, err)
	}
	if m := hs[0]; m.TimedOut != 2 || m.NakExhausted != 1 || m.Resolved() != 4 || m.TimeoutRate() != rates[0].TimeoutRate() || m.AckRate() != rates[0].AckRate() {
		t.Errorf("hour = %+v, timeout rate %v ack rate %v; want 2 exhausted, 1 by NAKs, 25 %% and 50 %%", m, m.TimeoutRate(), m.AckRate())
	}
}

// testLateAcks checks LateAckRule: an ACK of a redelivery settled in at
// most half the time of the consumer's fastest recent first delivery
// (of at least LateAckMinSamples) answered a handled message whose ack
// was lost or late.
func testLateAcks(t *testing.T, s store.Store) {
	now := time.Now().UTC().Truncate(time.Millisecond)
	at := func(ms int) time.Time { return now.Add(time.Duration(ms) * time.Millisecond) }
	ack := func(seq uint64, consumer string, d uint64, ms int, ackTime time.Duration) store.Event {
		e := ev(store.EventAck, seq, consumer, d, at(ms))
		e.AckTime = ackTime
		return e
	}
	// First deliveries: b's handler takes 20–24ms; c has too few of them
	// to judge by.
	var first store.Batch
	for i := range uint64(store.LateAckMinSamples) {
		first.Sends = append(first.Sends, send(1+i, "a", "b", now))
		first.Events = append(first.Events, ack(1+i, "b_normal", 1, 1, 20*time.Millisecond+time.Duration(i)*time.Millisecond))
	}
	first.Sends = append(first.Sends, send(20, "a", "c", now))
	first.Events = append(first.Events, ack(20, "c_normal", 1, 1, 20*time.Millisecond))
	mustApply(t, s, first)

	redelivered := store.Batch{
		Sends: []store.Send{send(10, "a", "b", now), send(11, "a", "b", now), send(12, "a", "b", now), send(13, "a", "b", now),
			send(21, "a", "c", now)},
		Events: []store.Event{
			ack(10, "b_normal", 2, 10, time.Millisecond),                                // the duplicate path: a late ack
			ack(11, "b_normal", 2, 10, 15*time.Millisecond),                             // the handler ran again: a timeout
			ev(store.EventNak, 12, "b_normal", 1, at(5)), ack(12, "b_normal", 2, 10, 0), // redelivered by its NAK
			ack(13, "b_normal", 3, 10, 10*time.Millisecond), // one timeout, then a late ack
			ack(21, "c_normal", 2, 10, time.Millisecond),    // no evidence: a timeout
		},
	}
	mustApply(t, s, redelivered)
	mustApply(t, s, redelivered) // a replay judges nothing again
	for _, w := range []struct {
		seq                uint64
		consumer           string
		timeouts, lateAcks int
	}{{1, "b_normal", 0, 0}, {10, "b_normal", 0, 1}, {11, "b_normal", 1, 0}, {12, "b_normal", 0, 0}, {13, "b_normal", 1, 1}, {21, "c_normal", 1, 0}} {
		if r := get(t, s, w.seq, w.consumer); r.Status != store.StatusACK || r.Timeouts != w.timeouts || r.LateAcks != w.lateAcks {
			t.Errorf("row %d %s = status %s timeouts %d late acks %d; want ACK, %d, %d", w.seq, w.consumer, r.Status, r.Timeouts, r.LateAcks, w.timeouts, w.lateAcks)
		}
	}
	rates, err := s.Rates(ctx(t), now.Add(-time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rates {
		if r.Agent == "b" && (r.Timeouts != 2 || r.LateAcks != 2 || r.TimeoutRate() != 0) {
			t.Errorf("rate of b = %+v; want 2 delivery timeouts, 2 late acks, timeout rate 0", r)
		}
	}
}

func testHourly(t *testing.T, s store.Store) {
	h := time.Now().UTC().Truncate(time.Hour).Add(-2 * time.Hour)
	var b store.Batch
	for i := range uint64(4) {
		b.Sends = append(b.Sends, send(i+1, "a", "b", h.Add(time.Duration(i)*time.Minute)))
	}
	a1 := ev(store.EventAck, 1, "b_normal", 1, h.Add(time.Second))
	a1.AckTime = 2 * time.Millisecond
	a2 := ev(store.EventAck, 2, "b_normal", 1, h.Add(time.Second))
	a2.AckTime = 4 * time.Millisecond
	b.Events = []store.Event{a1, a2, ev(store.EventMax, 3, "b_normal", 3, h.Add(time.Minute))}
	b.Sends = append(b.Sends, send(5, "a", "b", h.Add(time.Hour)))
	mustApply(t, s, b)
	if err := s.Rollup(ctx(t)); err != nil {
		t.Fatal(err)
	}
	// A late NACK for the pending message updates its hour on the next rollup.
	term := ev(store.EventTerm, 4, "b_normal", 1, time.Now())
	mustApply(t, s, store.Batch{Events: []store.Event{term}})
	if err := s.Rollup(ctx(t)); err != nil {
		t.Fatal(err)
	}
	if err := s.Rollup(ctx(t)); err != nil { // nothing dirty: a no-op
		t.Fatal(err)
	}
	hs, err := s.Hourly(ctx(t), h)
	if err != nil {
		t.Fatal(err)
	}
	if len(hs) != 2 {
		t.Fatalf("hourly = %+v", hs)
	}
	m := hs[0]
	if !m.Hour.Equal(h) || m.Agent != "b" || m.Priority != "normal" || m.Sent != 4 || m.Acked != 2 || m.TimedOut != 1 || m.Nacked != 1 || m.AvgAckTimeMS != 3 {
		t.Fatalf("hour %v = %+v", h, m)
	}
	if hs[1].Sent != 1 || hs[1].Acked != 0 {
		t.Fatalf("next hour = %+v", hs[1])
	}
}

// testInferred: an inferred ACK resolves a row without ack time or
// acknowledged_at (so averages leave it out), yields to a real TERM that
// arrives later, and Pending pages through unresolved rows in key order.
func testInferred(t *testing.T, s store.Store) {
	base := time.Now().UTC().Truncate(time.Millisecond)
	inferred := func(seq uint64) store.Event {
		e := ev(store.EventAck, seq, "b_normal", 0, base.Add(time.Minute))
		e.ID, e.Inferred = fmt.Sprintf("inferred-%d", seq), true
		return e
	}
	ack := ev(store.EventAck, 1, "b_normal", 1, base.Add(10*time.Millisecond))
	ack.AckTime = 4 * time.Millisecond
	mustApply(t, s, store.Batch{
		Sends:  []store.Send{send(1, "a", "b", base), send(2, "a", "b", base), send(3, "a", "b", base), send(4, "a", "b", base)},
		Events: []store.Event{ack, ev(store.EventNak, 2, "b_normal", 1, base.Add(10*time.Millisecond))},
	})

	var keys []store.Key
	for after := (store.Key{}); ; {
		recs, err := s.Pending(ctx(t), after, 2)
		if err != nil {
			t.Fatal(err)
		}
		if len(recs) == 0 {
			break
		}
		for _, r := range recs {
			keys = append(keys, r.Key())
		}
		after = recs[len(recs)-1].Key()
	}
	if want := []store.Key{{StreamSeq: 2, Consumer: "b_normal"}, {StreamSeq: 3, Consumer: "b_normal"}, {StreamSeq: 4, Consumer: "b_normal"}}; fmt.Sprint(keys) != fmt.Sprint(want) {
		t.Fatalf("Pending pages = %v, want %v", keys, want)
	}

	a := mustApply(t, s, store.Batch{Events: []store.Event{inferred(2), inferred(3)}})
	if len(a.Resolved) != 2 {
		t.Fatalf("inferred ACKs resolved %d rows, want 2", len(a.Resolved))
	}
	r := get(t, s, 2, "b_normal")
	if r.Status != store.StatusACK || !r.AcknowledgedAt.IsZero() || r.ProcessingTime != 0 || r.Naks != 1 || r.Deliveries != 1 ||
		!r.ResolvedAt.Equal(base.Add(time.Minute)) {
		t.Errorf("row 2 after an inferred ACK = %+v; want ACK without acknowledged_at or ack time, 1 NAK, resolved when inferred", r)
	}
	rates, err := s.Rates(ctx(t), time.Time{})
	if err != nil || len(rates) != 1 {
		t.Fatalf("Rates = %v, %v", rates, err)
	}
	if got := rates[0]; got.Acked != 3 || got.Pending != 1 || got.AvgAckTimeMS != 4 {
		t.Errorf("rates = %+v; want 3 ACKs, 1 pending, the average ack time of the real ACK alone (4ms)", got)
	}

	// A real TERM arriving after the inference wins; replaying the
	// inference changes nothing.
	term := ev(store.EventTerm, 3, "b_normal", 1, base.Add(20*time.Millisecond))
	term.Reason = "late"
	mustApply(t, s, store.Batch{Events: []store.Event{term, inferred(3)}})
	if r := get(t, s, 3, "b_normal"); r.Status != store.StatusNACK || r.NackReason != "late" {
		t.Errorf("row 3 after a late TERM = %s %q; want NACK late", r.Status, r.NackReason)
	}
}

func testFollowUps(t *testing.T, s store.Store) {
	base := time.Now().UTC().Truncate(time.Millisecond)
	term := ev(store.EventTerm, 2, "b_normal", 1, base.Add(time.Millisecond))
	term.Reason = "INVALID: bad"
	mustApply(t, s, store.Batch{
		Sends:  []store.Send{send(1, "a", "b", base), send(2, "a", "b", base), send(3, "a", "b", base)},
		Events: []store.Event{ev(store.EventMax, 1, "b_normal", 2, base), term, ev(store.EventAck, 3, "b_normal", 1, base)},
	})
	p, err := s.PendingFollowUps(ctx(t), store.Key{}, 10)
	if err != nil || len(p) != 2 || p[0].StreamSeq != 1 || p[1].StreamSeq != 2 {
		t.Fatalf("pending = %+v, %v", p, err)
	}
	if after, err := s.PendingFollowUps(ctx(t), p[0].Key(), 10); err != nil || len(after) != 1 || after[0].StreamSeq != 2 {
		t.Fatalf("pending after %v = %+v, %v", p[0].Key(), after, err)
	}
	// The dead letter is recorded ahead of the rest: the row stays due.
	if err := s.RecordDeadLetters(ctx(t), []store.DeadLetter{{Key: p[0].Key(), DLQSeq: 5}}); err != nil {
		t.Fatal(err)
	}
	if err := s.RecordDeadLetters(ctx(t), nil); err != nil {
		t.Fatalf("no dead letters: %v", err)
	}
	missing := store.Key{StreamSeq: 99, Consumer: "x_normal"}
	if err := s.RecordDeadLetters(ctx(t), []store.DeadLetter{{Key: missing, DLQSeq: 5}}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("RecordDeadLetters of a missing row: %v", err)
	}
	if again, err := s.PendingFollowUps(ctx(t), store.Key{}, 10); err != nil || len(again) != 2 || again[0].DLQSeq != 5 || again[1].DLQSeq != 0 {
		t.Fatalf("pending after a recorded dead letter = %+v, %v", again, err)
	}
	// The existing rows are written though one is missing.
	done := base.Add(time.Second)
	err = s.CompleteFollowUps(ctx(t), []store.FollowUp{
		{Key: p[1].Key(), DLQSeq: 6, HandledAt: done},
		{Key: missing, HandledAt: done},
		{Key: p[0].Key(), DLQSeq: 5, Director: "boss", EscalationID: "e1", EscalatedAt: done, HandledAt: done},
	})
	if !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("CompleteFollowUps with a missing row: %v", err)
	}
	if p, _ := s.PendingFollowUps(ctx(t), store.Key{}, 10); len(p) != 0 {
		t.Fatalf("still pending: %+v", p)
	}
	esc, err := s.Messages(ctx(t), store.Query{Escalated: true})
	if err != nil || len(esc) != 1 || esc[0].Director != "boss" || esc[0].DLQSeq != 5 || !esc[0].EscalatedAt.Equal(done) || esc[0].EscalationID != "e1" {
		t.Fatalf("escalated = %+v, %v", esc, err)
	}
	dlq, err := s.Messages(ctx(t), store.Query{DeadLetter: true})
	if err != nil || len(dlq) != 2 || dlq[0].DLQSeq != 6 {
		t.Fatalf("dead letters = %+v, %v", dlq, err)
	}

	// Many rows in one call, more than a statement takes.
	const n = 1200
	var b store.Batch
	for i := range n {
		seq := uint64(100 + i)
		e := ev(store.EventTerm, seq, "b_normal", 1, base)
		e.Reason = "REJECTED: no"
		b.Sends, b.Events = append(b.Sends, send(seq, "a", "b", base)), append(b.Events, e)
	}
	mustApply(t, s, b)
	var ds []store.DeadLetter
	var fs []store.FollowUp
	for i := range n {
		k := store.Key{StreamSeq: uint64(100 + i), Consumer: "b_normal"}
		ds = append(ds, store.DeadLetter{Key: k, DLQSeq: uint64(1000 + i)})
		if i%2 == 0 {
			fs = append(fs, store.FollowUp{Key: k, DLQSeq: uint64(1000 + i), HandledAt: done})
		}
	}
	if err := s.RecordDeadLetters(ctx(t), ds); err != nil {
		t.Fatal(err)
	}
	if err := s.CompleteFollowUps(ctx(t), fs); err != nil {
		t.Fatal(err)
	}
	due, err := s.PendingFollowUps(ctx(t), store.Key{}, 2*n)
	if err != nil || len(due) != n/2 {
		t.Fatalf("%d rows due, %v; want %d", len(due), err, n/2)
	}
	for _, r := range due {
		if r.StreamSeq%2 != 1 || r.DLQSeq != 900+r.StreamSeq || !r.HandledAt.IsZero() {
			t.Fatalf("row due %+v", r)
		}
	}
}

// testGiveUp: failed tries count on their rows, with the last error; a
// row given up is no longer due and is listed by Query.GivenUp, newest
// first, with the time it was first given up.
func testGiveUp(t *testing.T, s store.Store) {
	base := time.Now().UTC().Truncate(time.Millisecond)
	var b store.Batch
	for seq := uint64(1); seq <= 3; seq++ {
		b.Sends, b.Events = append(b.Sends, send(seq, "a", "b", base)), append(b.Events, ev(store.EventMax, seq, "b_normal", 2, base))
	}
	mustApply(t, s, b)
	k := func(seq uint64) store.Key { return store.Key{StreamSeq: seq, Consumer: "b_normal"} }
	if err := s.FailFollowUps(ctx(t), []store.FollowUpFailure{
		{Key: k(1), Reason: "no director for a", At: base},
		{Key: k(2), Reason: "no responders", At: base},
	}); err != nil {
		t.Fatal(err)
	}
	gaveUp := base.Add(time.Second)
	err := s.FailFollowUps(ctx(t), []store.FollowUpFailure{
		{Key: k(1), Reason: "no director for a\x00\xff", At: gaveUp, GiveUp: true},
		{Key: k(3), Reason: "header too large", At: gaveUp, GiveUp: true},
		{Key: store.Key{StreamSeq: 99, Consumer: "x_normal"}, Reason: "gone", At: gaveUp, GiveUp: true},
	})
	if !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("FailFollowUps with a missing row: %v", err)
	}
	// Given up again later (another instance): the first time stays.
	if err := s.FailFollowUps(ctx(t), []store.FollowUpFailure{{Key: k(3), Reason: "header too large", At: gaveUp.Add(time.Hour), GiveUp: true}}); err != nil {
		t.Fatal(err)
	}
	due, err := s.PendingFollowUps(ctx(t), store.Key{}, 10)
	if err != nil || len(due) != 1 || due[0].StreamSeq != 2 || due[0].FollowUpAttempts != 1 || due[0].FollowUpError != "no responders" || !due[0].GivenUpAt.IsZero() {
		t.Fatalf("due = %+v, %v; want row 2 alone, one failed try", due, err)
	}
	given, err := s.Messages(ctx(t), store.Query{GivenUp: true})
	if err != nil || len(given) != 2 {
		t.Fatalf("given up = %+v, %v", given, err)
	}
	if r := given[0]; r.StreamSeq != 3 || r.FollowUpAttempts != 2 || !r.GivenUpAt.Equal(gaveUp) {
		t.Fatalf("given up first = %+v", r)
	}
	if r := given[1]; r.StreamSeq != 1 || r.FollowUpAttempts != 2 || r.FollowUpError != "no director for a\uFFFD\uFFFD" || !r.GivenUpAt.Equal(gaveUp) || r.Final() != true {
		t.Fatalf("given up second = %+v", r)
	}
	// A given-up row keeps its status and what its follow-up did.
	if err := s.RecordDeadLetters(ctx(t), []store.DeadLetter{{Key: k(2), DLQSeq: 7}}); err != nil {
		t.Fatal(err)
	}
	if err := s.FailFollowUps(ctx(t), []store.FollowUpFailure{{Key: k(2), Reason: "no director", At: gaveUp, GiveUp: true}}); err != nil {
		t.Fatal(err)
	}
	if r := get(t, s, 2, "b_normal"); r.DLQSeq != 7 || r.Status != store.StatusTimeout || r.FollowUpAttempts != 2 || r.GivenUpAt.IsZero() {
		t.Fatalf("row 2 = %+v", r)
	}
	if due, err := s.PendingFollowUps(ctx(t), store.Key{}, 10); err != nil || len(due) != 0 {
		t.Fatalf("due = %+v, %v; want none", due, err)
	}
}

func testHealth(t *testing.T, s store.Store) {
	t0 := time.Now().UTC().Truncate(time.Millisecond)
	if err := s.MarkUnavailable(ctx(t), "b", "max deliveries on 1/b_normal", t0); err != nil {
		t.Fatal(err)
	}
	if err := s.MarkUnavailable(ctx(t), "b", "again", t0.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	h, err := s.Health(ctx(t))
	if err != nil || len(h) != 1 || !h[0].UnavailableSince.Equal(t0) || h[0].Reason != "again" {
		t.Fatalf("health = %+v, %v", h, err)
	}
	mustApply(t, s, store.Batch{Events: []store.Event{ev(store.EventAck, 1, "b_normal", 1, t0.Add(2*time.Second))}})
	h, _ = s.Health(ctx(t))
	if len(h) != 1 || !h[0].UnavailableSince.IsZero() {
		t.Fatalf("after ACK health = %+v", h)
	}
}

func testAlerts(t *testing.T, s store.Store) {
	t0 := time.Now().UTC().Truncate(time.Millisecond)
	a := store.Alert{ID: "b/ack_rate/1", Agent: "b", Kind: "ack_rate", Severity: "warning", Value: 0.93, Threshold: 0.95, Samples: 40, RaisedAt: t0}
	if err := s.SaveAlert(ctx(t), a); err != nil {
		t.Fatal(err)
	}
	a2 := store.Alert{ID: "c/timeout_rate/2", Agent: "c", Kind: "timeout_rate", Severity: "critical", Value: 0.2, Threshold: 0.1, Samples: 30, RaisedAt: t0.Add(time.Second)}
	if err := s.SaveAlert(ctx(t), a2); err != nil {
		t.Fatal(err)
	}
	a.ResolvedAt = t0.Add(2 * time.Second)
	if err := s.SaveAlert(ctx(t), a); err != nil {
		t.Fatal(err)
	}
	active, err := s.Alerts(ctx(t), true, 10)
	if err != nil || len(active) != 1 || active[0].ID != a2.ID || !active[0].Active() {
		t.Fatalf("active = %+v, %v", active, err)
	}
	all, err := s.Alerts(ctx(t), false, 10)
	if err != nil || len(all) != 2 || all[1].ID != a.ID || all[1].Active() || !all[1].ResolvedAt.Equal(a.ResolvedAt) || all[1].Value != 0.93 {
		t.Fatalf("all = %+v, %v", all, err)
	}
}

// testText: headers and TERM reasons come from any publisher. NUL bytes and
// invalid UTF-8 (which PostgreSQL's TEXT refuses) are stored as U+FFFD by
// every store, and the rest of the batch is not held up.
func testText(t *testing.T, s store.Store) {
	base := time.Now().UTC().Truncate(time.Millisecond)
	bad := send(1, "a", "b", base)
	bad.MessageID, bad.Correlation = "m\x00-1", "corr-\xff"
	term := ev(store.EventTerm, 1, "b_normal", 1, base.Add(time.Millisecond))
	term.Reason = "INVALID: bad\x00reason\xff"
	mustApply(t, s, store.Batch{Sends: []store.Send{bad, send(2, "a", "b", base)}, Events: []store.Event{term}})
	r := get(t, s, 1, "b_normal")
	if r.MessageID != "m\uFFFD-1" || r.Correlation != "corr-\uFFFD" || r.Status != store.StatusInvalid {
		t.Fatalf("row 1 = id %q, correlation %q, status %s", r.MessageID, r.Correlation, r.Status)
	}
	if len(r.History) != 1 || r.History[0].Reason != "INVALID: bad\uFFFDreason\uFFFD" || r.NackReason != r.History[0].Reason {
		t.Fatalf("row 1 history %+v, nack reason %q", r.History, r.NackReason)
	}
	if r := get(t, s, 2, "b_normal"); r.MessageID != "m-2" {
		t.Fatalf("row 2 = %+v", r)
	}
}

// testInvalid: a TERM whose reason starts with "INVALID: " makes the row
// INVALID, its sender's failure: it counts in no rate of its receiver
// (only in Invalid beside them) and in its sender's SenderRates, once the
// sender is known; it is due a follow-up like a NACK.
func testInvalid(t *testing.T, s store.Store) {
	now := time.Now().UTC().Truncate(time.Millisecond)
	term := func(seq uint64, consumer, reason string) store.Event {
		e := ev(store.EventTerm, seq, consumer, 1, now.Add(time.Millisecond))
		e.Reason = reason
		return e
	}
	a := mustApply(t, s, store.Batch{
		Sends: []store.Send{send(1, "bad", "b", now), send(2, "good", "b", now), send(3, "bad", "c", now),
			send(4, "bad", "b", now), send(5, "good", "b", now)},
		Events: []store.Event{term(1, "b_normal", "INVALID: not an envelope"), ev(store.EventAck, 2, "b_normal", 1, now),
			term(3, "c_normal", "NOT_FOUND: no such customer"), term(4, "b_normal", "INVALID:no space"),
			term(5, "b_normal", "invalid: lower case")},
	})
	status := map[uint64]string{}
	for _, r := range a.Resolved {
		status[r.StreamSeq] = r.Status
	}
	want := map[uint64]string{1: store.StatusInvalid, 2: store.StatusACK, 3: store.StatusNACK, 4: store.StatusNACK, 5: store.StatusNACK}
	if fmt.Sprint(status) != fmt.Sprint(want) {
		t.Fatalf("resolved %v, want %v", status, want)
	}
	if r := get(t, s, 1, "b_normal"); r.Status != store.StatusInvalid || r.NackReason != "INVALID: not an envelope" || r.AcknowledgedAt.IsZero() {
		t.Fatalf("row 1 = %+v", r)
	}
	// An INVALID TERM before its send: the sender is not known yet.
	mustApply(t, s, store.Batch{Events: []store.Event{term(6, "b_normal", "INVALID: bad subject")}})
	rates, err := s.Rates(ctx(t), now.Add(-time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if len(rates) != 2 {
		t.Fatalf("rates = %+v", rates)
	}
	if rb := rates[0]; rb.Agent != "b" || rb.Acked != 1 || rb.Nacked != 2 || rb.Invalid != 2 || rb.Resolved() != 3 || rb.Sent != 4 {
		t.Fatalf("rate of b = %+v; want 1 ACK, 2 NACK (reasons without the exact prefix), 2 INVALID beside the 3 resolved", rb)
	}
	senders := func() string {
		t.Helper()
		rs, err := s.SenderRates(ctx(t), now.Add(-time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		return fmt.Sprint(rs)
	}
	if got := senders(); got != "[{bad 3 1} {good 2 0}]" {
		t.Fatalf("sender rates = %s; want bad: 1 invalid of 3, good: 0 of 2 (the row without a send left out)", got)
	}
	mustApply(t, s, store.Batch{Sends: []store.Send{send(6, "bad", "b", now)}})
	if got := senders(); got != "[{bad 4 2} {good 2 0}]" {
		t.Fatalf("sender rates after the send = %s", got)
	}
	if rs, err := s.SenderRates(ctx(t), now.Add(time.Minute)); err != nil || len(rs) != 0 {
		t.Fatalf("sender rates of a window after everything = %+v, %v", rs, err)
	}
	if all, err := s.SenderRates(ctx(t), time.Time{}); err != nil || fmt.Sprint(all) != "[{bad 4 2} {good 2 0}]" {
		t.Fatalf("all-time sender rates = %+v, %v", all, err)
	}
	inv, err := s.Messages(ctx(t), store.Query{Status: store.StatusInvalid})
	if err != nil || len(inv) != 2 || inv[0].StreamSeq != 6 || inv[1].StreamSeq != 1 {
		t.Fatalf("INVALID rows = %+v, %v", inv, err)
	}
	due, err := s.PendingFollowUps(ctx(t), store.Key{}, 10)
	if err != nil {
		t.Fatal(err)
	}
	var seqs []uint64
	for _, r := range due {
		seqs = append(seqs, r.StreamSeq)
	}
	if fmt.Sprint(seqs) != "[1 3 4 5 6]" {
		t.Fatalf("due follow-ups %v, want the INVALID rows with the NACKs", seqs)
	}
	var invalid int64
	pts, err := s.Series(ctx(t), "b", now.Add(-time.Minute), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pts {
		invalid += p.Invalid
	}
	if invalid != 2 {
		t.Fatalf("series of b = %+v; want 2 INVALID", pts)
	}
}

// testRefused: the rows of refused TERM and MAX_DELIVERIES events
// (Batch.Refused), whose outcome is lost, are not pending for an inferred
// ACK, also when the row comes later; refused events of other kinds leave
// their rows pending, and a real event still decides a row. An empty
// batch is a write that changes nothing, and fails once the store is
// closed.
func testRefused(t *testing.T, s store.Store) {
	base := time.Now().UTC().Truncate(time.Millisecond)
	term, nak := ev(store.EventTerm, 1, "b_normal", 1, base), ev(store.EventNak, 2, "b_normal", 1, base)
	term.Reason = "bad\x00reason\xff" // not recorded
	exhausted := ev(store.EventMax, 4, "b_normal", 3, base)
	exhausted.ID = "id-\xff" // stored as text like any other
	mustApply(t, s, store.Batch{Sends: []store.Send{send(1, "a", "b", base), send(2, "a", "b", base), send(3, "a", "b", base)}})
	a := mustApply(t, s, store.Batch{Refused: []store.Event{term, nak, exhausted}})
	if len(a.NewEvents)+len(a.NewSends)+len(a.Resolved) != 0 {
		t.Fatalf("refused events applied: %+v", a)
	}
	mustApply(t, s, store.Batch{Refused: []store.Event{term}})                 // a replay
	mustApply(t, s, store.Batch{Sends: []store.Send{send(4, "a", "b", base)}}) // the row comes later
	pending := func() []uint64 {
		recs, err := s.Pending(ctx(t), store.Key{}, 10)
		if err != nil {
			t.Fatal(err)
		}
		var seqs []uint64
		for _, r := range recs {
			seqs = append(seqs, r.StreamSeq)
		}
		return seqs
	}
	if got := pending(); fmt.Sprint(got) != "[2 3]" {
		t.Fatalf("Pending = %v, want [2 3]: the rows of the refused TERM and MAX_DELIVERIES left out", got)
	}
	if r := get(t, s, 1, "b_normal"); r.Final() || len(r.History) != 0 {
		t.Fatalf("row 1 after its TERM was refused = %+v; want pending, no history", r)
	}
	mustApply(t, s, store.Batch{Events: []store.Event{ev(store.EventAck, 2, "b_normal", 2, base.Add(time.Millisecond))}})
	if r := get(t, s, 2, "b_normal"); r.Status != store.StatusACK {
		t.Fatalf("row 2 after its ACK = %s", r.Status)
	}

	before, err := s.Rates(ctx(t), time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if a := mustApply(t, s, store.Batch{}); len(a.NewEvents)+len(a.NewSends)+len(a.Resolved) != 0 {
		t.Fatalf("empty batch applied %+v", a)
	}
	mustApply(t, s, store.Batch{})
	if after, err := s.Rates(ctx(t), time.Time{}); err != nil || fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("rates after empty batches = %+v, %v; want %+v", after, err, before)
	}
	if got := pending(); fmt.Sprint(got) != "[3]" {
		t.Fatalf("Pending = %v, want [3]", got)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Apply(ctx(t), store.Batch{}); err == nil {
		t.Fatal("empty batch on a closed store: no error")
	}
}

// testPendingRows: Messages with Query.Pending lists the rows without a
// final status, oldest first, with or without a receiver, those of refused
// events and rows without a recorded send included; CountPending counts
// the pending rows whose send is older than a given time, so rows that
// stay pending can be found and counted.
func testPendingRows(t *testing.T, s store.Store) {
	now := time.Now().UTC().Truncate(time.Millisecond)
	old := now.Add(-3 * time.Hour)
	other := send(4, "a", "c", old) // another receiver
	mustApply(t, s, store.Batch{
		Sends: []store.Send{send(1, "a", "b", old), send(2, "a", "b", old), send(3, "a", "b", old), other,
			send(5, "a", "b", now), send(6, "a", "b", now)},
		// 1 and 6 are acked; 7 is a topic row whose send is not recorded.
		Events: []store.Event{ev(store.EventAck, 1, "b_normal", 1, now), ev(store.EventAck, 6, "b_normal", 1, now),
			ev(store.EventNak, 7, "b_normal", 1, now)},
		Refused: []store.Event{ev(store.EventTerm, 3, "b_normal", 1, now)}, // 3 stays pending for good
	})
	keys := func(q store.Query) string {
		t.Helper()
		recs, err := s.Messages(ctx(t), q)
		if err != nil {
			t.Fatalf("Messages(%+v): %v", q, err)
		}
		var out []string
		for _, r := range recs {
			if r.Final() {
				t.Errorf("Messages(%+v) returned row %d/%s with status %s", q, r.StreamSeq, r.Consumer, r.Status)
			}
			out = append(out, fmt.Sprintf("%d/%s", r.StreamSeq, r.Consumer))
		}
		return fmt.Sprint(out)
	}
	for _, c := range []struct {
		q    store.Query
		want string
	}{
		{store.Query{Pending: true}, "[2/b_normal 3/b_normal 4/c_normal 5/b_normal 7/b_normal]"},
		{store.Query{Pending: true, Limit: 2}, "[2/b_normal 3/b_normal]"},
		{store.Query{Pending: true, Receiver: "b"}, "[2/b_normal 3/b_normal 5/b_normal 7/b_normal]"},
		{store.Query{Pending: true, Receiver: "c"}, "[4/c_normal]"},
		{store.Query{Pending: true, Receiver: "x"}, "[]"},
	} {
		if got := keys(c.q); got != c.want {
			t.Errorf("Messages(%+v) = %s, want %s", c.q, got, c.want)
		}
	}
	if acked, err := s.Messages(ctx(t), store.Query{Status: store.StatusACK}); err != nil || len(acked) != 2 || acked[0].StreamSeq != 6 {
		t.Errorf("Messages(ACK) = %+v, %v; want rows 6 and 1, newest first", acked, err)
	}
	count := func(sentBefore time.Time) int64 {
		t.Helper()
		n, err := s.CountPending(ctx(t), sentBefore)
		if err != nil {
			t.Fatalf("CountPending(%v): %v", sentBefore, err)
		}
		return n
	}
	if n := count(now.Add(-time.Hour)); n != 3 {
		t.Errorf("CountPending(an hour ago) = %d, want 3 (rows 2, 3 and 4)", n)
	}
	if n := count(now.Add(time.Second)); n != 4 {
		t.Errorf("CountPending(now) = %d, want 4 (rows 2 to 5; row 7 has no send)", n)
	}
	if n := count(old); n != 0 {
		t.Errorf("CountPending(the old sends' time) = %d, want 0", n)
	}
	mustApply(t, s, store.Batch{Events: []store.Event{ev(store.EventMax, 2, "b_normal", 3, now)}})
	if n := count(now.Add(-time.Hour)); n != 2 {
		t.Errorf("CountPending(an hour ago) = %d after row 2 timed out, want 2", n)
	}
	if got, want := keys(store.Query{Pending: true, Limit: 1}), "[3/b_normal]"; got != want {
		t.Errorf("first pending row after row 2 timed out: %s, want %s", got, want)
	}
}
