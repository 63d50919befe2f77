package ackmonitor_test

import (
	"bufio"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentmesh-io/agentmesh/ackmonitor"
	"github.com/agentmesh-io/agentmesh/ackmonitor/store"
)

// A monitor that starts with alerts already active in the store (raised by
// its previous run, or by another instance) reports them once it is
// active, though they stay firing at the same severity and nothing is
// raised again; a resolved alert is not reported, nor one whose agent has
// no message left in the window, which the evaluation resolves.
func TestAlertGauge_ReportsStoredAlertsWhenActive(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	st := openStore(t, sqliteStore)
	ctx := testCtx(t)
	firingLedger(t, st, "worker")
	before := time.Now().Add(-time.Minute).UTC()
	stored := []store.Alert{
		// Still firing: the ledger's ack rate is critical.
		{ID: "worker/ack_rate/1", Agent: "worker", Kind: ackmonitor.AlertAckRate, Severity: "critical",
			Value: 0.85, Threshold: 0.90, Samples: 20, RaisedAt: before},
		// Resolved before the restart.
		{ID: "worker/timeout_rate/1", Agent: "worker", Kind: ackmonitor.AlertTimeoutRate, Severity: "warning",
			Value: 0.06, Threshold: 0.05, Samples: 20, RaisedAt: before, ResolvedAt: before.Add(time.Second)},
		// No messages in the window: the alert is resolved.
		{ID: "idle/timeout_rate/1", Agent: "idle", Kind: ackmonitor.AlertTimeoutRate, Severity: "warning",
			Value: 0.07, Threshold: 0.05, Samples: 20, RaisedAt: before},
	}
	for _, a := range stored {
		if err := st.SaveAlert(ctx, a); err != nil {
			t.Fatal(err)
		}
	}

	cfg := fastConfig(st)
	cfg.Thresholds.MeshMinSamples = -1 // the agents' alerts only
	mon := startMonitor(t, m.s, cfg)
	eventually(t, 20*time.Second, "the monitor active", mon.Active)
	want := map[string]float64{
		`agent="worker",kind="ack_rate",severity="critical"`: 1,
	}
	var got map[string]float64
	defer func() {
		if t.Failed() {
			t.Logf("ackmonitor_alert_active: %v, want %v", got, want)
		}
	}()
	eventually(t, 10*time.Second, "the stored alerts in the gauge", func() bool {
		got = alertGauge(t, mon.Monitor)
		return maps.Equal(got, want)
	})
	active, err := st.Alerts(ctx, true, 100)
	if err != nil {
		t.Fatal(err)
	}
	if ids := alertIDs(active); !maps.Equal(ids, map[string]bool{"worker/ack_rate/1": true}) {
		t.Fatalf("active alerts %v, want the stored ones only", ids)
	}
}

// Only the active instance reports alerts: the one that raised an alert
// stops reporting it when it steps down, and the one that takes over
// reports it, still firing at the same severity, without raising it again.
// Summed over instances, as the dashboard does, the alert counts once.
func TestAlertGauge_OnlyTheActiveInstanceReports(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	st := openStore(t, sqliteStore)
	ctx := testCtx(t)
	firingLedger(t, st, "worker")
	cfg := haConfig(st)
	cfg.Thresholds.MeshMinSamples = -1 // the agent's alert only
	a, b := startMonitor(t, m.s, cfg), startMonitor(t, m.s, cfg)
	want := map[string]float64{`agent="worker",kind="ack_rate",severity="critical"`: 1}
	var first, second *running
	var gotFirst, gotSecond map[string]float64
	defer func() {
		if t.Failed() {
			t.Logf("last ackmonitor_alert_active reads: first (stepped down) %v, second (took over) %v", gotFirst, gotSecond)
		}
	}()
	eventually(t, 30*time.Second, "the alert raised and reported by the active instance only", func() bool {
		var ok bool
		if first, second, ok = activeOf(a, b); !ok {
			return false
		}
		gotFirst, gotSecond = alertGauge(t, first.Monitor), alertGauge(t, second.Monitor)
		return maps.Equal(gotFirst, want) && len(gotSecond) == 0
	})
	raised, err := st.Alerts(ctx, true, 100)
	if err != nil {
		t.Fatal(err)
	}

	// The first instance loses the server but keeps running: it steps
	// down, and the second takes over once the pin expires.
	first.nc.Close()
	eventually(t, 20*time.Second, "the takeover", func() bool { return !first.Active() && second.Active() })
	eventually(t, 10*time.Second, "the alert reported by the new active instance only", func() bool {
		gotFirst, gotSecond = alertGauge(t, first.Monitor), alertGauge(t, second.Monitor)
		return len(gotFirst) == 0 && maps.Equal(gotSecond, want)
	})
	active, err := st.Alerts(ctx, true, 100)
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(alertIDs(active), alertIDs(raised)) || len(raised) != 1 {
		t.Fatalf("active alerts %v after the takeover, want %v", alertIDs(active), alertIDs(raised))
	}
}

