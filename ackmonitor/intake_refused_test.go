package ackmonitor_test

import (
	"context"
	"database/sql"
	"net/http/httptest"
	"net/url"
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

// terminatedAfterRefusals waits until the monitor has terminated one
// message its ledger refused on consumer. The intake terminates it only
// after several passes that refused it, and passes slow down on a loaded
// machine, so the wait fails only when the refusals stall or go on far
// past the passes a refused message gets.
func terminatedAfterRefusals(t *testing.T, metricsURL, consumer string, refusals *atomic.Int64) {
	t.Helper()
	const stall, tooMany = 30 * time.Second, 100
	last, since := int64(-1), time.Now()
	for refusedTotal(metricsURL, consumer) != 1 {
		switch n := refusals.Load(); {
		case n > tooMany:
			t.Fatalf("%d refused writes and nothing terminated on %s", n, consumer)
		case n != last:
			last, since = n, time.Now()
		case time.Since(since) > stall:
			t.Fatalf("no refused write for %v (at %d) and nothing terminated on %s", stall, n, consumer)
		}
		time.Sleep(20 * time.Millisecond)
	}
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
	var refusals atomic.Int64
	mon := startMonitor(t, m.s, fastConfig(refusing{Store: st, refuse: poison, refusals: &refusals}))
	metrics := httptest.NewServer(mon.Handler())
	t.Cleanup(metrics.Close)
	if _, err := client.Send(ctx, "worker", "ok", nil, agentkit.WithMessageID("poison")); err != nil {
		t.Fatal(err)
	}
	terminatedAfterRefusals(t, metrics.URL, "ackmonitor_sends", &refusals)
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
	var o outage
	mon := startMonitor(t, m.s, fastConfig(o.ledger(st)))
	metrics := httptest.NewServer(mon.Handler())
	t.Cleanup(metrics.Close)
	client := m.agent("client", nil) // no receiver: the send is the only message
	o.down.Store(true)
	if _, err := client.Send(ctx, "worker", "ok", nil, agentkit.WithMessageID("alone")); err != nil {
		t.Fatal(err)
	}
	// Several times the passes a refused message gets (5, about 2s each,
	// each refusing the batch and the probe).
	eventually(t, 60*time.Second, "many refusals (or a termination)", func() bool {
		return o.refusals.Load() >= 20 || refusedTotal(metrics.URL, "ackmonitor_sends") > 0
	})
	if v := refusedTotal(metrics.URL, "ackmonitor_sends"); v != 0 {
		t.Fatalf("%v messages terminated during an outage", v)
	}
	o.down.Store(false)
	eventually(t, 20*time.Second, "the send recorded after the outage", func() bool {
		recs, err := st.Messages(ctx, store.Query{Receiver: "worker", Limit: 10})
		return err == nil && len(recs) == 1 && recs[0].MessageID == "alone"
	})
}

// TestIntake_LockedLedgerTerminatesNothing: while another session holds
// the ledger table locked (CREATE INDEX takes this lock, VACUUM FULL a
// stronger one), every ledger write fails, as in an outage, but
// store_probe takes writes: nothing may be terminated, and the sends are
// recorded once the lock is released. The probe wrote only store_probe,
// and every send was terminated within seconds, lost to the ledger.
// lock_timeout makes the blocked writes fail at once instead of at the
// monitor's 30s timeout.
func TestIntake_LockedLedgerTerminatesNothing(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	dsn := ledgerAt(t, postgresStore)
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("lock_timeout", "100")
	u.RawQuery = q.Encode()
	// Opening migrates under a database-wide advisory lock, which other
	// tests' stores (in any schema) may hold for longer than 100ms.
	var st store.Store
	eventually(t, 30*time.Second, "the store opened past other tests' migrations", func() bool {
		st, err = store.OpenPostgres(context.Background(), u.String())
		return err == nil
	})
	t.Cleanup(func() { st.Close() })
	ctx := testCtx(t)
	var failures atomic.Int64
	mon := startMonitor(t, m.s, fastConfig(failedWrites{st, &failures}))
	metrics := httptest.NewServer(mon.Handler())
	t.Cleanup(metrics.Close)
	client := m.agent("client", nil)

	admin, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close() })
	lock, err := admin.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Rollback()
	if _, err := lock.ExecContext(ctx, "LOCK TABLE message_acknowledgments IN SHARE MODE"); err != nil {
		t.Fatal(err)
	}
	const sends = 3
	for range sends {
		if _, err := client.Send(ctx, "worker", "ok", nil); err != nil {
			t.Fatal(err)
		}
	}
	// Well past the 5 passes a refused message gets (each pass fails the
	// batch and the probe).
	eventually(t, 60*time.Second, "many failed writes (or a termination)", func() bool {
		return failures.Load() >= 40 || refusedTotal(metrics.URL, "ackmonitor_sends") > 0
	})
	if v := refusedTotal(metrics.URL, "ackmonitor_sends"); v != 0 {
		t.Fatalf("%v sends terminated while the ledger table was locked", v)
	}
	if err := lock.Rollback(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "the sends recorded after the lock", func() bool {
		recs, err := st.Messages(ctx, store.Query{Receiver: "worker", Limit: 10})
		return err == nil && len(recs) == sends
	})
}

// failedWrites counts the writes its store fails.
type failedWrites struct {
	store.Store
	n *atomic.Int64
}

func (s failedWrites) Apply(ctx context.Context, b store.Batch) (store.Applied, error) {
	a, err := s.Store.Apply(ctx, b)
	if err != nil {
		s.n.Add(1)
	}
	return a, err
}
