package agentkit_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/protocol"
	"github.com/agentmesh-io/agentmesh/agentkit/registry"
	"github.com/agentmesh-io/agentmesh/agentkit/state"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
)

// Messages of one task are handled one at a time in stream order while
// other tasks interleave on the other workers.
func TestOrdering_WithinTaskWhileTasksInterleave(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	const tasks, perTask = 4, 25
	var mu sync.Mutex
	seen := map[string][]int{}
	running := map[string]int{}
	overlap := false
	var order []string // task of each handled message, in handling order
	recv := m.started("worker", map[string]agentkit.HandlerFunc{"step": func(ctx context.Context, msg *agentkit.Message) error {
		var step struct{ N int }
		if err := msg.DecodePayload(&step); err != nil {
			return agentkit.Reject(wire.CodeInvalid, err.Error())
		}
		mu.Lock()
		running[msg.TaskID]++
		if running[msg.TaskID] > 1 {
			overlap = true
		}
		mu.Unlock()
		time.Sleep(time.Millisecond) // long enough for other tasks to interleave
		mu.Lock()
		running[msg.TaskID]--
		seen[msg.TaskID] = append(seen[msg.TaskID], step.N)
		order = append(order, msg.TaskID)
		mu.Unlock()
		return nil
	}}, agentkit.WithConcurrency(4))
	sender := m.agent("sender")
	var batch []*wire.Envelope
	for n := range perTask {
		for task := range tasks {
			e, err := sender.NewRequest(ctx(t), "worker", "step", map[string]int{"n": n}, agentkit.WithTaskID(fmt.Sprintf("task%d", task)))
			if err != nil {
				t.Fatal(err)
			}
			batch = append(batch, e)
		}
	}
	if err := sender.SendBatch(ctx(t), batch); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "all steps", func() bool {
		return recv.Stats().Outcomes[agentkit.OutcomeAck] == tasks*perTask
	})
	mu.Lock()
	defer mu.Unlock()
	if overlap {
		t.Fatal("two messages of one task ran at the same time")
	}
	for task, steps := range seen {
		for i, n := range steps {
			if n != i {
				t.Fatalf("%s handled steps %v, want 0..%d in order", task, steps, perTask-1)
			}
		}
	}
	switches := 0
	for i := 1; i < len(order); i++ {
		if order[i] != order[i-1] {
			switches++
		}
	}
	if switches < tasks {
		t.Fatalf("tasks did not interleave: %d switches in %d messages", switches, len(order))
	}
}

