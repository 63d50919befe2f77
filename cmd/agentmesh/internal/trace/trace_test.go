package trace_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/cmd/agentmesh/internal/trace"
	"github.com/agentmesh-io/agentmesh/internal/natstest"
	"github.com/agentmesh-io/agentmesh/subjects"
)

func envelope(t *testing.T, typ wire.MessageType, from, to, action, id, inReplyTo string) []byte {
	t.Helper()
	e := wire.NewEnvelope(typ, from, action)
	e.MessageID, e.ReceiverID, e.InReplyTo, e.Correlation = id, to, inReplyTo, "c1"
	if typ == wire.TypeResponse {
		e.Status = wire.StatusSuccess
	}
	b, err := e.Encode()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestBuildRender(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	s := subjects.Default
	entries := []trace.Entry{
		trace.NewEntry(3, t0.Add(5*time.Millisecond), "mesh.agent.orch.high.planner", "m2", "m1", "response", "plan_complete",
			envelope(t, wire.TypeResponse, "planner", "orch", "plan_complete", "m2", "m1")),
		trace.NewEntry(1, t0, "mesh.agent.planner.high.orch", "m1", "", "request", "plan_workflow",
			envelope(t, wire.TypeRequest, "orch", "planner", "plan_workflow", "m1", "")),
		trace.NewEntry(7, t0.Add(1500*time.Millisecond), "mesh.agent.exec.high.orch", "m3", "", "request", "execute_operation", []byte("not json")),
		trace.NewEntry(8, t0.Add(1600*time.Millisecond), "mesh.agent.orch.high.exec", "m4", "m3", "response", "execution_complete",
			envelope(t, wire.TypeResponse, "exec", "orch", "execution_complete", "m4", "m3")),
	}
	roots := trace.Build(entries)
	if len(roots) != 2 || roots[0].MessageID != "m1" || len(roots[0].Children) != 1 || roots[0].Children[0].MessageID != "m2" {
		t.Fatalf("tree = %+v", roots)
	}
	if len(roots[1].Children) != 1 {
		t.Fatalf("a reply to an undecodable request must still link by header: %+v", roots[1])
	}
	var b strings.Builder
	if err := trace.Render(&b, roots, s, time.Time{}); err != nil {
		t.Fatal(err)
	}
	got := b.String()
	for _, want := range []string{
		"+0ms     orch → planner  request plan_workflow [high]  #1\n",
		"└─ +5ms     planner → orch  response plan_complete [high] success  #3\n",
		"+1.50s   orch → exec  request execute_operation [high] (body: ",
		"└─ +1.60s   exec → orch  response execution_complete [high] success  #8\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("render misses %q:\n%s", want, got)
		}
	}
}

func TestRead_FiltersByCorrelation(t *testing.T) {
	t.Parallel()
	srv := natstest.RunServer(t)
	nc := natstest.Connect(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	planner, _ := agentkit.New(nc, "planner")
	planner.HandleFunc("plan", func(ctx context.Context, m *agentkit.Message) error { return m.Reply(ctx, "planned", nil) })
	if err := planner.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer planner.Stop()
	orch, _ := agentkit.New(nc, "orch")
	if err := orch.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer orch.Stop()
	for i, corr := range []string{"other", "wanted", "other"} {
		if _, err := orch.Request(ctx, "planner", "plan", map[string]int{"i": i}, agentkit.WithCorrelationID(corr)); err != nil {
			t.Fatal(err)
		}
	}
	js, _ := jetstream.New(nc)
	entries, err := trace.Read(ctx, js, subjects.Default, "wanted")
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 2 || entries[0].Action != "plan" || entries[1].InReplyTo != entries[0].MessageID {
		t.Fatalf("entries = %+v", entries)
	}
	if entries, err := trace.Read(ctx, js, subjects.Default, "nothing"); err != nil || len(entries) != 0 {
		t.Fatalf("unknown correlation: %v %v", entries, err)
	}
	nope, _ := subjects.New("nope")
	if _, err := trace.Read(ctx, js, nope, "x"); !errors.Is(err, trace.ErrNoStream) {
		t.Fatal("missing stream: no error")
	}
}
