package ackmonitor_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentmesh-io/agentmesh/ackmonitor/store"
	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/internal/metricstest"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// TestIntake_PullsDropNothing runs the intake at its shortest pull
// (FetchWait 10ms) through a burst of events: every event the server
// delivers reaches the monitor and is acked at once. A pull cut off at a
// client deadline drops the messages the server sent just before it; they
// would stay unacked until AckWait (here 30s) and the server redeliver
// them then.
func TestIntake_PullsDropNothing(t *testing.T) {
	t.Parallel()
	const n = 2000
	m := newMesh(t)
	st := openStore(t, sqliteStore)
	ctx := testCtx(t)
	m.agent("worker", map[string]agentkit.HandlerFunc{"ok": func(context.Context, *agentkit.Message) error { return nil }})
	client := m.agent("client", nil)
	cfg := fastConfig(st)
	cfg.FetchWait, cfg.AckWait = 10*time.Millisecond, 30*time.Second
	mon := startMonitor(t, m.s, cfg)
	eventually(t, 20*time.Second, "the monitor active", mon.Active)

	envs := make([]*wire.Envelope, n)
	for i := range envs {
		var err error
		if envs[i], err = client.NewRequest(ctx, "worker", "ok", nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := client.SendBatch(ctx, envs); err != nil {
		t.Fatal(err)
	}
	// The pulls' AckWait is 30s: a dropped message stalls the count longer than 10s.
	progressing(t, st, "worker", 10*time.Second, "every ACK in the ledger", func() bool { return rateOf(t, st, "worker", "normal").Acked == n })
	events, err := m.jetstream().Consumer(ctx, subjects.Default.EventsStream(), "ackmonitor_events")
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "every event delivered to the monitor acked", func() bool {
		info, err := events.Info(ctx)
		return err == nil && info.NumPending == 0 && info.NumAckPending == 0
	})
}

// refusing is a ledger that refuses the batches refuse picks.
type refusing struct {
	store.Store
	refuse   func(store.Batch) bool
	refusals *atomic.Int64 // counts the writes refused, if set
}

func (s refusing) Apply(ctx context.Context, b store.Batch) (store.Applied, error) {
	if s.refuse(b) {
		if s.refusals != nil {
			s.refusals.Add(1)
		}
		return store.Applied{}, errors.New("cannot store that")
	}
	return s.Store.Apply(ctx, b)
}

// outage is a ledger that refuses every write, checks included, while
// down is set, counting its refusals.
type outage struct {
	down     atomic.Bool
	refusals atomic.Int64
}

// ledger wraps st in the outage.
func (o *outage) ledger(st store.Store) store.Store {
	return refusing{Store: st, refuse: func(store.Batch) bool {
		if o.down.Load() {
			o.refusals.Add(1)
			return true
		}
		return false
	}}
}

// TestIntake_RefusedMessageHoldsUpNothing: a message the ledger refuses
// fails its batch, and the batch is written again in parts: the
// others are recorded at once, and the refused one, after a few passes
// that wrote others, is terminated and counted instead of failing every
// batch for good.
func TestIntake_RefusedMessageHoldsUpNothing(t *testing.T) {
	t.Parallel()
	const others = 20
	m := newMesh(t)
	st := openStore(t, sqliteStore)
	ctx := testCtx(t)
	m.agent("worker", map[string]agentkit.HandlerFunc{"ok": func(context.Context, *agentkit.Message) error { return nil }})
	client := m.agent("client", nil)
	envs := []*wire.Envelope{}
	for i := range others + 1 {
		var opts []agentkit.SendOption
		if i == others/2 {
			opts = append(opts, agentkit.WithMessageID("poison"))
		}
		e, err := client.NewRequest(ctx, "worker", "ok", nil, opts...)
		if err != nil {
			t.Fatal(err)
		}
		envs = append(envs, e)
	}
	if err := client.SendBatch(ctx, envs); err != nil { // in the stream before the monitor starts: one fetch
		t.Fatal(err)
	}
	poison := func(b store.Batch) bool { // data a store cannot take
		return slices.ContainsFunc(b.Sends, func(x store.Send) bool { return x.MessageID == "poison" })
	}
	var refusals atomic.Int64
	mon := startMonitor(t, m.s, fastConfig(refusing{Store: st, refuse: poison, refusals: &refusals}))
	metrics := httptest.NewServer(mon.Handler())
	t.Cleanup(metrics.Close)
	eventually(t, 20*time.Second, "the other sends recorded", func() bool {
		recs, err := st.Messages(ctx, store.Query{Receiver: "worker", Limit: 100})
		n := 0
		for _, r := range recs {
			if !r.SentAt.IsZero() && r.MessageID != "poison" {
				n++
			}
		}
		return err == nil && n == others
	})
	// A refused message counts only in passes that write others: as it
	// would under load, it keeps meeting new messages.
	stop := steadyTraffic(ctx, client, "worker", "ok", 50*time.Millisecond)
	terminatedAfterRefusals(t, metrics.URL, "ackmonitor_sends", &refusals)
	if _, err := stop(); err != nil {
		t.Fatal(err)
	}
}

// TestIntake_OutageTerminatesNothing: while the ledger is down every
// message is refused many times over, but never on its own: nothing is
// terminated, and everything is recorded once it is back.
func TestIntake_OutageTerminatesNothing(t *testing.T) {
	t.Parallel()
	const n = 5
	m := newMesh(t)
	st := openStore(t, sqliteStore)
	ctx := testCtx(t)
	var o outage
	mon := startMonitor(t, m.s, fastConfig(o.ledger(st)))
	metrics := httptest.NewServer(mon.Handler())
	t.Cleanup(metrics.Close)
	m.agent("worker", map[string]agentkit.HandlerFunc{"ok": func(context.Context, *agentkit.Message) error { return nil }})
	client := m.agent("client", nil)
	recorded := func() int {
		recs, err := st.Messages(ctx, store.Query{Receiver: "worker", Status: store.StatusACK, Limit: 100})
		if err != nil {
			t.Fatal(err)
		}
		return len(recs)
	}
	if _, err := client.Send(ctx, "worker", "ok", nil); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "the first message recorded", func() bool { return recorded() == 1 })
	o.down.Store(true)
	for range n {
		if _, err := client.Send(ctx, "worker", "ok", nil); err != nil {
			t.Fatal(err)
		}
	}
	terminated := func() float64 {
		total := 0.0
		for _, c := range []string{"ackmonitor_sends", "ackmonitor_events"} {
			if v, err := metricstest.Value(metrics.URL+"/metrics", `ackmonitor_intake_refused_total{consumer="`+c+`"}`); err == nil {
				total += v // absent until the first
			}
		}
		return total
	}
	// The outage outlasts the attempts a refused message gets (5 passes,
	// about 2s each, each refusing the batch and the probe on the sends
	// and on the events consumer) several times over: the events intake meanwhile
	// ignores the advisories of its own sends consumer's NAKs, which write
	// nothing and must not count as the store taking writes.
	eventually(t, 120*time.Second, "many refusals (or a termination)", func() bool { return o.refusals.Load() >= 60 || terminated() > 0 })
	if v := terminated(); v != 0 {
		t.Fatalf("%v messages terminated during an outage", v)
	}
	o.down.Store(false)
	eventually(t, 30*time.Second, "everything recorded after the outage", func() bool { return recorded() == n+1 })
}
