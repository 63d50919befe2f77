package auth_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/protocol"
	"github.com/agentmesh-io/agentmesh/auth"
	"github.com/agentmesh-io/agentmesh/internal/natstest"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// TestMonitor exercises the monitor's rights the way the ack monitor uses
// them: its streams and consumers, reading messages back, the advisories,
// alerts, dead letters and escalations; and what it may not do.
func TestMonitor(t *testing.T) {
	t.Parallel()
	b := generate(t, []auth.AgentSpec{{ID: "A"}, {ID: "B"}}, auth.Options{})
	s := natstest.RunServer(t, withAuth(t, b))
	provision(t, s, b, auth.ProvisionOptions{})
	sc := subjects.Default
	nc, w := conn(t, s, b, auth.DefaultMonitorID)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	// Its own streams and consumers.
	for _, cfg := range []jetstream.StreamConfig{
		{Name: sc.EventsStream(), Subjects: sc.EventsSubjects()},
		{Name: sc.DLQStream(), Subjects: sc.DLQSubjects()},
	} {
		if err := agentkit.EnsureStream(ctx, js, cfg); err != nil {
			t.Fatalf("monitor creates %s: %v", cfg.Name, err)
		}
	}
	events, err := js.CreateOrUpdateConsumer(ctx, sc.EventsStream(), jetstream.ConsumerConfig{Durable: "ackmonitor_events", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatalf("events consumer: %v", err)
	}
	sends, err := js.CreateOrUpdateConsumer(ctx, sc.Stream(), jetstream.ConsumerConfig{Durable: "ackmonitor_sends", AckPolicy: jetstream.AckExplicitPolicy, HeadersOnly: true})
	if err != nil {
		t.Fatalf("sends consumer: %v", err)
	}
	live, err := nc.SubscribeSync(subjects.AckMetricPrefix + "." + sc.Stream() + ".*")
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}

	// An agent exchange produces a send, an ack metric and an advisory.
	ncA, _ := conn(t, s, b, "A")
	ncB, _ := conn(t, s, b, "B")
	bAgent := isolatedAgent(t, ncB, "B")
	if err := bAgent.HandleFunc("work", func(context.Context, *agentkit.Message) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if err := bAgent.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := isolatedAgent(t, ncA, "A").Send(ctx, "B", "work", nil); err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]jetstream.Consumer{"sends": sends, "events": events} {
		batch, err := c.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatalf("fetch %s: %v", name, err)
		}
		n := 0
		for m := range batch.Messages() {
			if err := m.DoubleAck(ctx); err != nil {
				t.Fatalf("ack %s: %v", name, err)
			}
			n++
		}
		if n != 1 || batch.Error() != nil {
			t.Fatalf("fetch %s: %d messages, %v", name, n, batch.Error())
		}
	}
	if _, err := live.NextMsg(5 * time.Second); err != nil {
		t.Fatalf("live ack metric: %v", err)
	}
	mesh, err := js.Stream(ctx, sc.Stream())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mesh.GetMsg(ctx, 1); err != nil {
		t.Fatalf("read a message back by sequence: %v", err)
	}

	// Alerts, dead letters, the events wake-up and escalations as itself.
	alert, _ := sc.Alert("warning", "B")
	if err := nc.Publish(alert, []byte("{}")); err != nil {
		t.Fatal(err)
	}
	dlq, _ := sc.DLQ("B", "normal", "A")
	if _, err := js.Publish(ctx, dlq, []byte("{}")); err != nil {
		t.Fatalf("dead letter: %v", err)
	}
	if _, err := js.Publish(ctx, sc.MonitorWake(), nil); err != nil {
		t.Fatalf("events wake-up: %v", err)
	}
	mon := isolatedAgent(t, nc, auth.DefaultMonitorID)
	if _, err := mon.Send(ctx, "A", protocol.ActionEscalation, nil); err != nil {
		t.Fatalf("escalation: %v", err)
	}
	if n := w.Count(); n != 0 {
		t.Fatalf("violations: %v", w.Recent())
	}

	// Not: speak for an agent, or delete the message stream.
	for _, subj := range []string{"mesh.agent.B.normal.A", "mesh.hb.A"} {
		n := w.Count()
		if err := nc.Publish(subj, nil); err != nil {
			t.Fatal(err)
		}
		expectViolation(t, w, n, "publish", subj)
	}
	dctx, dcancel := context.WithTimeout(ctx, denyWait)
	defer dcancel()
	n := w.Count()
	if err := js.DeleteStream(dctx, sc.Stream()); err == nil {
		t.Fatal("the monitor deleted the message stream")
	}
	expectViolation(t, w, n, "publish", "$JS.API.STREAM.DELETE.MESH")
}
