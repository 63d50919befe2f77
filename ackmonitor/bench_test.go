package ackmonitor_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/ackmonitor"
	"github.com/agentmesh-io/agentmesh/ackmonitor/store"
	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/internal/natstest"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// BenchmarkIntake measures how fast the monitor turns a backlog into the
// ledger: one op is one message, i.e. one send (headers-only consumer) and
// one ack metric (100 % sampling), written as one ledger row. Reported:
// events/s (sends + acks), rows/s and the catch-up lag of the last event.
// Run with e.g. -bench Intake -benchtime 20000x.
func BenchmarkIntake(b *testing.B) {
	for _, kind := range []storeKind{sqliteStore, postgresStore} {
		b.Run(string(kind), func(b *testing.B) { benchIntake(b, kind) })
	}
}

func benchIntake(b *testing.B, kind storeKind) {
	s := natstest.RunServer(b)
	nc := natstest.Connect(b, s)
	ctx := context.Background()
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	st := openStore(b, kind)
	// The monitor's streams exist before traffic, as in production.
	cfg := ackmonitor.Config{Store: st, FetchWait: 100 * time.Millisecond, BatchSize: 512}
	mnc := natstest.Connect(b, s)
	mon, err := ackmonitor.New(mnc, cfg)
	if err != nil {
		b.Fatal(err)
	}
	if err := agentkit.EnsureStream(ctx, js, agentkit.StreamConfig(subjects.Default, 1)); err != nil {
		b.Fatal(err)
	}
	events := jetstream.StreamConfig{Name: "MESH_EVENTS", Subjects: subjects.Default.EventsSubjects(), Storage: jetstream.FileStorage}
	if _, err := js.CreateStream(ctx, events); err != nil {
		b.Fatal(err)
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, "MESH", jetstream.ConsumerConfig{Durable: "b_normal",
		FilterSubject: "mesh.agent.b.normal.*", AckPolicy: jetstream.AckExplicitPolicy, SampleFrequency: "100", MaxAckPending: 10000})
	if err != nil {
		b.Fatal(err)
	}
	n := b.N
	for i := range n {
		msg := &nats.Msg{Subject: "mesh.agent.b.normal.a", Data: []byte(`{}`), Header: nats.Header{
			wire.HeaderMsgID: {"bench-" + strconv.Itoa(i)}, wire.HeaderType: {"request"}, wire.HeaderAction: {"work"}}}
		if _, err := js.PublishMsgAsync(msg); err != nil {
			b.Fatal(err)
		}
	}
	<-js.PublishAsyncComplete()
	acked := 0
	for acked < n {
		batch, err := cons.Fetch(min(1000, n-acked), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			b.Fatal(err)
		}
		for msg := range batch.Messages() {
			if err := msg.Ack(); err != nil {
				b.Fatal(err)
			}
			acked++
		}
	}
	evs, _ := js.Stream(ctx, "MESH_EVENTS")
	deadline := time.Now().Add(time.Minute)
	for {
		info, err := evs.Info(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if info.State.Msgs >= uint64(n) {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("only %d of %d ack metrics captured", info.State.Msgs, n)
		}
		time.Sleep(5 * time.Millisecond)
	}

	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	b.ResetTimer()
	start := time.Now()
	go func() { done <- mon.Run(rctx) }()
	for !lastRowDone(st, n) {
		if time.Since(start) > 10*time.Minute {
			b.Fatal("monitor did not catch up in 10 minutes")
		}
		time.Sleep(5 * time.Millisecond)
	}
	elapsed := time.Since(start)
	b.StopTimer()
	r := rateOf(b, st, "b", "normal")
	cancel()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	if r.Sent != int64(n) || r.Acked != int64(n) {
		b.Fatalf("ledger has sent %d acked %d, want %d", r.Sent, r.Acked, n)
	}
	b.ReportMetric(float64(2*n)/elapsed.Seconds(), "events/s")
	b.ReportMetric(float64(n)/elapsed.Seconds(), "rows/s")
	b.Logf("%s: %d messages (%d events) in %v", kind, n, 2*n, elapsed)
}

// BenchmarkLive runs the monitor while traffic flows: a publisher stores
// b.N messages as fast as it can while a consumer acks them (100 %
// sampling). Reported: the pipeline's messages/s and catch-up-ms, the time
// from the last ack to the last ledger row (the monitor's lag behind the
// mesh at the end of a burst), and lag-ms, the age of the newest event in
// the last committed batch.
func BenchmarkLive(b *testing.B) {
	for _, kind := range []storeKind{sqliteStore, postgresStore} {
		b.Run(string(kind), func(b *testing.B) { benchLive(b, kind) })
	}
}

func benchLive(b *testing.B, kind storeKind) {
	s := natstest.RunServer(b)
	nc := natstest.Connect(b, s)
	ctx := context.Background()
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	st := openStore(b, kind)
	mon, err := ackmonitor.New(natstest.Connect(b, s), ackmonitor.Config{Store: st, FetchWait: 100 * time.Millisecond, BatchSize: 512})
	if err != nil {
		b.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- mon.Run(rctx) }()
	<-mon.Ready()
	// A deployed monitor is active: it alone evaluates, escalates and
	// takes events from core NATS too.
	eventually(b, time.Minute, "the monitor active", mon.Active)
	cons, err := js.CreateOrUpdateConsumer(ctx, "MESH", jetstream.ConsumerConfig{Durable: "b_normal",
		FilterSubject: "mesh.agent.b.normal.*", AckPolicy: jetstream.AckExplicitPolicy, SampleFrequency: "100", MaxAckPending: 10000})
	if err != nil {
		b.Fatal(err)
	}
	n := b.N
	ackedAll := make(chan time.Time, 1)
	cc, err := cons.Consume(func(msg jetstream.Msg) {
		msg.Ack()
		if md, _ := msg.Metadata(); md != nil && md.Sequence.Consumer == uint64(n) {
			ackedAll <- time.Now()
		}
	})
	if err != nil {
		b.Fatal(err)
	}
	defer cc.Stop()
	b.ResetTimer()
	start := time.Now()
	for i := range n {
		msg := &nats.Msg{Subject: "mesh.agent.b.normal.a", Data: []byte(`{}`), Header: nats.Header{
			wire.HeaderMsgID: {"live-" + strconv.Itoa(i)}, wire.HeaderType: {"request"}, wire.HeaderAction: {"work"}}}
		if _, err := js.PublishMsgAsync(msg); err != nil {
			b.Fatal(err)
		}
	}
	<-js.PublishAsyncComplete()
	var lastAck time.Time
	select {
	case lastAck = <-ackedAll:
	case <-time.After(5 * time.Minute):
		b.Fatal("consumer did not ack everything")
	}
	for !lastRowDone(st, n) {
		if time.Since(lastAck) > 5*time.Minute {
			b.Fatal("monitor did not catch up in 5 minutes")
		}
		time.Sleep(5 * time.Millisecond)
	}
	end := time.Now()
	if r := rateOf(b, st, "b", "normal"); r.Sent != int64(n) || r.Acked != int64(n) {
		b.Fatalf("ledger has sent %d acked %d, want %d", r.Sent, r.Acked, n)
	}
	sum, err := mon.Summary(ctx)
	if err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	cancel()
	<-done
	b.ReportMetric(float64(n)/end.Sub(start).Seconds(), "msgs/s")
	b.ReportMetric(float64(end.Sub(lastAck).Milliseconds()), "catch-up-ms")
	b.ReportMetric(sum.LagSeconds*1000, "lag-ms")
}

// lastRowDone reports whether the ledger row of the n-th (last) message has
// both its send and its ack. Each intake commits its stream in order, so
// then every earlier send and ack is in the ledger too (checked after).
func lastRowDone(st store.Store, n int) bool {
	r, err := st.Get(context.Background(), store.Key{StreamSeq: uint64(n), Consumer: "b_normal"})
	return err == nil && !r.SentAt.IsZero() && r.Status == store.StatusACK
}

// BenchmarkDeadLetters measures the follow-up path: b.N terminated
// messages, their originals in the message stream and their sends and
// TERM events in the ledger (as the intakes write them), are copied to
// the dead-letter stream and their rows completed by a monitor that finds
// them all due when it becomes active. Reported: dead-letters/s, from the
// moment the monitor is active to the last row recorded. The cluster
// variant runs on three nodes with R3 streams and steps the leader of the
// dead-letter stream down every 250ms meanwhile. Run with e.g.
// -bench DeadLetters -benchtime 2000x.
func BenchmarkDeadLetters(b *testing.B) {
	for _, kind := range []storeKind{sqliteStore, postgresStore} {
		b.Run(string(kind), func(b *testing.B) {
			s := natstest.RunServer(b)
			benchDeadLetters(b, kind, func() *nats.Conn { return natstest.Connect(b, s) }, 1, nil)
		})
	}
	b.Run("cluster-stepdowns", func(b *testing.B) {
		c := natstest.RunCluster(b, 3)
		admin := c.Connect(b)
		stepDown := func() {
			_, _ = admin.Request(subjects.API("STREAM", "LEADER", "STEPDOWN", subjects.Default.DLQStream()), nil, time.Second)
		}
		benchDeadLetters(b, sqliteStore, func() *nats.Conn { return c.Connect(b) }, 3, stepDown)
	})
}

func benchDeadLetters(b *testing.B, kind storeKind, connect func() *nats.Conn, replicas int, stepDown func()) {
	ctx := context.Background()
	js, err := jetstream.New(connect())
	if err != nil {
		b.Fatal(err)
	}
	natstest.WaitFor(b, 30*time.Second, func() error {
		return agentkit.EnsureStream(ctx, js, agentkit.StreamConfig(subjects.Default, replicas))
	})
	st := openStore(b, kind)
	n := b.N
	body := []byte(`{"acl":"1","payload":"` + strings.Repeat("x", 480) + `"}`)
	now := time.Now().UTC()
	var batch store.Batch
	for i := range n {
		id := "dead-" + strconv.Itoa(i)
		msg := &nats.Msg{Subject: "mesh.agent.b.normal.a", Data: body, Header: nats.Header{
			wire.HeaderMsgID: {id}, wire.HeaderType: {"request"}, wire.HeaderAction: {"work"}}}
		if _, err := js.PublishMsgAsync(msg); err != nil {
			b.Fatal(err)
		}
		seq := uint64(i + 1)
		batch.Sends = append(batch.Sends, store.Send{StreamSeq: seq, MessageID: id, Sender: "a", Receiver: "b", Kind: "agent",
			Priority: "normal", MessageType: "request", Action: "work", SentAt: now})
		batch.Events = append(batch.Events, store.Event{ID: "term-" + id, Kind: store.EventTerm, Consumer: "b_normal",
			Receiver: "b", Priority: "normal", StreamSeq: seq, Deliveries: 1, Reason: "REJECTED: no", At: now})
		if len(batch.Sends) == 1000 || i == n-1 {
			if _, err := st.Apply(ctx, batch); err != nil {
				b.Fatal(err)
			}
			batch = store.Batch{}
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(time.Minute):
		b.Fatal("originals not stored")
	}
	cfg := fastConfig(st)
	cfg.Replicas, cfg.UnavailableFor = replicas, -1
	mon, err := ackmonitor.New(connect(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	b.ResetTimer()
	go func() { done <- mon.Run(rctx) }()
	for !mon.Active() {
		time.Sleep(time.Millisecond)
	}
	start := time.Now()
	stop := make(chan struct{})
	stepping := make(chan int, 1)
	go func() {
		n := 0
		defer func() { stepping <- n }()
		if stepDown == nil {
			return
		}
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for {
			stepDown()
			n++
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()
	for {
		due, err := st.PendingFollowUps(ctx, store.Key{}, 1)
		if err != nil {
			b.Fatal(err)
		}
		if len(due) == 0 {
			break
		}
		if time.Since(start) > 10*time.Minute {
			b.Fatal("follow-ups not done in 10 minutes")
		}
		time.Sleep(5 * time.Millisecond)
	}
	elapsed := time.Since(start)
	b.StopTimer()
	close(stop)
	stepDowns := <-stepping
	cancel()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	recs, err := st.Messages(ctx, store.Query{DeadLetter: true, Limit: 1})
	if err != nil || len(recs) != 1 {
		b.Fatalf("dead-lettered rows: %v, %v", recs, err)
	}
	dlqStream, err := js.Stream(ctx, subjects.Default.DLQStream())
	if err != nil {
		b.Fatal(err)
	}
	info, err := dlqStream.Info(ctx)
	if err != nil {
		b.Fatal(err)
	}
	if info.State.Msgs != uint64(n) {
		b.Fatalf("the DLQ holds %d copies of %d messages", info.State.Msgs, n)
	}
	b.ReportMetric(float64(n)/elapsed.Seconds(), "dead-letters/s")
	b.Logf("%s: %d dead letters in %v (%d DLQ leader step-downs)", kind, n, elapsed, stepDowns)
}
