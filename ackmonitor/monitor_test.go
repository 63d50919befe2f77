package ackmonitor_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/agentmesh-io/agentmesh/ackmonitor"
	"github.com/agentmesh-io/agentmesh/ackmonitor/store"
	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/dlq"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// The scenario's known outcomes.
const (
	nOK     = 30 // acked on the first delivery
	nBusy   = 5  // NAKed once (Busy), acked on the second delivery
	nReject = 3  // terminated (Reject NOT_FOUND)
	nNever  = 3  // Busy on every delivery until MAX_DELIVERIES
	nTotal  = nOK + nBusy + nReject + nNever
	nHeal   = 200 // healthy traffic that resolves the alerts
	maxDel  = 3
)

// escalations records escalation envelopes received by a director.
type escalations struct {
	mu   sync.Mutex
	got  []ackmonitor.Escalation
	envs []*wire.Envelope
}

func (e *escalations) handler(_ context.Context, m *agentkit.Message) error {
	var esc ackmonitor.Escalation
	if err := m.DecodePayload(&esc); err != nil {
		return agentkit.Reject(wire.CodeInvalid, err.Error())
	}
	e.mu.Lock()
	e.got = append(e.got, esc)
	e.envs = append(e.envs, m.Envelope)
	e.mu.Unlock()
	return nil
}

func (e *escalations) list() []ackmonitor.Escalation {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]ackmonitor.Escalation(nil), e.got...)
}

func TestScenario(t *testing.T) {
	t.Parallel()
	for _, kind := range []storeKind{sqliteStore, postgresStore} {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			testScenario(t, kind)
		})
	}
}

