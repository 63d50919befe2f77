package ackmonitor_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/agentmesh-io/agentmesh/ackmonitor"
	"github.com/agentmesh-io/agentmesh/ackmonitor/store"
	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/dlq"
	"github.com/agentmesh-io/agentmesh/internal/metricstest"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// A broadcast reaches every agent's fan-out consumer; the agents that do
// not handle its action ack it unhandled, and the broadcaster acks its
// own. The ledger counts those as ACKs of their receivers (never NACKs,
// dead letters or alerts), lists the handling agent's rows at the
// message's priority, and does not list the broadcaster as a receiver.
func TestFanout_UnhandledBroadcastsAreAcks(t *testing.T) {
	t.Parallel()
	for _, kind := range []storeKind{sqliteStore, postgresStore} {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			testFanoutAcks(t, kind)
		})
	}
}

func testFanoutAcks(t *testing.T, kind storeKind) {
	const n = 10
	m := newMesh(t)
	st := openStore(t, kind)
	ctx := testCtx(t)
	alerts := m.watchAlerts()
	mon := startMonitor(t, m.s, fastConfig(st))
	api := httptest.NewServer(mon.Handler())
	t.Cleanup(api.Close)

	nop := func(context.Context, *agentkit.Message) error { return nil }
	bystanders := []string{"r1", "r2", "r3"}
	for _, id := range bystanders {
		m.agent(id, map[string]agentkit.HandlerFunc{"other": nop})
	}
	handled := make(chan string, 2*n) // room for duplicates, counted below
	m.agent("doer", map[string]agentkit.HandlerFunc{"sync": func(_ context.Context, msg *agentkit.Message) error {
		handled <- msg.MessageID
		return nil
	}})
	// The broadcaster handles an action too, so it has fan-out consumers
	// and receives its own broadcasts.
	caster := m.agent("caster", map[string]agentkit.HandlerFunc{"other": nop})
	for range n {
		if _, err := caster.Broadcast(ctx, "sync", nil, agentkit.WithPriority(wire.PriorityLow)); err != nil {
			t.Fatal(err)
		}
	}
	receivers := append([]string{"doer"}, bystanders...)
	eventually(t, 30*time.Second, "every receiver's broadcasts resolved with their sends", func() bool {
		for _, r := range receivers {
			if rate := rateOf(t, st, r, "low"); rate.Resolved() != n {
				return false
			}
		}
		return caster.Stats().Outcomes[agentkit.OutcomeOwn] == n
	})
	// Every consumer's ACK events, the broadcaster's own included, are
	// written: 4 receivers and the broadcaster, n each.
	eventually(t, 30*time.Second, "every ACK event written", func() bool {
		v, err := metricstest.Value(api.URL+"/metrics", `ackmonitor_events_processed_total{kind="ACK"}`)
		return err == nil && v >= 5*n
	})
	caughtUp := time.Now()
	eventually(t, 30*time.Second, "an alert evaluation of every row", func() bool {
		var summary ackmonitor.Summary
		getJSON(t, api.URL+"/api/v1/summary", &summary)
		return summary.EvaluatedAt.After(caughtUp)
	})

	if got := len(handled); got != n {
		t.Errorf("doer handled %d broadcasts, want %d", got, n)
	}
	for _, r := range receivers {
		rate := rateOf(t, st, r, "low")
		if rate.Acked != n || rate.Nacked+rate.TimedOut+rate.Invalid+rate.Pending != 0 {
			t.Errorf("%s: %+v; want %d ACKs and nothing else", r, rate, n)
		}
	}
	rows, err := st.Messages(ctx, store.Query{Receiver: "doer", Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != n {
		t.Errorf("doer has %d rows, want %d", len(rows), n)
	}
	for _, r := range rows {
		if r.Status != store.StatusACK || r.Priority != "low" || r.Sender != "caster" || r.SentAt.IsZero() {
			t.Errorf("doer's row %d/%s: %+v; want an ACK at low from caster", r.StreamSeq, r.Consumer, r)
		}
	}
	if own, err := st.Messages(ctx, store.Query{Receiver: "caster", Limit: 100}); err != nil || len(own) != 0 {
		t.Errorf("the broadcaster is listed as a receiver: %d rows, %v", len(own), err)
	}
	rates, err := st.Rates(ctx, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rates {
		if r.Agent == "caster" || r.Priority != "low" {
			t.Errorf("rate %+v: want only the receivers', at low", r)
		}
	}
	for _, status := range []string{store.StatusNACK, store.StatusTimeout, store.StatusInvalid} {
		if bad, err := st.Messages(ctx, store.Query{Status: status, Limit: 100}); err != nil || len(bad) != 0 {
			t.Errorf("%s rows: %d, %v; want none", status, len(bad), err)
		}
	}
	letters, err := dlq.Read(ctx, m.jetstream(), subjects.Default, 0)
	if err != nil && !errors.Is(err, dlq.ErrNoStream) || len(letters) != 0 {
		t.Errorf("dead letters: %d, %v; want none", len(letters), err)
	}
	if as, err := st.Alerts(ctx, false, 100); err != nil || len(as) != 0 {
		t.Errorf("alerts: %+v, %v; want none", as, err)
	}
	alerts.mu.Lock()
	defer alerts.mu.Unlock()
	if len(alerts.got) != 0 {
		t.Errorf("alerts published: %+v", alerts.got)
	}
}
