package ackmonitor_test

import (
	"context"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/agentmesh-io/agentmesh/ackmonitor/store"
	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/internal/metricstest"
)

// TestReconcile_InfersUnsampledAcks runs a receiver whose consumers sample
// no ack (SampleFrequency 0) next to one that samples every ack: the
// monitor infers the first one's ACKs from its consumer's ack floor, so
// its ledger counts are exact (without ack times), and infers nothing for
// the second, whose ack metrics all arrive.
func TestReconcile_InfersUnsampledAcks(t *testing.T) {
	t.Parallel()
	const ok, rejected, sampled = 30, 5, 10
	m := newMesh(t)
	st := openStore(t, sqliteStore)
	ctx := testCtx(t)
	handlers := map[string]agentkit.HandlerFunc{
		"ok":     func(context.Context, *agentkit.Message) error { return nil },
		"reject": func(context.Context, *agentkit.Message) error { return agentkit.Reject(wire.CodeRejected, "no") },
	}
	m.agent("unsampled", handlers, agentkit.WithSampleFrequency("0"))
	m.agent("sampled", handlers)
	client := m.agent("client", nil)
	mon := startMonitor(t, m.s, fastConfig(st))
	metrics := httptest.NewServer(mon.Handler())
	t.Cleanup(metrics.Close)

	send := func(to, action string, n int) {
		for range n {
			if _, err := client.Send(ctx, to, action, nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	send("unsampled", "ok", ok)
	send("unsampled", "reject", rejected)
	send("sampled", "ok", sampled)
	eventually(t, 20*time.Second, "every row resolved", func() bool {
		u, s := rateOf(t, st, "unsampled", "normal"), rateOf(t, st, "sampled", "normal")
		return u.Acked == ok && u.Nacked == rejected && u.Pending == 0 && s.Acked == sampled && s.Pending == 0
	})

	recs, err := st.Messages(ctx, store.Query{Receiver: "unsampled", Status: store.StatusACK, Limit: ok + 1})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if !r.AcknowledgedAt.IsZero() || r.ProcessingTime != 0 || len(r.History) != 1 || !r.History[0].Inferred {
			t.Errorf("row %d: acknowledged at %v, ack time %v, history %+v; want one inferred ACK without times",
				r.StreamSeq, r.AcknowledgedAt, r.ProcessingTime, r.History)
		}
	}
	if u := rateOf(t, st, "unsampled", "normal"); u.AvgAckTimeMS != 0 {
		t.Errorf("unsampled average ack time %vms; want none", u.AvgAckTimeMS)
	}
	for series, want := range map[string]float64{
		`ackmonitor_inferred_acks_total{agent="unsampled",priority="normal"}`:         ok,
		`ackmonitor_inferred_acks_total{agent="sampled",priority="normal"}`:           0,
		`ackmonitor_outcomes_total{agent="unsampled",priority="normal",status="ACK"}`: ok,
		`ackmonitor_ack_time_seconds_count{agent="unsampled",priority="normal"}`:      0,
		`ackmonitor_ack_time_seconds_count{agent="sampled",priority="normal"}`:        sampled,
	} {
		got, err := metricstest.Value(metrics.URL+"/metrics", series)
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("%s = %v, want %v", series, got, want)
		}
	}
}

// TestReconcile_InfersUnderSteadyTraffic: unsampled ACKs are inferred while
// other agents' events keep the events consumer busy, which it almost
// never is idle under load (the inference waited for it to be).
func TestReconcile_InfersUnderSteadyTraffic(t *testing.T) {
	t.Parallel()
	const unsampled = 30
	m := newMesh(t)
	st := openStore(t, sqliteStore)
	ctx := testCtx(t)
	ok := map[string]agentkit.HandlerFunc{"ok": func(context.Context, *agentkit.Message) error { return nil }}
	m.agent("unsampled", ok, agentkit.WithSampleFrequency("0"))
	m.agent("sampled", ok)
	client := m.agent("client", nil)
	cfg := fastConfig(st)
	cfg.FetchWait, cfg.ReconcileInterval = 250*time.Millisecond, 500*time.Millisecond
	startMonitor(t, m.s, cfg)
	for range unsampled {
		if _, err := client.Send(ctx, "unsampled", "ok", nil); err != nil {
			t.Fatal(err)
		}
	}
	stop := steadyTraffic(ctx, m.agent("traffic", nil), "sampled", "ok", 5*time.Millisecond)
	progressing(t, st, "unsampled", 20*time.Second, "the unsampled ACKs inferred under traffic", func() bool {
		return rateOf(t, st, "unsampled", "normal").Acked == unsampled
	})
	sent, err := stop()
	if err != nil {
		t.Fatal(err)
	}
	if sent < 20 {
		t.Fatalf("only %d messages of traffic: the test did not keep the events consumer busy", sent)
	}
}
