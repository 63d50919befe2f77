package agentkit_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/protocol"
	"github.com/agentmesh-io/agentmesh/agentkit/registry"
	"github.com/agentmesh-io/agentmesh/agentkit/state"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// A Watch begun after the registry closed (as on the Registry of an agent
// that stopped) ends at once instead of never.
func TestRegistry_WatchAfterCloseIsClosed(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	js, err := jetstream.New(m.conn())
	if err != nil {
		t.Fatal(err)
	}
	reg, err := registry.Open(ctx(t), js, subjects.Default, 1, true)
	if err != nil {
		t.Fatal(err)
	}
	reg.Close()
	select {
	case ev, ok := <-reg.Watch(context.Background()):
		if ok {
			t.Fatalf("event %+v from a closed registry", ev)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Watch after Close: channel still open")
	}
}

// A task message handled again (another instance, a lost ack, a consumer
// reset) is recorded in the task's history once.
func TestTaskState_ReplayRecordedOnce(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	noop := func(context.Context, *agentkit.Message) error { return nil }
	// No dedup window: the replay reaches the handler and is acked again,
	// as on another instance of the agent.
	recv := m.started("recv", map[string]agentkit.HandlerFunc{protocol.ActionTaskUpdate: noop},
		agentkit.WithRegistration(false), agentkit.WithDedupWindow(0))
	sender := m.agent("sender", agentkit.WithRegistration(false))
	if _, err := sender.Send(ctx(t), "recv", protocol.ActionTaskUpdate, protocol.TaskUpdate{TaskID: "t1", Status: protocol.TaskInProgress, Progress: 0.5},
		agentkit.WithTaskID("t1"), agentkit.WithMessageType(wire.TypeNotification)); err != nil {
		t.Fatal(err)
	}
	shared, err := recv.State(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "update recorded", func() bool {
		task, err := shared.Task(ctx(t), "t1")
		return err == nil && len(task.History) == 1
	})
	first, err := shared.Get(ctx(t), state.EntityTask, "t1")
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(m.conn())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.ResetConsumerToSequence(ctx(t), "MESH", "recv_normal", 1); err != nil {
		t.Fatal(err)
	}
	// Wait for the replay's recording: the task's revision moves on.
	eventually(t, 5*time.Second, "replay recorded", func() bool {
		e, err := shared.Get(ctx(t), state.EntityTask, "t1")
		return err == nil && e.Revision > first.Revision
	})
	task, err := shared.Task(ctx(t), "t1")
	if err != nil {
		t.Fatal(err)
	}
	if len(task.History) != 1 || task.Status != protocol.TaskInProgress {
		t.Fatalf("after the replay: status %s, history %+v", task.Status, task.History)
	}
}
