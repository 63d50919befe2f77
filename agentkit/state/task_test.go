package state_test

import (
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/agentmesh-io/agentmesh/agentkit/protocol"
	"github.com/agentmesh-io/agentmesh/agentkit/state"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/internal/jsontest"
)

// taskEnv returns a task.* message of task t1 sent by from at at.
func taskEnv(t *testing.T, from, action string, payload any, at time.Time, id string) *wire.Envelope {
	t.Helper()
	env := wire.NewEnvelope(wire.TypeRequest, from, action)
	env.TaskID, env.Timestamp, env.MessageID = "t1", at, id
	env.Payload = jsontest.Marshal(t, payload)
	return env
}

// Record gives the same task whatever order the messages come in: the
// newest message sets the status, a finished status outranks an
// unfinished one, the newest assignment names the assignee, and a message
// recorded twice by one receiver is in the history once.
func TestTaskState_RecordOrderFree(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 10, 14, 30, 0, 0, time.UTC)
	assignA := taskEnv(t, "orch", protocol.ActionTaskAssign, protocol.TaskAssignment{TaskType: "db"}, t0, "m1")
	assignB := taskEnv(t, "orch", protocol.ActionTaskAssign, protocol.TaskAssignment{TaskType: "db"}, t0.Add(time.Second), "m2")
	update := taskEnv(t, "exec_b", protocol.ActionTaskUpdate, protocol.TaskUpdate{Status: protocol.TaskInProgress, Progress: 0.5}, t0.Add(2*time.Second), "m3")
	done := taskEnv(t, "exec_b", protocol.ActionTaskComplete, protocol.TaskComplete{Result: json.RawMessage(`{"ok":true}`)}, t0.Add(3*time.Second), "m4")
	late := taskEnv(t, "exec_b", protocol.ActionTaskUpdate, protocol.TaskUpdate{Status: protocol.TaskInProgress, Progress: 0.9}, t0.Add(4*time.Second), "m5")
	type step struct {
		env      *wire.Envelope
		receiver string
	}
	orders := map[string][]step{
		"sent order": {{assignA, "exec_a"}, {assignB, "exec_b"}, {update, "orch"}, {done, "orch"}, {late, "orch"}},
		"reversed":   {{late, "orch"}, {done, "orch"}, {update, "orch"}, {assignB, "exec_b"}, {assignA, "exec_a"}},
		"redelivered": {{done, "orch"}, {assignA, "exec_a"}, {done, "orch"}, {assignB, "exec_b"},
			{late, "orch"}, {update, "orch"}, {assignA, "exec_a"}},
	}
	for name, steps := range orders {
		t.Run(name, func(t *testing.T) {
			ts := state.TaskState{ID: "t1", Status: protocol.TaskPending}
			for _, s := range steps {
				ts.Record(s.env, s.receiver)
			}
			if ts.Status != protocol.TaskCompleted || string(ts.Result) != `{"ok":true}` || ts.Error != nil {
				t.Errorf("status %s, result %s, error %v; want completed with the result", ts.Status, ts.Result, ts.Error)
			}
			if ts.AssignedAgent != "exec_b" {
				t.Errorf("assigned to %q, want exec_b (the newer assignment)", ts.AssignedAgent)
			}
			var ids []string
			for _, ev := range ts.History {
				id, _ := ev.Details["message_id"].(string)
				ids = append(ids, id)
			}
			if want := []string{"m1", "m2", "m3", "m4", "m5"}; !slices.Equal(ids, want) {
				t.Errorf("history %v, want %v (once each, by timestamp)", ids, want)
			}
		})
	}

	ts := state.TaskState{ID: "t1", Status: protocol.TaskInProgress, AssignedAgent: "exec_a"}
	ts.RecordHandoff(state.Handoff{At: t0, By: "orch", MessageID: "m9", From: "exec_a", To: "exec_b", Reason: "reroute"})
	if ts.AssignedAgent != "exec_b" || len(ts.History) != 1 || ts.History[0].EventType != "handoff" || ts.History[0].Details["to"] != "exec_b" {
		t.Errorf("after a handoff from the assignee: %+v, want assigned to exec_b with one handoff event", ts)
	}
	ts.RecordHandoff(state.Handoff{At: t0.Add(time.Second), By: "orch", MessageID: "m10", From: "exec_c", To: "exec_d", Reason: "circuit open"})
	if ts.AssignedAgent != "exec_b" || len(ts.History) != 2 {
		t.Errorf("after a handoff from another agent: %+v, want still exec_b, two events", ts)
	}
}
