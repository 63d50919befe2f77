package agentkit_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/metrics"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/internal/natstest"
)

func TestMetrics_SeedCollectors(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	reg := prometheus.NewRegistry()
	exported := withMetrics(t, reg)
	planner := m.started("planner", map[string]agentkit.HandlerFunc{
		"plan": func(ctx context.Context, msg *agentkit.Message) error { return msg.Reply(ctx, "planned", nil) },
		"bad":  func(context.Context, *agentkit.Message) error { return agentkit.Reject(wire.CodeInvalid, "no") },
	}, exported, agentkit.WithHeartbeat(testHeartbeat))
	orch := m.started("orch", nil, exported, agentkit.WithHeartbeat(testHeartbeat))
	for range 3 {
		if _, err := orch.Request(ctx(t), "planner", "plan", nil); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := orch.Request(ctx(t), "planner", "bad", nil); !wire.IsRemote(err) {
		t.Fatal(err)
	}
	if _, err := orch.Publish(ctx(t), "findings", "finding", nil); err != nil {
		t.Fatal(err)
	}
	expect := func(metric, labels string, want float64) {
		t.Helper()
		eventually(t, 5*time.Second, metric+" "+labels, func() bool {
			mfs, err := reg.Gather()
			if err != nil {
				return false
			}
			for _, mf := range mfs {
				if mf.GetName() != metric {
					continue
				}
				for _, mm := range mf.GetMetric() {
					var ls []string
					for _, lp := range mm.GetLabel() {
						ls = append(ls, lp.GetName()+"="+lp.GetValue())
					}
					if strings.Join(ls, ",") != labels {
						continue
					}
					var v float64
					switch {
					case mm.Counter != nil:
						v = mm.Counter.GetValue()
					case mm.Gauge != nil:
						v = mm.Gauge.GetValue()
					case mm.Histogram != nil:
						v = float64(mm.Histogram.GetSampleCount())
					}
					return v == want
				}
			}
			return false
		})
	}
	expect("agent_messages_total", "dest=planner,source=orch,type=request", 4)
	expect("agent_messages_total", "dest=orch,source=planner,type=response", 3)
	expect("agent_messages_total", "dest=topic:findings,source=orch,type=notification", 1)
	expect("agent_request_duration_seconds", "dest=planner,source=orch", 4)
	expect("agent_errors_total", "error_type=INVALID,source=orch", 1)
	expect("agent_errors_total", "error_type=INVALID,source=planner", 1)
	expect("agent_outcomes_total", "agent_id=planner,outcome=ack", 3)
	expect("agent_outcomes_total", "agent_id=planner,outcome=term", 1)
	expect("agent_outcomes_total", "agent_id=orch,outcome=reply", 4)
	expect("agent_queue_size", "agent_id=planner", 0)
	// Every message is handled, so no generation ends and the sizes hold.
	for p, n := range planner.Stats().Prefetch {
		expect("agent_prefetch", "agent_id=planner,priority="+string(p), float64(n))
	}
	// Label cardinality stays bounded: no message or correlation ids.
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		for _, mm := range mf.GetMetric() {
			for _, lp := range mm.GetLabel() {
				if len(lp.GetValue()) >= 32 {
					t.Fatalf("%s has an id-like label %s=%s", mf.GetName(), lp.GetName(), lp.GetValue())
				}
			}
		}
	}
	// A stopped agent's gauges go: frozen, they would read as its state.
	planner.Stop()
	mfs, _ = reg.Gather()
	for _, mf := range mfs {
		if name := mf.GetName(); name != "agent_queue_size" && name != "agent_prefetch" {
			continue
		}
		for _, mm := range mf.GetMetric() {
			for _, lp := range mm.GetLabel() {
				if lp.GetName() == "agent_id" && lp.GetValue() == "planner" {
					t.Errorf("after Stop %s still reports planner: %v", mf.GetName(), mm.GetLabel())
				}
			}
		}
	}
}

// traced returns a tracer provider exporting to exp, and the options that
// make an agent trace through it.
func traced(t *testing.T) (tp *sdktrace.TracerProvider, exp *tracetest.InMemoryExporter, opts []agentkit.Option) {
	exp = tracetest.NewInMemoryExporter()
	tp = sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	return tp, exp, []agentkit.Option{agentkit.WithTracerProvider(tp), agentkit.WithPropagator(propagation.TraceContext{}), agentkit.WithRegistration(false)}
}

