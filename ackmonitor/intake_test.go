package ackmonitor_test

import (
	"context"
	"testing"
	"time"

	"github.com/agentmesh-io/agentmesh/agentkit"
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
