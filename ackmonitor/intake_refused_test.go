package ackmonitor_test

import (
	"context"
	"net/http/httptest"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentmesh-io/agentmesh/ackmonitor/store"
	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/internal/metricstest"
)

// refusedTotal returns ackmonitor_intake_refused_total of consumer, 0
// until the first.
func refusedTotal(url, consumer string) float64 {
	v, err := metricstest.Value(url+"/metrics", `ackmonitor_intake_refused_total{consumer="`+consumer+`"}`)
	if err != nil {
		return 0 // absent until the first
	}
	return v
}

// TestIntake_RefusedAloneIsTerminated: a send the ledger refuses while it
// is alone in its batch (no other traffic, so no pass writes anything
// else) is terminated and counted all the same, once the store shows it
// takes writes; it was retried every second for ever.
func TestIntake_RefusedAloneIsTerminated(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	st := openStore(t, sqliteStore)
	ctx := testCtx(t)
	m.agent("worker", map[string]agentkit.HandlerFunc{"ok": func(context.Context, *agentkit.Message) error { return nil }})
	client := m.agent("client", nil)
	poison := func(b store.Batch) bool {
		return slices.ContainsFunc(b.Sends, func(x store.Send) bool { return x.MessageID == "poison" })
	}
	mon := startMonitor(t, m.s, fastConfig(refusing{Store: st, refuse: poison}))
	metrics := httptest.NewServer(mon.Handler())
	t.Cleanup(metrics.Close)
	if _, err := client.Send(ctx, "worker", "ok", nil, agentkit.WithMessageID("poison")); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the refused send terminated", func() bool {
		return refusedTotal(metrics.URL, "ackmonitor_sends") == 1
	})
	// The intake goes on: the next send is recorded.
	if _, err := client.Send(ctx, "worker", "ok", nil, agentkit.WithMessageID("after")); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "the next send recorded", func() bool {
		recs, err := st.Messages(ctx, store.Query{Receiver: "worker", Limit: 10})
		return err == nil && slices.ContainsFunc(recs, func(r store.Record) bool { return r.MessageID == "after" && !r.SentAt.IsZero() })
	})
}

// TestIntake_OutageTerminatesNothingAlone: a message alone in its batch
// while the store is down meets no pass that writes anything, and the
// store's health check fails too: it is never terminated, however long
// the outage, and is recorded once the store is back.
func TestIntake_OutageTerminatesNothingAlone(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	st := openStore(t, sqliteStore)
	ctx := testCtx(t)
	var down atomic.Bool
	var refusals atomic.Int64
	outage := func(store.Batch) bool { // every write while down, checks included
		if down.Load() {
			refusals.Add(1)
			return true
		}
		return false
	}
	mon := startMonitor(t, m.s, fastConfig(refusing{Store: st, refuse: outage}))
	metrics := httptest.NewServer(mon.Handler())
	t.Cleanup(metrics.Close)
	client := m.agent("client", nil) // no receiver: the send is the only message
	down.Store(true)
	if _, err := client.Send(ctx, "worker", "ok", nil, agentkit.WithMessageID("alone")); err != nil {
		t.Fatal(err)
	}
	// Several times the passes a refused message gets (5, about 1s each).
	eventually(t, 60*time.Second, "many refusals (or a termination)", func() bool {
		return refusals.Load() >= 30 || refusedTotal(metrics.URL, "ackmonitor_sends") > 0
	})
	if v := refusedTotal(metrics.URL, "ackmonitor_sends"); v != 0 {
		t.Fatalf("%v messages terminated during an outage", v)
	}
	down.Store(false)
	eventually(t, 20*time.Second, "the send recorded after the outage", func() bool {
		recs, err := st.Messages(ctx, store.Query{Receiver: "worker", Limit: 10})
		return err == nil && len(recs) == 1 && recs[0].MessageID == "alone"
	})
}