// One request/response across three agents forms one trace: the
// orchestrator asks the planner, whose handler asks the executor.
func TestTracing_OneTraceAcrossThreeAgents(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	tp, exp, opts := traced(t)
	m.started("executor", map[string]agentkit.HandlerFunc{"execute": func(ctx context.Context, msg *agentkit.Message) error {
		if msg.Trace == nil || msg.Trace.TraceID == "" {
			return agentkit.Reject(wire.CodeInvalid, "no trace ids in the envelope")
		}
		return msg.Reply(ctx, "executed", nil)
	}}, opts...)
	var planner *agentkit.Agent
	planner = m.started("planner", map[string]agentkit.HandlerFunc{"plan": func(ctx context.Context, msg *agentkit.Message) error {
		if _, err := planner.Request(ctx, "executor", "execute", nil); err != nil {
			return err
		}
		return msg.Reply(ctx, "planned", nil)
	}}, opts...)
	orch := m.started("orch", nil, opts...)
	root, span := tp.Tracer("test").Start(context.Background(), "workflow")
	reply, err := orch.Request(root, "planner", "plan", nil)
	span.End()
	if err != nil {
		t.Fatal(err)
	}
	traceID := span.SpanContext().TraceID()
	if reply.Trace == nil || reply.Trace.TraceID != traceID.String() {
		t.Fatalf("reply trace %+v, want trace %s", reply.Trace, traceID)
	}
	eventually(t, 5*time.Second, "spans exported", func() bool { return len(exp.GetSpans()) >= 9 })
	byName := map[string]int{}
	for _, s := range exp.GetSpans() {
		if s.SpanContext.TraceID() != traceID {
			t.Errorf("span %q in trace %s, not %s", s.Name, s.SpanContext.TraceID(), traceID)
		}
		byName[s.Name]++
		if s.SpanKind == trace.SpanKindConsumer && len(s.Links) != 1 {
			t.Errorf("handle span %q has %d links, want 1 (to the sending span)", s.Name, len(s.Links))
		}
	}
	for _, name := range []string{"workflow", "request plan", "send plan", "handle plan", "request execute", "send execute", "handle execute", "send executed", "send planned"} {
		if byName[name] != 1 {
			t.Errorf("%d spans named %q; all: %v", byName[name], name, byName)
		}
	}
}

// The replies the runtime sends itself (the ACK of SendAndWait, the error
// envelope of a Reject) continue the sender's trace, as handlers' replies
// do; they started a trace of their own.
func TestTracing_RuntimeRepliesContinueTheTrace(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	tp, _, opts := traced(t)
	m.started("worker", map[string]agentkit.HandlerFunc{
		"work":   func(context.Context, *agentkit.Message) error { return nil },
		"refuse": func(context.Context, *agentkit.Message) error { return agentkit.Reject(wire.CodeInvalid, "no") },
	}, opts...)
	orch := m.started("orch", nil, opts...)
	root, span := tp.Tracer("test").Start(context.Background(), "workflow")
	ack, err := orch.SendAndWait(root, "worker", "work", nil)
	if err != nil {
		t.Fatal(err)
	}
	refused, err := orch.Request(root, "worker", "refuse", nil)
	span.End()
	if !wire.IsRemote(err) {
		t.Fatalf("refuse: %v, want the remote INVALID", err)
	}
	want := span.SpanContext().TraceID().String()
	for name, e := range map[string]*wire.Envelope{"ack": ack.Envelope, "error reply": refused} {
		if e.Trace == nil || e.Trace.TraceID != want {
			t.Errorf("the %s is in trace %+v, want the caller's %s", name, e.Trace, want)
		}
	}
}

// Envelopes sent with SendBatch carry the batch span in their trace
// field, as their headers do, so readers of the body alone see the trace.
func TestTracing_SendBatchEnvelopesCarryTheTrace(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	tp, _, opts := traced(t)
	got := make(chan *wire.Envelope, 2)
	m.started("worker", map[string]agentkit.HandlerFunc{"work": func(_ context.Context, msg *agentkit.Message) error {
		got <- msg.Envelope
		return nil
	}}, opts...)
	orch := m.agent("orch", opts...)
	root, span := tp.Tracer("test").Start(context.Background(), "workflow")
	var envs []*wire.Envelope
	for range 2 {
		e, err := orch.NewRequest(root, "worker", "work", nil)
		if err != nil {
			t.Fatal(err)
		}
		envs = append(envs, e)
	}
	if err := orch.SendBatch(root, envs); err != nil {
		t.Fatal(err)
	}
	span.End()
	want := span.SpanContext().TraceID().String()
	for range 2 {
		select {
		case e := <-got:
			if e.Trace == nil || e.Trace.TraceID != want || e.Trace.ParentSpan != span.SpanContext().SpanID().String() {
				t.Errorf("envelope trace %+v, want trace %s under span %s", e.Trace, want, span.SpanContext().SpanID())
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the batch was not handled")
		}
	}
}

// Logs are structured and quiet by default; payloads appear only when asked for.
func TestLogging_StructuredWithoutPayloads(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	for _, withPayload := range []bool{false, true} {
		var buf natstest.SyncBuffer
		logger := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
		id := fmt.Sprintf("logged_%v", withPayload)
		m.started(id, map[string]agentkit.HandlerFunc{"work": func(context.Context, *agentkit.Message) error { return nil }},
			agentkit.WithLogger(logger), agentkit.WithPayloadLogging(withPayload), agentkit.WithRegistration(false))
		sender := m.agent("sender_" + id)
		if _, err := sender.Send(ctx(t), id, "work", map[string]string{"secret": "s3cr3t"}, agentkit.WithCorrelationID("corr_log")); err != nil {
			t.Fatal(err)
		}
		eventually(t, 5*time.Second, "handled log line", func() bool { return strings.Contains(buf.String(), `"msg":"message handled"`) })
		out := buf.String()
		for _, field := range []string{`"agent":"` + id + `"`, `"correlation_id":"corr_log"`, `"action":"work"`, `"outcome":"ack"`, `"message_id":"`} {
			if !strings.Contains(out, field) {
				t.Errorf("log lacks %s:\n%s", field, out)
			}
		}
		if got := strings.Contains(out, "s3cr3t"); got != withPayload {
			t.Errorf("payload logged = %v with payload logging %v:\n%s", got, withPayload, out)
		}
	}
}

// withMetrics returns the option that exports an agent's metrics on reg.
func withMetrics(t testing.TB, reg prometheus.Registerer) agentkit.Option {
	t.Helper()
	m, err := metrics.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	return agentkit.WithHooks(m)
}