// Inside a handler, outgoing messages inherit correlation, workflow, task,
// session and context without the handler copying fields.
func TestContext_InheritedByOutgoingMessages(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	got := make(chan *wire.Envelope, 1)
	m.started("validator", map[string]agentkit.HandlerFunc{"validate": func(_ context.Context, msg *agentkit.Message) error {
		got <- msg.Envelope
		return nil
	}})
	var executor *agentkit.Agent
	executor = m.started("executor", map[string]agentkit.HandlerFunc{"execute": func(ctx context.Context, msg *agentkit.Message) error {
		_, err := executor.Send(ctx, "validator", "validate", nil) // no ids passed
		return err
	}})
	orch := m.agent("orch")
	sessionCtx := json.RawMessage(`{"previous_decisions":["use JSONL"]}`)
	if _, err := orch.Send(ctx(t), "executor", "execute", nil, agentkit.WithCorrelationID("corr_9"), agentkit.WithWorkflowID("wf_9"),
		agentkit.WithTaskID("t9"), agentkit.WithSessionID("sess_9"), agentkit.WithSessionContext(sessionCtx)); err != nil {
		t.Fatal(err)
	}
	select {
	case e := <-got:
		if e.Correlation != "corr_9" || e.WorkflowID != "wf_9" || e.TaskID != "t9" || e.SessionID != "sess_9" || string(e.Context) != string(sessionCtx) {
			t.Fatalf("validator got %+v", e)
		}
		if e.SenderID != "executor" || e.InReplyTo != "" {
			t.Fatalf("validator got sender %q in_reply_to %q", e.SenderID, e.InReplyTo)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("validator got nothing")
	}
}

// The workflow of a correlation id is read back from the stream: every
// message in order, the agents involved and how each request ended.
func TestWorkflowStatus(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	m.started("planner", map[string]agentkit.HandlerFunc{"plan_workflow": func(ctx context.Context, msg *agentkit.Message) error {
		return msg.Reply(ctx, "plan_complete", nil)
	}})
	m.started("executor", map[string]agentkit.HandlerFunc{"execute_operation": func(_ context.Context, msg *agentkit.Message) error {
		if string(msg.Payload) == `"bad"` {
			return agentkit.Reject(wire.CodeInvalid, "bad operation")
		}
		return nil
	}})
	orch := m.started("orch", nil)
	corr := agentkit.WithCorrelationID("corr_wf")
	if _, err := orch.Request(ctx(t), "planner", "plan_workflow", nil, corr); err != nil {
		t.Fatal(err)
	}
	if _, err := orch.SendAndWait(ctx(t), "executor", "execute_operation", "good", corr); err != nil {
		t.Fatal(err)
	}
	wf, err := orch.WorkflowStatus(ctx(t), "corr_wf")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := orch.Request(ctx(t), "planner", "plan_workflow", nil); err != nil { // another conversation
		t.Fatal(err)
	}
	type row struct{ typ, action, from, to, outcome string }
	var got []row
	for _, msg := range wf.Messages {
		got = append(got, row{string(msg.Type), msg.Action, msg.Sender, msg.Receiver, msg.Outcome})
	}
	want := []row{
		{"request", "plan_workflow", "orch", "planner", "answered"},
		{"response", "plan_complete", "planner", "orch", ""},
		{"request", "execute_operation", "orch", "executor", "acked"},
		{"ack", "execute_operation", "executor", "orch", ""},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("messages:\n got %v\nwant %v", got, want)
	}
	if wf.Outcome != agentkit.WorkflowCompleted || fmt.Sprint(wf.Agents) != "[orch planner executor]" {
		t.Fatalf("outcome %s, agents %v", wf.Outcome, wf.Agents)
	}
	if _, err := orch.SendAndWait(ctx(t), "executor", "execute_operation", "bad", corr); err == nil {
		t.Fatal("want a NACK")
	}
	wf, err = orch.WorkflowStatus(ctx(t), "corr_wf")
	if err != nil {
		t.Fatal(err)
	}
	if len(wf.Messages) != 6 || wf.Outcome != agentkit.WorkflowFailed || wf.Messages[4].Outcome != "failed" {
		t.Fatalf("after a NACK: outcome %s, %+v", wf.Outcome, wf.Messages)
	}
}

// The runtime keeps a task's state as task.* messages flow, and records a
// reroute in the task's history.
func TestTaskState_KeptAsTaskMessagesFlow(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	noop := func(context.Context, *agentkit.Message) error { return nil }
	orch := m.started("orch", map[string]agentkit.HandlerFunc{
		protocol.ActionTaskUpdate: noop, protocol.ActionTaskComplete: noop,
	}, agentkit.WithHeartbeat(testHeartbeat), agentkit.WithErrorHandler(func(err error) { t.Log("orch:", err) }))
	var executor *agentkit.Agent
	executor = m.started("executor", map[string]agentkit.HandlerFunc{protocol.ActionTaskAssign: func(ctx context.Context, msg *agentkit.Message) error {
		// The task id is inherited from the assignment.
		if _, err := executor.Send(ctx, "orch", protocol.ActionTaskUpdate, protocol.TaskUpdate{TaskID: msg.TaskID, Status: protocol.TaskInProgress, Progress: 0.5},
			agentkit.WithMessageType(wire.TypeNotification)); err != nil {
			return err
		}
		_, err := executor.Send(ctx, "orch", protocol.ActionTaskComplete, protocol.TaskComplete{TaskID: msg.TaskID, Result: json.RawMessage(`{"updated":1}`)},
			agentkit.WithMessageType(wire.TypeNotification))
		return err
	}}, agentkit.WithHeartbeat(testHeartbeat))
	m.started("router", map[string]agentkit.HandlerFunc{protocol.ActionTaskAssign: func(context.Context, *agentkit.Message) error {
		return agentkit.Reroute("database")
	}}, agentkit.WithHeartbeat(testHeartbeat))
	_ = executor
	// executor declares the capability the router reroutes to.
	exec2 := m.started("executor_db", map[string]agentkit.HandlerFunc{protocol.ActionTaskAssign: noop},
		agentkit.WithCapabilities(agentkit.Capability{Name: "database"}), agentkit.WithHeartbeat(testHeartbeat))
	_ = exec2
	if _, err := orch.Send(ctx(t), "executor", protocol.ActionTaskAssign, protocol.TaskAssignment{TaskID: "t1", TaskType: "db_update"}, agentkit.WithTaskID("t1")); err != nil {
		t.Fatal(err)
	}
	shared, err := orch.State(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	var task *state.TaskState
	// The executor records the assignment when it acks it, which is after
	// its handler sent the update and completion: wait for all three.
	eventually(t, 5*time.Second, "task t1 completed with three events", func() bool {
		task, err = shared.Task(ctx(t), "t1")
		return err == nil && task.Status == protocol.TaskCompleted && len(task.History) == 3
	})
	var events []string
	for _, ev := range task.History {
		events = append(events, ev.EventType)
	}
	if task.AssignedAgent != "executor" || string(task.Result) != `{"updated":1}` || fmt.Sprint(events) != "[assign update complete]" {
		t.Fatalf("task = %+v, events %v", task, events)
	}
	eventually(t, 5*time.Second, "discovery of executor_db", func() bool {
		got, _ := orch.Registry().Find(ctx(t), registry.Query{Capability: "database", Status: agentkit.StatusReady})
		return len(got) == 1
	})
	if _, err := orch.Send(ctx(t), "router", protocol.ActionTaskAssign, protocol.TaskAssignment{TaskID: "t2", TaskType: "db_update"}, agentkit.WithTaskID("t2")); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "t2 handed off and assigned", func() bool {
		task, err = shared.Task(ctx(t), "t2")
		if err != nil || task.AssignedAgent != "executor_db" {
			return false
		}
		for _, ev := range task.History {
			if ev.EventType == "handoff" && ev.Details["from"] == "router" && ev.Details["to"] == "executor_db" {
				return true
			}
		}
		return false
	})
}

// A redelivery of a message the agent already finished (as after a
// consumer leader failover lost its acks) is acked without running the
// handler again. Resetting the consumer replays acked messages the same way.
func TestDedup_RedeliveryOfHandledMessageSkipsHandler(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	var rec recorder
	recv := m.started("recv", map[string]agentkit.HandlerFunc{"work": rec.handle(nil)}, agentkit.WithRegistration(false))
	sender := m.agent("sender")
	const n = 10
	for i := range n {
		if _, err := sender.Send(ctx(t), "recv", "work", map[string]int{"i": i}); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 5*time.Second, "handled once", func() bool { return rec.count() == n })
	js, _ := jetstream.New(m.conn())
	if _, err := js.ResetConsumerToSequence(ctx(t), "MESH", "recv_normal", 1); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "replays acked as duplicates", func() bool {
		return recv.Stats().Outcomes[agentkit.OutcomeDuplicate] == n
	})
	if rec.count() != n {
		t.Fatalf("handler ran %d times for %d messages", rec.count(), n)
	}
	// With the window off, the same replay reaches the handler.
	var rec2 recorder
	m.started("recv2", map[string]agentkit.HandlerFunc{"work": rec2.handle(nil)}, agentkit.WithRegistration(false), agentkit.WithDedupWindow(0))
	if _, err := sender.Send(ctx(t), "recv2", "work", nil); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "recv2 handled", func() bool { return rec2.count() == 1 })
	if _, err := js.ResetConsumerToSequence(ctx(t), "MESH", "recv2_normal", 1); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "replay handled again without dedup", func() bool { return rec2.count() == 2 })
}