func testScenario(t *testing.T, kind storeKind) {
	m := newMesh(t)
	st := openStore(t, kind)
	alerts := m.watchAlerts()
	ctx := testCtx(t)

	var dir escalations
	m.agent("director", map[string]agentkit.HandlerFunc{ackmonitor.ActionEscalation: dir.handler})
	// Ack timeouts are long enough never to fire on a loaded test machine;
	// the handlers set short NAK delays themselves.
	pol := agentkit.DeliveryPolicy{BackOff: []time.Duration{5 * time.Second, 5 * time.Second}, MaxDeliver: maxDel,
		ProcessingLimit: 5 * time.Second, Prefetch: 16, MaxAckPending: 1000}
	worker := m.agent("worker", map[string]agentkit.HandlerFunc{
		"ok": func(context.Context, *agentkit.Message) error { return nil },
		"busy_once": func(_ context.Context, msg *agentkit.Message) error {
			if msg.Delivery < 2 {
				return agentkit.Busy(50 * time.Millisecond)
			}
			return nil
		},
		"reject": func(context.Context, *agentkit.Message) error {
			return agentkit.Reject(wire.CodeNotFound, "customer not found")
		},
		"never": func(context.Context, *agentkit.Message) error { return agentkit.Busy(20 * time.Millisecond) },
	}, agentkit.WithPolicy(wire.PriorityNormal, pol))
	client := m.agent("client", nil)

	cfg := fastConfig(st)
	mon := startMonitor(t, m.s, cfg)

	send := func(action string, n int) []*wire.Envelope {
		var out []*wire.Envelope
		for i := range n {
			env, err := client.Send(ctx, "worker", action, map[string]int{"i": i},
				agentkit.WithWorkflowID("wf-1"), agentkit.WithCorrelationID("corr-"+action))
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, env)
		}
		return out
	}
	// Phase 1 on the first monitor instance.
	send("ok", nOK/2)
	send("busy_once", nBusy)
	eventually(t, 20*time.Second, "first events in the ledger", func() bool { return rateOf(t, st, "worker", "normal").Acked > 0 })
	// Kill it mid-scenario and go on with a fresh instance on the same ledger.
	mon.kill()
	send("ok", nOK-nOK/2)
	rejected := send("reject", nReject)
	never := send("never", nNever)
	mon2 := startMonitor(t, m.s, cfg)

	want := store.Rate{Agent: "worker", Priority: "normal", Sent: nTotal, Acked: nOK + nBusy, Nacked: nReject,
		TimedOut: nNever, Naks: nBusy + nNever*maxDel}
	eventually(t, 60*time.Second, "every outcome in the ledger", func() bool {
		r := rateOf(t, st, "worker", "normal")
		return r.Sent == want.Sent && r.Resolved() == nTotal && r.Naks == want.Naks
	})
	checkRate(t, rateOf(t, st, "worker", "normal"), want)

	// Ack times: the ack metric measures from the acking delivery, so it is
	// small; sent→ack of a busy message includes its 50ms NAK delay.
	busyRows, err := st.Messages(ctx, store.Query{Receiver: "worker", Status: store.StatusACK, Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	nRetried := 0
	for _, r := range busyRows {
		if r.ProcessingTime <= 0 || r.ProcessingTime > 5*time.Second {
			t.Errorf("row %d: ack time %v out of bounds", r.StreamSeq, r.ProcessingTime)
		}
		if r.Deliveries == 2 {
			nRetried++
			if r.Naks != 1 || r.Timeouts != 0 || r.RetryCount != 1 || r.Latency() < 50*time.Millisecond {
				t.Errorf("busy row %d: naks %d timeouts %d retries %d latency %v", r.StreamSeq, r.Naks, r.Timeouts, r.RetryCount, r.Latency())
			}
		}
		if r.Workflow != "wf-1" || r.Sender != "client" || !strings.HasPrefix(r.Correlation, "corr-") {
			t.Errorf("row %d: send fields %+v", r.StreamSeq, r)
		}
	}
	if nRetried != nBusy {
		t.Errorf("%d acked rows with 2 deliveries, want %d", nRetried, nBusy)
	}
	rej, err := st.Messages(ctx, store.Query{Receiver: "worker", Status: store.StatusNACK})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rej {
		if r.NackReason != "NOT_FOUND: customer not found" {
			t.Errorf("NACK reason %q", r.NackReason)
		}
	}

	// Exactly one escalation per exhausted message, at the right director,
	// carrying the original and the correlation chain.
	eventually(t, 30*time.Second, "escalations", func() bool { return len(dir.list()) >= nNever })
	byID := map[string]*wire.Envelope{}
	for _, e := range never {
		byID[e.MessageID] = e
	}
	for _, esc := range dir.list() {
		orig := byID[esc.MessageID]
		if orig == nil {
			t.Fatalf("escalation of unexpected message %+v", esc)
		}
		delete(byID, esc.MessageID)
		if esc.Reason != "max_deliveries" || esc.Attempts != maxDel || esc.Naks != maxDel || esc.Sender != "client" ||
			esc.Receiver != "worker" || esc.CorrelationID != "corr-never" || esc.WorkflowID != "wf-1" || len(esc.Reasons) != maxDel+1 {
			t.Errorf("escalation = %+v", esc)
		}
		got, err := wire.Decode(esc.Original)
		if err != nil || got.MessageID != orig.MessageID || got.Action != "never" {
			t.Errorf("escalation original = %s, %v", esc.Original, err)
		}
		if esc.DLQSeq == 0 || esc.DLQSubject != "mesh.dlq.worker.normal.client" {
			t.Errorf("escalation dlq = %s %d", esc.DLQSubject, esc.DLQSeq)
		}
	}
	dir.mu.Lock()
	for _, env := range dir.envs {
		if env.SenderID != "ackmonitor" || env.Priority != wire.PriorityHigh || env.MessageType != wire.TypeNotification {
			t.Errorf("escalation envelope %+v", env)
		}
	}
	dir.mu.Unlock()

	// Dead letters: the terminated and the exhausted messages, original
	// headers kept.
	js := m.jetstream()
	eventually(t, 20*time.Second, "dead letters", func() bool {
		info, err := js.Stream(ctx, "MESH_DLQ")
		return err == nil && info.CachedInfo().State.Msgs == nReject+nNever
	})
	dlqStream, _ := js.Stream(ctx, "MESH_DLQ")
	dlqIDs := map[string]string{}
	for seq := uint64(1); seq <= nReject+nNever; seq++ {
		msg, err := dlqStream.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		dlqIDs[msg.Header.Get(dlq.HeaderOriginalID)] = msg.Header.Get(dlq.HeaderStatus)
		if msg.Subject != "mesh.dlq.worker.normal.client" || msg.Header.Get(wire.HeaderWorkflow) != "wf-1" {
			t.Errorf("dead letter %d: %s %v", seq, msg.Subject, msg.Header)
		}
	}
	for _, e := range rejected {
		if dlqIDs[e.MessageID] != store.StatusNACK {
			t.Errorf("rejected %s not dead-lettered as NACK: %v", e.MessageID, dlqIDs)
		}
	}
	for _, e := range never {
		if dlqIDs[e.MessageID] != store.StatusTimeout {
			t.Errorf("exhausted %s not dead-lettered as TIMEOUT: %v", e.MessageID, dlqIDs)
		}
	}
	health, err := st.Health(ctx)
	if err != nil || len(health) != 1 || health[0].Agent != "worker" || health[0].UnavailableSince.IsZero() {
		t.Errorf("health = %+v, %v", health, err)
	}
	// ... and in the agent registry, where discovery sees it.
	eventually(t, 10*time.Second, "worker UNAVAILABLE in the registry", func() bool {
		rec, _ := worker.Registry().Get("worker")
		return rec.Status == agentkit.StatusUnavailable && rec.UnavailableBy == "ackmonitor" && strings.Contains(rec.UnavailableReason, "exhausted")
	})

	// Alerts: ack rate 35/41 = 85% is critical. The 3 "never" messages
	// were NAKed until exhausted: nothing timed out, so no timeout alert.
	activeAlert := func(kind, sev string) bool {
		as, err := st.Alerts(ctx, true, 100)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range as {
			if a.Agent == "worker" && a.Kind == kind && a.Severity == sev {
				return true
			}
		}
		return false
	}
	eventually(t, 20*time.Second, "the ack alert", func() bool {
		return activeAlert(ackmonitor.AlertAckRate, "critical")
	})
	if activeAlert(ackmonitor.AlertTimeoutRate, "warning") || activeAlert(ackmonitor.AlertTimeoutRate, "critical") {
		t.Error("a timeout alert for messages exhausted by NAKs")
	}
	eventually(t, 10*time.Second, "alert events", func() bool {
		return alerts.find("mesh.alert.critical.worker", ackmonitor.AlertAckRate, ackmonitor.AlertRaised)
	})

	// Healthy traffic resolves them: 235/241 acked, 3/241 timed out.
	send("ok", nHeal)
	eventually(t, 60*time.Second, "alerts resolved", func() bool {
		as, err := st.Alerts(ctx, true, 100)
		return err == nil && len(as) == 0
	})
	eventually(t, 10*time.Second, "resolution events", func() bool {
		return alerts.find("mesh.alert.info.worker", ackmonitor.AlertAckRate, ackmonitor.AlertResolved)
	})
	want.Sent += nHeal
	want.Acked += nHeal
	eventually(t, 30*time.Second, "healthy traffic in the ledger", func() bool {
		r := rateOf(t, st, "worker", "normal")
		return r.Sent == want.Sent && r.Resolved() == want.Sent
	})
	checkRate(t, rateOf(t, st, "worker", "normal"), want)

	// A replay of the whole history (a monitor with new consumers reading
	// both streams from the start into the same ledger) changes no count
	// and escalates nothing again.
	mon2.stop()
	replayCfg := cfg
	replayCfg.MonitorID = "replay"
	replay := startMonitor(t, m.s, replayCfg)
	eventually(t, 60*time.Second, "replay caught up", func() bool {
		for _, name := range []string{"replay_events", "replay_sends"} {
			stream := "MESH"
			if name == "replay_events" {
				stream = "MESH_EVENTS"
			}
			c, err := js.Consumer(ctx, stream, name)
			if err != nil {
				return false
			}
			info, err := c.Info(ctx)
			if err != nil || info.NumPending != 0 || info.NumAckPending != 0 {
				return false
			}
		}
		return true
	})
	replay.stop()
	checkRate(t, rateOf(t, st, "worker", "normal"), want)
	if n := len(dir.list()); n != nNever {
		t.Errorf("director got %d escalations after replay, want %d", n, nNever)
	}
	esc, err := st.Messages(ctx, store.Query{Escalated: true})
	if err != nil || len(esc) != nNever {
		t.Errorf("escalated rows = %d, %v", len(esc), err)
	}
	if err := st.Rollup(ctx); err != nil {
		t.Fatal(err)
	}
	hours, err := st.Hourly(ctx, time.Now().Add(-2*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	var hSent, hAcked int64
	for _, h := range hours {
		if h.Agent == "worker" {
			hSent, hAcked = hSent+h.Sent, hAcked+h.Acked
		}
	}
	if hSent != want.Sent || hAcked != want.Acked {
		t.Errorf("hourly metrics sent %d acked %d, want %d %d", hSent, hAcked, want.Sent, want.Acked)
	}
}

func checkRate(t *testing.T, got, want store.Rate) {
	t.Helper()
	if got.Sent != want.Sent || got.Acked != want.Acked || got.Nacked != want.Nacked || got.TimedOut != want.TimedOut ||
		got.Naks != want.Naks || got.Pending != 0 {
		t.Fatalf("worker/normal = sent %d acked %d nacked %d timed out %d naks %d pending %d; want %d %d %d %d %d 0",
			got.Sent, got.Acked, got.Nacked, got.TimedOut, got.Naks, got.Pending, want.Sent, want.Acked, want.Nacked, want.TimedOut, want.Naks)
	}
	if got.AvgAckTimeMS <= 0 || got.AvgAckTimeMS > 2000 {
		t.Fatalf("avg ack time %vms out of bounds", got.AvgAckTimeMS)
	}
}

func TestConfig_Validate(t *testing.T) {
	t.Parallel()
	st := openStore(t, sqliteStore)
	tests := []struct {
		name string
		give func(*ackmonitor.Config)
	}{
		{"no store", func(c *ackmonitor.Config) { c.Store = nil }},
		{"bad group", func(c *ackmonitor.Config) { c.PriorityGroup = "a.b" }},
		{"bad monitor id", func(c *ackmonitor.Config) { c.MonitorID = "a b" }},
		{"inverted ack thresholds", func(c *ackmonitor.Config) { c.Thresholds = ackmonitor.Thresholds{AckWarning: 0.8, AckCritical: 0.9} }},
		{"tiny pin ttl", func(c *ackmonitor.Config) { c.PinnedTTL = time.Millisecond }},
		{"negative stale pending age", func(c *ackmonitor.Config) { c.StalePendingAfter = -time.Hour }},
		{"inverted invalid thresholds", func(c *ackmonitor.Config) {
			c.Thresholds = ackmonitor.Thresholds{InvalidWarning: 0.5, InvalidCritical: 0.2}
		}},
		{"invalid threshold above 1", func(c *ackmonitor.Config) { c.Thresholds = ackmonitor.Thresholds{InvalidCritical: 1.5} }},
		{"no follow-up attempt", func(c *ackmonitor.Config) { c.FollowUpAttempts = -1 }},
	}
	m := newMesh(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := ackmonitor.Config{Store: st}
			tt.give(&cfg)
			if _, err := ackmonitor.New(m.conn(), cfg); err == nil || !strings.Contains(err.Error(), "invalid config") {
				t.Fatalf("New = %v, want ErrInvalidConfig", err)
			}
		})
	}
	if _, err := ackmonitor.New(m.conn(), ackmonitor.Config{Store: st}); err != nil {
		t.Fatalf("defaults: %v", err)
	}
}

// Run stops every goroutine it started.
func TestRun_NoLeaks(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) }) // runs last, after the server and store are gone
	m := newMesh(t)
	st := openStore(t, sqliteStore)
	mon := startMonitor(t, m.s, fastConfig(st))
	sender := m.agent("a", nil)
	if _, err := sender.Send(testCtx(t), "b", "x", nil); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "send recorded", func() bool { return rateOf(t, st, "b", "normal").Sent == 1 })
	mon.stop()
	sender.Stop()
}

