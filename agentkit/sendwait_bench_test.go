package agentkit_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/internal/natstest"
)

// BenchmarkSendAndWait measures one SendAndWait round trip (send, handle,
// ack envelope back) of the same payload bytes as a plain message and as a
// task.update carrying a task id, which the receiver records in the task's
// state. Compare the two within one run: the record is written after the
// ACK, so the two should cost the sender about the same.
func BenchmarkSendAndWait(b *testing.B) {
	s := natstest.RunServer(b)
	ctx := context.Background()
	worker, err := agentkit.New(natstest.Connect(b, s), "worker")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(worker.Stop)
	ok := func(context.Context, *agentkit.Message) error { return nil }
	for _, action := range []string{"work.update", "task.update"} {
		if err := worker.Handle(action, agentkit.HandlerFunc(ok)); err != nil {
			b.Fatal(err)
		}
	}
	if err := worker.Start(ctx); err != nil {
		b.Fatal(err)
	}
	client, err := agentkit.New(natstest.Connect(b, s), "client")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(client.Stop)
	if err := client.Start(ctx); err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct{ name, action string }{{"plain", "work.update"}, {"task", "task.update"}} {
		b.Run(c.name, func(b *testing.B) {
			i := 0
			for b.Loop() {
				id := fmt.Sprintf("t-%s-%d", c.name, i)
				i++
				payload := map[string]any{"task_id": id, "status": "in_progress", "progress": 0.5}
				var opts []agentkit.SendOption
				if c.action == "task.update" {
					opts = append(opts, agentkit.WithTaskID(id))
				}
				if _, err := client.SendAndWait(ctx, "worker", c.action, payload, opts...); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
