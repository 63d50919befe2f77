package registry_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/registry"
	"github.com/agentmesh-io/agentmesh/internal/natstest"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// The records a running agent writes read back, director included,
// without the runtime's watched registry.
func TestDirector_ReadsTheRecordsAgentsWrite(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	a, err := agentkit.New(natstest.Connect(t, s), "planner", agentkit.WithDirector("ops_director"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Stop)
	if err := a.Start(ctx); err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(natstest.Connect(t, s))
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, subjects.Default.RegistryBucket())
	if err != nil {
		t.Fatal(err)
	}
	ins, err := registry.Instances(ctx, kv, "planner")
	if err != nil || len(ins) != 1 || ins[0].ID != "planner" || ins[0].Director != "ops_director" {
		t.Fatalf("Instances = %+v, %v; want planner's one instance, director ops_director", ins, err)
	}
	for agent, want := range map[string]string{"planner": "ops_director", "unknown": ""} {
		if d, err := registry.Director(ctx, kv, agent); err != nil || d != want {
			t.Errorf("Director(%s) = %q, %v; want %q", agent, d, err, want)
		}
	}
	if _, err := registry.Director(ctx, kv, "a.b"); err == nil {
		t.Error("Director of an invalid agent id: no error")
	}
}