// An events stream created without the wake-up subject (by an earlier
// version) gets it when a monitor starts; its other subjects stay.
func TestRun_AddsWakeSubjectToEventsStream(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	ctx := testCtx(t)
	js := m.jetstream()
	s := subjects.Default
	old := slices.DeleteFunc(s.EventsSubjects(), func(subj string) bool { return subj == s.MonitorWake() })
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: s.EventsStream(), Subjects: old}); err != nil {
		t.Fatal(err)
	}
	startMonitor(t, m.s, fastConfig(openStore(t, sqliteStore)))
	info, err := js.Stream(ctx, s.EventsStream())
	if err != nil {
		t.Fatal(err)
	}
	if got := info.CachedInfo().Config.Subjects; !slices.Equal(got, s.EventsSubjects()) {
		t.Fatalf("events stream subjects %q, want %q", got, s.EventsSubjects())
	}
}

// A monitor asking for more replicas than the message stream has (it
// exists as R1, made by an agent that started first) refuses to run,
// saying so, instead of running on fewer unawares.
func TestRun_TooFewReplicas(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	ctx := testCtx(t)
	if err := agentkit.EnsureStream(ctx, m.jetstream(), agentkit.StreamConfig(subjects.Default, 1)); err != nil {
		t.Fatal(err)
	}
	cfg := fastConfig(openStore(t, sqliteStore))
	cfg.Replicas = 3
	mon, err := ackmonitor.New(m.conn(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	err = mon.Run(ctx)
	if !errors.Is(err, agentkit.ErrTooFewReplicas) {
		t.Fatalf("Run with R3 on an R1 stream: %v, want ErrTooFewReplicas", err)
	}
	t.Log(err)
}
