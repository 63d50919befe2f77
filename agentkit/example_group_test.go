package agentkit_test

import (
	"context"
	"fmt"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// A process hosting many agents puts them in one group: they share five
// consumers instead of five each.
func ExampleGroup() {
	ctx := context.Background()
	nc := connect()
	defer nc.Close()
	s, _ := subjects.New("group_example")

	g, _ := agentkit.NewGroup(nc, "host1", agentkit.WithGroupScheme(s))
	defer g.Close() // after the agents have stopped (defers run last first)
	done := make(chan string, 3)
	var agents []*agentkit.Agent
	for _, id := range []string{"summarizer", "translator", "checker"} {
		a, _ := agentkit.New(nc, id, agentkit.WithScheme(s), agentkit.WithRegistration(false),
			agentkit.WithGroup(g), agentkit.WithFanoutActions())
		a.HandleFunc("work", func(ctx context.Context, m *agentkit.Message) error {
			done <- id
			return nil
		})
		if err := a.Start(ctx); err != nil {
			panic(err)
		}
		defer a.Stop()
		agents = append(agents, a)
	}

	sender, _ := agentkit.New(nc, "sender", agentkit.WithScheme(s), agentkit.WithRegistration(false))
	defer sender.Stop()
	sender.Send(ctx, "translator", "work", nil)
	fmt.Println(<-done)

	info, _ := agents[0].ConsumerInfo(ctx, "normal")
	fmt.Println(info.Name)
	// Output:
	// translator
	// host1_group-normal
}
