package ackmonitor_test

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentmesh-io/agentmesh/ackmonitor"
	"github.com/agentmesh-io/agentmesh/ackmonitor/store"
)

// outcome is how a ledgerOf message ends.
type outcome int

const (
	acked        outcome = iota
	nacked               // terminated by its receiver
	nakExhausted         // NAKed on each of its two deliveries, then exhausted
)

// ledgerOf writes messages resolved just now to the receivers, one per
// outcome, and marks their follow-ups done, so no monitor tries to
// dead-letter messages that are not in the stream.
func ledgerOf(t *testing.T, st store.Store, seq0 uint64, receivers []string, outcomes []outcome) {
	t.Helper()
	ctx := testCtx(t)
	now := time.Now().UTC()
	var b store.Batch
	var done []store.FollowUp
	for i, o := range outcomes {
		seq := seq0 + uint64(i)
		agent := receivers[i%len(receivers)]
		consumer := agent + "_normal"
		b.Sends = append(b.Sends, store.Send{StreamSeq: seq, MessageID: fmt.Sprintf("msg-%d", seq), Sender: "client",
			Receiver: agent, Kind: "agent", Priority: "normal", Action: "work", SentAt: now.Add(-time.Second)})
		ev := func(kind store.EventKind, d uint64) store.Event {
			return store.Event{ID: fmt.Sprintf("ev-%d-%s-%d", seq, kind, d), Kind: kind, Consumer: consumer, Receiver: agent,
				Priority: "normal", StreamSeq: seq, Deliveries: d, At: now.Add(time.Duration(d) * time.Millisecond)}
		}
		switch o {
		case acked:
			e := ev(store.EventAck, 1)
			e.AckTime = time.Millisecond
			b.Events = append(b.Events, e)
			continue
		case nacked:
			e := ev(store.EventTerm, 1)
			e.Reason = "REJECTED: test"
			b.Events = append(b.Events, e)
		case nakExhausted:
			b.Events = append(b.Events, ev(store.EventNak, 1), ev(store.EventNak, 2), ev(store.EventMax, 2))
		}
		done = append(done, store.FollowUp{Key: store.Key{StreamSeq: seq, Consumer: consumer}, HandledAt: now})
	}
	if _, err := st.Apply(ctx, b); err != nil {
		t.Fatal(err)
	}
	if err := st.CompleteFollowUps(ctx, done); err != nil {
		t.Fatal(err)
	}
}

// repeat returns n times o.
func repeat(o outcome, n int) []outcome {
	out := make([]outcome, n)
	for i := range out {
		out[i] = o
	}
	return out
}

// activeAlerts returns the active alerts by "agent/kind" → severity.
func activeAlerts(t *testing.T, st store.Store) map[string]string {
	t.Helper()
	as, err := st.Alerts(testCtx(t), true, 100)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, a := range as {
		out[a.Agent+"/"+a.Kind] = a.Severity
	}
	return out
}

// syncBuffer is a bytes.Buffer for a logger and a test reading it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// A handler that NAKs every delivery until the attempts run out lowers
// its agent's ack rate, but nothing timed out: no timeout-rate alert. The
// logs give the rates in percent.
func TestAlerts_NakExhaustedIsNoTimeout(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	st := openStore(t, sqliteStore)
	// 17 ACKs, 3 NAK-exhausted: an ack rate of 85 %, and a "timeout rate"
	// of 15 % when the exhaustions counted as timeouts.
	ledgerOf(t, st, 1000, []string{"worker"}, append(repeat(acked, 17), repeat(nakExhausted, 3)...))
	r := rateOf(t, st, "worker", "normal")
	if r.TimedOut != 3 || r.NakExhausted != 3 || r.TimeoutRate() != 0 || r.AckRate() != 0.85 {
		t.Fatalf("ledger rate %+v (timeout rate %v), want 3 exhausted by NAKs and no timeout", r, r.TimeoutRate())
	}
	var logs syncBuffer
	cfg := fastConfig(st)
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	startMonitor(t, m.s, cfg)
	eventually(t, 20*time.Second, "the ack-rate alert", func() bool { return activeAlerts(t, st)["worker/ack_rate"] == "critical" })
	// The timeout rate is evaluated with the ack rate, in the same pass.
	if sev, ok := activeAlerts(t, st)["worker/timeout_rate"]; ok {
		t.Errorf("timeout-rate alert %s raised for messages exhausted by NAKs", sev)
	}
	// The alert is logged once it is stored: wait for the line, then
	// check how it reads.
	eventually(t, 20*time.Second, "the alert's log line", func() bool { return strings.Contains(logs.String(), "kind=ack_rate") })
	if !strings.Contains(logs.String(), `agent=worker kind=ack_rate severity=critical value=85.0% threshold=90.0%`) {
		t.Errorf("the alert's log gives no percentages:\n%s", logs.String())
	}
}

// An alert resolves when its agent has no resolved message left in the
// window (it went quiet), though fewer than MinSamples messages keep an
// alert's state otherwise.
func TestAlerts_QuietAgentResolves(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	st := openStore(t, sqliteStore)
	ctx := testCtx(t)
	ledgerOf(t, st, 2000, []string{"few"}, repeat(nacked, 3)) // 3 < MinSamples, all failed
	before := time.Now().Add(-time.Minute).UTC()
	for _, a := range []store.Alert{
		{ID: "idle/timeout_rate/1", Agent: "idle", Kind: ackmonitor.AlertTimeoutRate, Severity: "critical",
			Value: 0.5, Threshold: 0.10, Samples: 20, RaisedAt: before},
		{ID: "few/ack_rate/1", Agent: "few", Kind: ackmonitor.AlertAckRate, Severity: "critical",
			Value: 0.5, Threshold: 0.90, Samples: 20, RaisedAt: before},
	} {
		if err := st.SaveAlert(ctx, a); err != nil {
			t.Fatal(err)
		}
	}
	startMonitor(t, m.s, fastConfig(st))
	eventually(t, 20*time.Second, "the quiet agent's alert resolved", func() bool {
		_, ok := activeAlerts(t, st)["idle/timeout_rate"]
		return !ok
	})
	if sev := activeAlerts(t, st)["few/ack_rate"]; sev != "critical" {
		t.Errorf("the alert of an agent with too few messages is %q, want it kept critical", sev)
	}
	all, err := st.Alerts(ctx, false, 10)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range all {
		if a.ID == "idle/timeout_rate/1" && (a.ResolvedAt.IsZero() || a.Samples != 0) {
			t.Errorf("resolved alert %+v, want resolved with 0 samples", a)
		}
	}
}

// A failing workflow spread over agents that have too few messages each
// raises the mesh-wide alert.
func TestAlerts_MeshWide(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	st := openStore(t, sqliteStore)
	// 14 messages, 7 per agent (< MinSamples 20 each): 11 ACKs, 3 NACKs,
	// a mesh-wide ack rate of 78.6 %.
	ledgerOf(t, st, 3000, []string{"planner", "coder"}, append(repeat(acked, 11), repeat(nacked, 3)...))
	startMonitor(t, m.s, fastConfig(st))
	eventually(t, 20*time.Second, "the mesh-wide alert", func() bool {
		return activeAlerts(t, st)[ackmonitor.MeshAgent+"/ack_rate"] == "critical"
	})
	if got := activeAlerts(t, st); len(got) != 1 {
		t.Errorf("active alerts %v, want the mesh-wide ack-rate alert only", got)
	}
}
