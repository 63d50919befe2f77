package ackmonitor_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/agentmesh-io/agentmesh/ackmonitor/store"
	"github.com/agentmesh-io/agentmesh/agentkit"
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

	envs := make([]*agentkit.Envelope, n)
	for i := range envs {
		var err error
		if envs[i], err = client.NewRequest(ctx, "worker", "ok", nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := client.SendBatch(ctx, envs); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "every ACK in the ledger", func() bool { return rateOf(t, st, "worker", "normal").Acked == n })
	events, err := m.jetstream().Consumer(ctx, subjects.Default.EventsStream(), "ackmonitor_events")
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "every event delivered to the monitor acked", func() bool {
		info, err := events.Info(ctx)
		return err == nil && info.NumPending == 0 && info.NumAckPending == 0
	})
}

// refusing is a ledger that refuses every batch holding the send of one
// message id: data a store cannot take.
type refusing struct {
	store.Store
	id string
}

func (s refusing) Apply(ctx context.Context, b store.Batch) (store.Applied, error) {
	if slices.ContainsFunc(b.Sends, func(x store.Send) bool { return x.MessageID == s.id }) {
		return store.Applied{}, errors.New("cannot store that")
	}
	return s.Store.Apply(ctx, b)
}

// TestIntake_RefusedMessageHoldsUpNothing: a message the ledger refuses
// fails its batch, and the batch is written one message at a time: the
// others are recorded at once, and the refused one, after a few tries, is
// terminated and counted instead of failing every batch for good.
func TestIntake_RefusedMessageHoldsUpNothing(t *testing.T) {
	t.Parallel()
	const others = 20
	m := newMesh(t)
	st := openStore(t, sqliteStore)
	ctx := testCtx(t)
	m.agent("worker", map[string]agentkit.HandlerFunc{"ok": func(context.Context, *agentkit.Message) error { return nil }})
	client := m.agent("client", nil)
	envs := []*agentkit.Envelope{}
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
	mon := startMonitor(t, m.s, fastConfig(refusing{Store: st, id: "poison"}))
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
	eventually(t, 30*time.Second, "the refused send terminated", func() bool {
		v, err := metricstest.Value(metrics.URL+"/metrics", `ackmonitor_intake_refused_total{consumer="ackmonitor_sends"}`)
		return err == nil && v == 1
	})
}