// firingLedger writes 20 messages to agent resolved just now, 17 ACKs and
// 3 NACKs (followed up already): an ack rate of 85 %, critical at the
// default thresholds, and no timeouts.
func firingLedger(t *testing.T, st store.Store, agent string) {
	t.Helper()
	ctx := testCtx(t)
	now := time.Now().UTC()
	consumer := agent + "_normal"
	var b store.Batch
	var nacked []store.Key
	for i := range 20 {
		seq := uint64(1000 + i)
		b.Sends = append(b.Sends, store.Send{StreamSeq: seq, MessageID: fmt.Sprintf("msg-%d", i), Sender: "client",
			Receiver: agent, Kind: "agent", Priority: "normal", Action: "work", SentAt: now.Add(-time.Second)})
		ev := store.Event{ID: fmt.Sprintf("ev-%d", i), Kind: store.EventAck, Consumer: consumer, Receiver: agent,
			Priority: "normal", StreamSeq: seq, Deliveries: 1, AckTime: time.Millisecond, At: now}
		if i%7 == 3 { // 3, 10, 17
			ev.Kind, ev.AckTime, ev.Reason = store.EventTerm, 0, "REJECTED: test"
			nacked = append(nacked, store.Key{StreamSeq: seq, Consumer: consumer})
		}
		b.Events = append(b.Events, ev)
	}
	if _, err := st.Apply(ctx, b); err != nil {
		t.Fatal(err)
	}
	var done []store.FollowUp
	for _, k := range nacked { // so no monitor tries to dead-letter messages that are not in the stream
		done = append(done, store.FollowUp{Key: k, HandledAt: now})
	}
	if err := st.CompleteFollowUps(ctx, done); err != nil {
		t.Fatal(err)
	}
	if r := rateOf(t, st, agent, "normal"); r.Acked != 17 || r.Nacked != 3 || r.TimedOut != 0 {
		t.Fatalf("ledger rate %+v, want 17 ACKs and 3 NACKs", r)
	}
}

// alertGauge reads ackmonitor_alert_active from mon's /metrics, by labels.
func alertGauge(t *testing.T, mon *ackmonitor.Monitor) map[string]float64 {
	t.Helper()
	rec := httptest.NewRecorder()
	mon.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("GET /metrics: %d %s", rec.Code, rec.Body)
	}
	got := map[string]float64{}
	sc := bufio.NewScanner(rec.Body)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "ackmonitor_alert_active{")
		if !ok {
			continue
		}
		labels, value, ok := strings.Cut(rest, "} ")
		v, err := strconv.ParseFloat(value, 64)
		if !ok || err != nil {
			t.Fatalf("metrics line %q", sc.Text())
		}
		got[labels] = v
	}
	return got
}

func alertIDs(as []store.Alert) map[string]bool {
	ids := map[string]bool{}
	for _, a := range as {
		ids[a.ID] = true
	}
	return ids
}
