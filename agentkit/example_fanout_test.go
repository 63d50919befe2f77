package agentkit_test

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// An agent that handles direct work and only one kind of broadcast: other
// broadcasts are acked as ignored, never refused, so the broadcaster's
// ledger and alerts see no failure.
func ExampleWithFanoutActions() {
	ctx := context.Background()
	nc := connect()
	defer nc.Close()
	s, _ := subjects.New("fanout_example")

	notices := make(chan string, 1)
	worker, _ := agentkit.New(nc, "worker", agentkit.WithScheme(s), agentkit.WithRegistration(false),
		agentkit.WithFanoutActions("shutdown_notice"))
	worker.HandleFunc("shutdown_notice", func(ctx context.Context, m *agentkit.Message) error {
		notices <- m.Action
		return nil
	})
	worker.HandleFunc("work", func(ctx context.Context, m *agentkit.Message) error { return nil })
	if err := worker.Start(ctx); err != nil {
		panic(err)
	}
	defer worker.Stop()

	ops, _ := agentkit.New(nc, "ops", agentkit.WithScheme(s), agentkit.WithRegistration(false))
	defer ops.Stop()
	ops.Broadcast(ctx, "work", nil)            // a broadcast of direct-only work: ignored
	ops.Broadcast(ctx, "shutdown_notice", nil) // declared: handled
	fmt.Println(<-notices)

	// Both went through the same consumer in order, so the first one was
	// settled before the second reached its handler.
	fmt.Println(worker.Stats().Outcomes[agentkit.OutcomeIgnored])
	js, _ := jetstream.New(nc)
	name, _ := s.FanoutConsumer("worker", "bulk")
	_, err := js.Consumer(ctx, s.Stream(), name)
	fmt.Println(err == nil)
	// Output:
	// shutdown_notice
	// 1
	// true
}
