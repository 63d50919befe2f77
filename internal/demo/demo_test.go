package demo_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agentmesh-io/agentmesh/internal/demo"
	"github.com/agentmesh-io/agentmesh/internal/natstest"
)

func TestDemo_BothWorkflows(t *testing.T) {
	t.Parallel()
	srv := natstest.RunServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	m, err := demo.Start(ctx, demo.Config{Connect: func(ctx context.Context, name string) (*nats.Conn, error) {
		return nats.Connect(srv.ClientURL(), nats.Name(name))
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Stop(ctx)
	w, err := m.RunCreditLimit(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !w.OK || len(w.Steps) != 5 {
		t.Fatalf("credit limit workflow: %+v", w)
	}
	f, err := m.RunFailure(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !f.OK {
		t.Fatalf("failure workflow: %+v", f)
	}
	stats := m.Stats(ctx)
	if len(stats) != 7 {
		t.Fatalf("stats of %d agents", len(stats))
	}
	if err := m.Stop(ctx); err != nil {
		t.Fatal(err)
	}
}
