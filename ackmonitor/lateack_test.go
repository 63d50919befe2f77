package ackmonitor_test

import (
	"context"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agentmesh-io/agentmesh/ackmonitor/store"
	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/internal/natstest"
)

// lateAckHandlerTime is how long the worker's handler runs: well above
// what agentkit takes to ack a redelivery it already handled, so the
// ledger has the evidence store.LateAckRule asks for (a late ack takes at
// most half the fastest first-delivery ack). A loaded machine running
// this race-instrumented process, two whole test suites at once, stalled
// that ack for up to about half a second. It stays well below the
// progress interval (a quarter of lateAckTimeout), so its ack times are
// its own, not the time since its last InProgress.
const lateAckHandlerTime = 2 * time.Second

// lateAckTimeout is the worker's ack timeout: what a lost ack or a crash
// costs before the redelivery.
const lateAckTimeout = 16 * time.Second

// A handled message whose ack is lost is redelivered and acked by
// agentkit as a duplicate: the ledger counts a late ack, not a timeout.
// A message whose first delivery nobody acked (its instance crashed) and
// whose redelivery another instance handles is a timeout.
func TestLateAck_LostAckIsNoTimeout(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	st := openStore(t, sqliteStore)
	ctx := testCtx(t)
	mon := startMonitor(t, m.s, fastConfig(st))
	client := m.agent("client", nil)

	// Ack timeouts short enough that redeliveries come soon, long enough
	// that no handler here needs an InProgress; a processing limit longer
	// than any handler.
	pol := agentkit.DeliveryPolicy{BackOff: []time.Duration{lateAckTimeout}, MaxDeliver: 3, ProcessingLimit: time.Minute,
		Prefetch: 1, MaxAckPending: 100}
	release, stalling := make(chan struct{}), make(chan struct{}, 1)
	handlers := map[string]agentkit.HandlerFunc{
		"work": func(context.Context, *agentkit.Message) error {
			time.Sleep(lateAckHandlerTime)
			return nil
		},
		// "stall" never finishes its first delivery: its instance
		// crashes holding it. A redelivery runs as "work" does.
		"stall": func(_ context.Context, msg *agentkit.Message) error {
			if msg.Delivery == 1 {
				stalling <- struct{}{}
				<-release
				return nil
			}
			time.Sleep(lateAckHandlerTime)
			return nil
		},
	}
	var lose atomic.Bool      // drop the first-delivery acks of worker_normal
	var lostSeq atomic.Uint64 // the stream sequence of the last one dropped
	loss := &ackLoss{drop: func(subject string) bool {
		// $JS.ACK.MESH.worker_normal.<delivery count>.<stream seq>...
		tok := strings.Split(subject, ".")
		if !lose.Load() || len(tok) < 6 || tok[3] != "worker_normal" || tok[4] != "1" {
			return false
		}
		seq, err := strconv.ParseUint(tok[5], 10, 64)
		if err != nil {
			return false
		}
		lostSeq.Store(seq)
		return true
	}}
	nc := natstest.Connect(t, m.s, nats.SetCustomDialer(loss))
	startWorker(t, nc, handlers, pol)
	t.Cleanup(func() { close(release) }) // before the workers stop

	send := func(action string) *wire.Envelope {
		t.Helper()
		env, err := client.Send(ctx, "worker", action, nil)
		if err != nil {
			t.Fatal(err)
		}
		return env
	}
	// First deliveries tell the ledger how long the handler takes.
	for range store.LateAckMinSamples + 1 {
		send("work")
	}
	eventually(t, 30*time.Second, "first deliveries acked", func() bool {
		return rateOf(t, st, "worker", "normal").Acked == store.LateAckMinSamples+1
	})

	// Its ack lost, a handled message comes back after the ack timeout
	// and agentkit acks it without running the handler.
	lose.Store(true)
	send("work")
	eventually(t, 30*time.Second, "the ack lost", func() bool { return loss.dropped.Load() == 1 })
	lose.Store(false)
	lost := store.Key{StreamSeq: lostSeq.Load(), Consumer: "worker_normal"}
	var r store.Record
	eventually(t, lateAckTimeout+30*time.Second, "the redelivery acked", func() bool {
		var err error
		r, err = st.Get(ctx, lost)
		return err == nil && r.Final()
	})
	if r.Status != store.StatusACK || r.Deliveries != 2 || r.Timeouts != 0 || r.LateAcks != 1 {
		t.Errorf("row of the lost ack = status %s deliveries %d timeouts %d late acks %d, ack time %v; want ACK, 2, 0, 1",
			r.Status, r.Deliveries, r.Timeouts, r.LateAcks, r.ProcessingTime)
	}
	t.Logf("duplicate ack: ack time %v", r.ProcessingTime)

	// A real timeout: the instance holding the message crashes without
	// an ack; another instance of the worker handles the redelivery.
	stalled := send("stall")
	select {
	case <-stalling:
	case <-time.After(30 * time.Second):
		t.Fatal("the stalling handler did not start")
	}
	nc.Close()
	// An instance that does not take turns: nothing hands the crashed
	// one's message back (instances taking turns do, after probes: see
	// TestLateAck_HandedBackIsANak), so it returns after its ack timeout.
	startWorker(t, m.conn(), handlers, pol, agentkit.WithConcurrentInstances())
	r = ackedRow(t, ctx, st, stalled.MessageID, lateAckTimeout+30*time.Second)
	if r.Deliveries != 2 || r.Timeouts != 1 || r.LateAcks != 0 {
		t.Errorf("row of the crash = deliveries %d timeouts %d late acks %d, ack time %v; want 2, 1, 0",
			r.Deliveries, r.Timeouts, r.LateAcks, r.ProcessingTime)
	}
	t.Logf("retried handler: ack time %v", r.ProcessingTime)

	if rate := rateOf(t, st, "worker", "normal"); rate.Timeouts != 1 || rate.LateAcks != 1 || rate.TimedOut != 0 {
		t.Errorf("rate = %+v; want 1 delivery timeout, 1 late ack, nothing exhausted", rate)
	}
	rec := httptest.NewRecorder()
	mon.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	for _, want := range []string{`ackmonitor_late_acks_total{agent="worker",priority="normal"} 1`,
		`ackmonitor_delivery_timeouts_total{agent="worker",priority="normal"} 1`} {
		if !strings.Contains(rec.Body.String(), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

// A message whose instance crashed holding it, and which the standby
// taking over hands back (a NAK) instead of waiting out its ack timeout,
// is a NAK in the ledger: neither a timeout nor a late ack.
func TestLateAck_HandedBackIsANak(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	st := openStore(t, sqliteStore)
	ctx := testCtx(t)
	startMonitor(t, m.s, fastConfig(st))
	client := m.agent("client", nil)

	// An ack timeout longer than the wait below: only the hand-back can
	// bring the message back in time.
	pol := agentkit.DeliveryPolicy{BackOff: []time.Duration{10 * time.Minute}, MaxDeliver: 3, ProcessingLimit: time.Hour,
		Prefetch: 1, MaxAckPending: 100}
	release, stalling := make(chan struct{}), make(chan struct{}, 1)
	handlers := map[string]agentkit.HandlerFunc{"stall": func(_ context.Context, msg *agentkit.Message) error {
		if msg.Delivery == 1 {
			stalling <- struct{}{}
			<-release
		}
		return nil
	}}
	hb := agentkit.WithHeartbeat(time.Second)
	nc := m.conn()
	elder := startWorker(t, nc, handlers, pol, hb)
	t.Cleanup(func() { close(release) }) // before the workers stop
	standby := startWorker(t, m.conn(), handlers, pol, hb)
	eventually(t, 10*time.Second, "the elder consumes, the standby stands by", func() bool { return elder.Consuming() && !standby.Consuming() })
	env, err := client.Send(ctx, "worker", "stall", nil)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-stalling:
	case <-time.After(30 * time.Second):
		t.Fatal("the stalling handler did not start")
	}
	nc.Close()
	r := ackedRow(t, ctx, st, env.MessageID, time.Minute)
	if r.Deliveries != 2 || r.Naks != 1 || r.Timeouts != 0 || r.LateAcks != 0 {
		t.Errorf("row = deliveries %d naks %d timeouts %d late acks %d; want 2, 1, 0, 0", r.Deliveries, r.Naks, r.Timeouts, r.LateAcks)
	}
}

// ackedRow waits at most d for the ledger's ACK row of the message to
// "worker" with id, and returns it.
func ackedRow(t *testing.T, ctx context.Context, st store.Store, id string, d time.Duration) store.Record {
	t.Helper()
	var r store.Record
	eventually(t, d, "message "+id+" acked", func() bool {
		rows, err := st.Messages(ctx, store.Query{Receiver: "worker", Status: store.StatusACK, Limit: 100})
		if err != nil {
			t.Fatal(err)
		}
		for _, x := range rows {
			if x.MessageID == id {
				r = x
				return true
			}
		}
		return false
	})
	return r
}

// startWorker starts an instance of agent "worker" on nc.
func startWorker(t *testing.T, nc *nats.Conn, handlers map[string]agentkit.HandlerFunc, pol agentkit.DeliveryPolicy, opts ...agentkit.Option) *agentkit.Agent {
	t.Helper()
	a, err := agentkit.New(nc, "worker", append([]agentkit.Option{agentkit.WithPolicy(wire.PriorityNormal, pol)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Stop)
	for action, h := range handlers {
		if err := a.Handle(action, h); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Start(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	return a
}
