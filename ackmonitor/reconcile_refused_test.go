package ackmonitor_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentmesh-io/agentmesh/ackmonitor/store"
	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/internal/natstest"
)

// TestReconcile_RefusedTermInfersNoAck: the receiver terminates a message,
// and the ledger refuses the TERM event until the intake terminates the
// event. The message's row is below its consumer's ack floor without a
// final event, as an unsampled ACK's would be, and the events consumer's
// ack floor has passed the event: the row must not be inferred ACKed. It
// was, with steady traffic (the refused event counts in passes that write
// others) and without (once alone refused messages are terminated).
func TestReconcile_RefusedTermInfersNoAck(t *testing.T) {
	t.Parallel()
	for _, kind := range []storeKind{sqliteStore, postgresStore} {
		for _, traffic := range []bool{true, false} {
			name := string(kind) + "/alone"
			if traffic {
				name = string(kind) + "/traffic"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				testRefusedTerm(t, kind, traffic)
			})
		}
	}
}

func testRefusedTerm(t *testing.T, kind storeKind, traffic bool) {
	m := newMesh(t)
	st := openStore(t, kind)
	ctx := testCtx(t)
	m.agent("worker", map[string]agentkit.HandlerFunc{
		"ok":     func(context.Context, *agentkit.Message) error { return nil },
		"reject": func(context.Context, *agentkit.Message) error { return agentkit.Reject(wire.CodeRejected, "no") },
	}, agentkit.WithSampleFrequency("0")) // its ACKs are only ever inferred
	m.agent("sampled", map[string]agentkit.HandlerFunc{"ok": func(context.Context, *agentkit.Message) error { return nil }})
	client := m.agent("client", nil)
	termOfWorker := func(b store.Batch) bool {
		return slices.ContainsFunc(b.Events, func(e store.Event) bool { return e.Kind == store.EventTerm && e.Receiver == "worker" })
	}
	var logs natstest.SyncBuffer
	var refusals atomic.Int64
	cfg := fastConfig(refusing{Store: st, refuse: termOfWorker, refusals: &refusals})
	cfg.Logger = slog.New(slog.NewTextHandler(io.MultiWriter(t.Output(), &logs), nil))
	mon := startMonitor(t, m.s, cfg)
	metrics := httptest.NewServer(mon.Handler())
	t.Cleanup(metrics.Close)

	rejected, err := client.Send(ctx, "worker", "reject", nil)
	if err != nil {
		t.Fatal(err)
	}
	row := func(id string) (store.Record, bool) {
		recs, err := st.Messages(ctx, store.Query{Receiver: "worker", Limit: 10})
		if err != nil {
			t.Fatal(err)
		}
		i := slices.IndexFunc(recs, func(r store.Record) bool { return r.MessageID == id })
		if i < 0 {
			return store.Record{}, false
		}
		return recs[i], true
	}
	stop := func() (int, error) { return 0, nil }
	if traffic { // events of others in the refused event's passes
		stop = steadyTraffic(ctx, client, "sampled", "ok", 50*time.Millisecond)
	}
	terminatedAfterRefusals(t, metrics.URL, "ackmonitor_events", &refusals)
	if _, err := stop(); err != nil {
		t.Fatal(err)
	}
	// An ACK inferred after the termination: the check that inferred it
	// saw the events consumer's ack floor past the refused event.
	later, err := client.Send(ctx, "worker", "ok", nil)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "a later ACK inferred", func() bool {
		r, ok := row(later.MessageID)
		return ok && r.InferredAck()
	})
	r, ok := row(rejected.MessageID)
	if !ok {
		t.Fatal("the terminated message has no row")
	}
	if r.Status != store.StatusPending {
		t.Fatalf("the terminated message, whose TERM event the ledger refused, has status %q (history %+v); want pending", r.Status, r.History)
	}
	// The operator finds the row that stays pending from the log: the
	// stream_seq logged is the event's own, in the events stream.
	if want := fmt.Sprintf("event=TERM row=%d/%s", r.StreamSeq, r.Consumer); !strings.Contains(logs.String(), want) {
		t.Fatalf("the termination log does not name the row (%s)", want)
	}
}