// A redelivery that arrives while the first delivery's handler still runs
// on this instance does not start a second run; the running one settles it.
func TestDedup_RedeliveryWhileRunningIsNotHandledTwice(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	release := make(chan struct{})
	var releaseOnce sync.Once
	free := func() { releaseOnce.Do(func() { close(release) }) }
	started := make(chan struct{}, 4)
	var rec recorder
	recv := m.started("recv", map[string]agentkit.HandlerFunc{"work": func(ctx context.Context, msg *agentkit.Message) error {
		started <- struct{}{}
		rec.handle(nil)(ctx, msg)
		select {
		case <-release:
		case <-ctx.Done():
			return ctx.Err()
		}
		return nil
	}}, agentkit.WithRegistration(false))
	t.Cleanup(free) // registered after the agent's Stop, so it runs first: handlers never block Stop
	sender := m.agent("sender")
	if _, err := sender.Send(ctx(t), "recv", "work", nil); err != nil {
		t.Fatal(err)
	}
	<-started
	js, _ := jetstream.New(m.conn())
	if _, err := js.ResetConsumerToSequence(ctx(t), "MESH", "recv_normal", 1); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "redelivery seen as a duplicate", func() bool {
		return recv.Stats().Outcomes[agentkit.OutcomeDuplicate] == 1
	})
	free()
	eventually(t, 5*time.Second, "acked", func() bool { return recv.Stats().Outcomes[agentkit.OutcomeAck] == 1 })
	if rec.count() != 1 {
		t.Fatalf("handler ran %d times", rec.count())
	}
	info, err := recv.ConsumerInfo(ctx(t), wire.PriorityNormal)
	if err != nil {
		t.Fatal(err)
	}
	if info.NumAckPending != 0 {
		t.Fatalf("%d messages still unacknowledged", info.NumAckPending)
	}
}
