package ackmonitor_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/ackmonitor"
	"github.com/agentmesh-io/agentmesh/ackmonitor/store"
	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/dlq"
	"github.com/agentmesh-io/agentmesh/internal/metricstest"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// publishInvalid stores n messages from sender to receiver that are not
// envelopes, each under its own message id, as a sender that does not use
// agentkit would: their receiver terminates them as invalid.
func publishInvalid(t *testing.T, js jetstream.JetStream, sender, receiver string, n int) {
	t.Helper()
	subject, err := subjects.Default.Direct(receiver, string(wire.PriorityNormal), sender)
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		msg := &nats.Msg{Subject: subject, Data: []byte("not an envelope"),
			Header: nats.Header{jetstream.MsgIDHeader: {fmt.Sprintf("%s-%s-%d", sender, receiver, i)}}}
		if _, err := js.PublishMsg(testCtx(t), msg); err != nil {
			t.Fatal(err)
		}
	}
}

// A sender of invalid messages is blamed, not the three well-behaved
// receivers that terminated them: the rows are INVALID, count in none of
// the receivers' rates and raise no alert about them, are dead-lettered
// and not escalated (EscalateTerminated only escalates NACKs); the sender
// has an invalid rate of 1 (API, metric) and a critical alert. Messages
// whose sender token is not an agent id are the unknown sender's. A
// receiver that rejects valid messages still raises its alert; it is
// evaluated after the three in the same pass, and the senders after it,
// so its alert also shows that theirs were evaluated on every row.
func TestInvalid_TheSenderIsBlamedNotTheReceivers(t *testing.T) {
	t.Parallel()
	const perReceiver = 25 // above the default MinSamples, 20
	m := newMesh(t)
	st := openStore(t, sqliteStore)
	ctx := testCtx(t)
	alerts := m.watchAlerts()
	dir := &escalations{}
	m.agent("director", map[string]agentkit.HandlerFunc{ackmonitor.ActionEscalation: dir.handler})
	cfg := fastConfig(st)
	cfg.EscalateTerminated = true
	mon := startMonitor(t, m.s, cfg)
	api := httptest.NewServer(mon.Handler())
	t.Cleanup(api.Close)

	receivers := []string{"r1", "r2", "r3"}
	for _, r := range receivers {
		m.agent(r, map[string]agentkit.HandlerFunc{"ok": func(context.Context, *agentkit.Message) error { return nil }})
	}
	js := m.jetstream()
	client := m.agent("client", nil)
	for _, r := range receivers {
		publishInvalid(t, js, "bad", r, perReceiver)
		for range perReceiver {
			if _, err := client.Send(ctx, r, "ok", nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Subjects whose sender token is no agent id: not an id character, and
	// one too long.
	nc := m.conn()
	unknown := []string{"mesh.agent.r3.normal.bad$sender", "mesh.agent.r3.normal." + strings.Repeat("s", 100)}
	for _, subject := range unknown {
		if err := nc.Publish(subject, []byte("not an envelope")); err != nil {
			t.Fatal(err)
		}
	}
	invalidOf := map[string]int64{"r1": perReceiver, "r2": perReceiver, "r3": perReceiver + int64(len(unknown))}
	eventually(t, 30*time.Second, "every row final, with its send", func() bool {
		for _, r := range receivers {
			rate := rateOf(t, st, r, "normal")
			if rate.Acked != perReceiver || rate.Invalid != invalidOf[r] || rate.Sent != perReceiver+invalidOf[r] {
				return false
			}
		}
		return true
	})
	for _, r := range receivers {
		rate := rateOf(t, st, r, "normal")
		if rate.Nacked != 0 || rate.Resolved() != perReceiver || rate.AckRate() != 1 {
			t.Errorf("%s: %+v; want %d ACKs, ack rate 1, the invalid messages beside them", r, rate, perReceiver)
		}
	}
	invalid, err := st.Messages(ctx, store.Query{Status: store.StatusInvalid, Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	senders := map[string]int{}
	for _, r := range invalid {
		senders[r.Sender]++
	}
	if want := map[string]int{"bad": len(receivers) * perReceiver, ackmonitor.UnknownSender: len(unknown)}; fmt.Sprint(senders) != fmt.Sprint(want) {
		t.Errorf("INVALID rows by sender %v, want %v", senders, want)
	}

	// Now a receiver that fails valid messages.
	m.agent("z_failing", map[string]agentkit.HandlerFunc{"ok": func(context.Context, *agentkit.Message) error {
		return agentkit.Reject(wire.CodeNotFound, "no such customer")
	}})
	for range perReceiver {
		if _, err := client.Send(ctx, "z_failing", "ok", nil); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 30*time.Second, "the failing receiver's alert", func() bool {
		as, err := st.Alerts(ctx, true, 100)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range as {
			if a.Agent == "z_failing" && a.Kind == ackmonitor.AlertAckRate {
				return true
			}
		}
		return false
	})
	as, err := st.Alerts(ctx, false, 100)
	if err != nil {
		t.Fatal(err)
	}
	badAlert := false
	for _, a := range as {
		switch {
		case a.Agent == "z_failing":
		case a.Agent == ackmonitor.MeshAgent && a.Kind == ackmonitor.AlertAckRate: // z_failing's NACKs, mesh-wide
		case a.Agent == "bad" && a.Kind == ackmonitor.AlertInvalidRate && a.Severity == "critical" && a.Value == 1 && a.Active():
			badAlert = true
		default:
			t.Errorf("alert %+v", a)
		}
	}
	if !badAlert {
		t.Errorf("no critical invalid_rate alert about the bad sender: %+v", as)
	}
	eventually(t, 10*time.Second, "the alert event about the bad sender", func() bool {
		return alerts.find("mesh.alert.critical.bad", ackmonitor.AlertInvalidRate, ackmonitor.AlertRaised)
	})
	// The alerts can come before the ledger has resolved the last of the
	// client's messages: read the senders once it has, failing only when
	// the ledger stops making progress.
	byName := map[string]ackmonitor.SenderView{}
	wantClient := int64(len(receivers)*perReceiver + perReceiver)
	last, since := int64(-1), time.Now()
	for {
		var views struct{ Senders []ackmonitor.SenderView }
		getJSON(t, api.URL+"/api/v1/senders", &views)
		clear(byName)
		for _, v := range views.Senders {
			byName[v.Sender] = v
		}
		got := byName["client"].Window.Resolved
		if got >= wantClient {
			break
		}
		if got != last {
			last, since = got, time.Now()
		} else if time.Since(since) > 30*time.Second {
			break // the assertions below say what is missing
		}
		time.Sleep(50 * time.Millisecond)
	}
	if v := byName["bad"]; v.Window.Invalid != int64(len(receivers)*perReceiver) || v.Window.InvalidRate != 1 || v.Total.Invalid != v.Window.Invalid {
		t.Errorf("/api/v1/senders: bad = %+v", v)
	}
	if v := byName["client"]; v.Window.Invalid != 0 || v.Window.Resolved != wantClient {
		t.Errorf("/api/v1/senders: client = %+v", v)
	}
	for _, r := range receivers {
		series := fmt.Sprintf(`ackmonitor_outcomes_total{agent=%q,priority="normal",status="ACK"}`, r)
		if v, err := metricstest.Value(api.URL+"/metrics", series); err != nil || v != perReceiver {
			t.Errorf("%s = %v, %v", series, v, err)
		}
		series = fmt.Sprintf(`ackmonitor_outcomes_total{agent=%q,priority="normal",status="INVALID"}`, r)
		if v, err := metricstest.Value(api.URL+"/metrics", series); err != nil || v != 0 {
			t.Errorf("%s = %v, %v; want none: the rules divide by every outcome of a receiver", series, v, err)
		}
	}

	// Dead letters: every invalid and every rejected message; escalations
	// of the rejected ones only (their rows come after the invalid ones).
	total := uint64(len(receivers)*perReceiver + len(unknown) + perReceiver)
	eventually(t, 30*time.Second, "the dead letters", func() bool {
		return streamMsgs(t, js, subjects.Default.DLQStream()) == total
	})
	eventually(t, 30*time.Second, "the failing receiver's escalations", func() bool { return len(dir.list()) >= perReceiver })
	for _, esc := range dir.list() {
		if esc.Receiver != "z_failing" {
			t.Errorf("escalation of a message to %s from %s: %+v", esc.Receiver, esc.Sender, esc)
		}
	}
	dlqStream, err := js.Stream(ctx, subjects.Default.DLQStream())
	if err != nil {
		t.Fatal(err)
	}
	statuses := map[string]int{}
	for seq := uint64(1); seq <= total; seq++ {
		msg, err := dlqStream.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		statuses[msg.Header.Get(dlq.HeaderStatus)]++
		if msg.Subject == "mesh.dlq.r3.normal."+ackmonitor.UnknownSender && !slices.Contains(unknown, msg.Header.Get(dlq.HeaderSubject)) {
			t.Errorf("dead letter of an unknown sender's message: original subject %q", msg.Header.Get(dlq.HeaderSubject))
		}
	}
	if want := map[string]int{store.StatusInvalid: len(receivers)*perReceiver + len(unknown), store.StatusNACK: perReceiver}; fmt.Sprint(statuses) != fmt.Sprint(want) {
		t.Errorf("dead letters by status %v, want %v", statuses, want)
	}
	// Counted once their follow-ups are recorded, after the copies.
	for sender, want := range map[string]int{"bad": len(receivers) * perReceiver, ackmonitor.UnknownSender: len(unknown)} {
		series := fmt.Sprintf(`ackmonitor_invalid_messages_total{priority="normal",sender=%q}`, sender)
		eventually(t, 10*time.Second, series, func() bool {
			v, err := metricstest.Value(api.URL+"/metrics", series)
			if err != nil {
				t.Fatal(err)
			}
			return v == float64(want)
		})
	}
}

// streamMsgs returns how many messages stream holds (0 while it does not
// exist).
func streamMsgs(t *testing.T, js jetstream.JetStream, stream string) uint64 {
	t.Helper()
	s, err := js.Stream(testCtx(t), stream)
	if err != nil {
		return 0
	}
	info, err := s.Info(testCtx(t))
	if err != nil {
		return 0
	}
	return info.State.Msgs
}
