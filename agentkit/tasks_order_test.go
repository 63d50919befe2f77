package agentkit_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/protocol"
	"github.com/agentmesh-io/agentmesh/agentkit/state"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
)

// taskMsg is one task.* message of an ordering case: sent by from to to,
// with its own timestamp and message id when at and id are set.
type taskMsg struct {
	from, to, action string
	payload          any
	at               time.Time
	id               string
}

// A task's current fields follow the newest task.* message by its
// timestamp (ties: the greater message id), not the order the receivers
// ack them in, and its history holds every message once, in timestamp
// order. In each case the late message goes at low priority and its
// handler is held until the other one, at high priority, is recorded.
func TestTaskState_CurrentFieldsFollowNewestMessage(t *testing.T) {
	t.Parallel()
	tie := time.Now().UTC()
	failure := protocol.ErrorReport{ErrorID: "e1", AgentID: "exec_a", ErrorType: protocol.ErrorTypeTimeout, Severity: protocol.SeverityHigh, Message: "timed out"}
	cases := []struct {
		name        string
		late, early taskMsg // late is sent first but recorded last
		want        func(*state.TaskState) string
	}{{
		name:  "older update",
		late:  taskMsg{from: "exec_a", to: "orch", action: protocol.ActionTaskUpdate, payload: protocol.TaskUpdate{Status: protocol.TaskPending, Progress: 0.4}},
		early: taskMsg{from: "exec_a", to: "orch", action: protocol.ActionTaskUpdate, payload: protocol.TaskUpdate{Status: protocol.TaskInProgress, Progress: 0.8}},
		want: func(ts *state.TaskState) string {
			return expect(ts.Status == protocol.TaskInProgress, "status %s, want in_progress", ts.Status)
		},
	}, {
		name:  "older failure",
		late:  taskMsg{from: "exec_a", to: "orch", action: protocol.ActionTaskFailed, payload: protocol.TaskFailure{Error: failure}},
		early: taskMsg{from: "exec_a", to: "orch", action: protocol.ActionTaskComplete, payload: protocol.TaskComplete{Result: json.RawMessage(`{"ok":true}`)}},
		want: func(ts *state.TaskState) string {
			return expect(ts.Status == protocol.TaskCompleted && string(ts.Result) == `{"ok":true}` && ts.Error == nil,
				"status %s, result %s, error %v; want completed with the result and no error", ts.Status, ts.Result, ts.Error)
		},
	}, {
		name:  "older assignment",
		late:  taskMsg{from: "orch", to: "exec_a", action: protocol.ActionTaskAssign, payload: protocol.TaskAssignment{TaskType: "db"}},
		early: taskMsg{from: "orch", to: "exec_b", action: protocol.ActionTaskAssign, payload: protocol.TaskAssignment{TaskType: "db"}},
		want: func(ts *state.TaskState) string {
			return expect(ts.Status == protocol.TaskInProgress && ts.AssignedAgent == "exec_b",
				"status %s, assigned to %q; want in_progress, exec_b", ts.Status, ts.AssignedAgent)
		},
	}, {
		name:  "completion before a newer update",
		late:  taskMsg{from: "exec_a", to: "orch", action: protocol.ActionTaskComplete, payload: protocol.TaskComplete{Result: json.RawMessage(`1`)}},
		early: taskMsg{from: "exec_a", to: "orch", action: protocol.ActionTaskUpdate, payload: protocol.TaskUpdate{Status: protocol.TaskInProgress, Progress: 0.9}},
		want: func(ts *state.TaskState) string {
			return expect(ts.Status == protocol.TaskCompleted && string(ts.Result) == `1`, "status %s, result %s; want completed, 1", ts.Status, ts.Result)
		},
	}, {
		name:  "same time, smaller id",
		late:  taskMsg{from: "exec_a", to: "orch", action: protocol.ActionTaskUpdate, payload: protocol.TaskUpdate{Status: protocol.TaskPending}, at: tie, id: "m-1"},
		early: taskMsg{from: "exec_a", to: "orch", action: protocol.ActionTaskUpdate, payload: protocol.TaskUpdate{Status: protocol.TaskInProgress}, at: tie, id: "m-2"},
		want: func(ts *state.TaskState) string {
			return expect(ts.Status == protocol.TaskInProgress, "status %s, want in_progress (m-2)", ts.Status)
		},
	}, {
		name:  "same time, greater id",
		late:  taskMsg{from: "exec_a", to: "orch", action: protocol.ActionTaskUpdate, payload: protocol.TaskUpdate{Status: protocol.TaskInProgress}, at: tie, id: "m-2"},
		early: taskMsg{from: "exec_a", to: "orch", action: protocol.ActionTaskUpdate, payload: protocol.TaskUpdate{Status: protocol.TaskPending}, at: tie, id: "m-1"},
		want: func(ts *state.TaskState) string {
			return expect(ts.Status == protocol.TaskInProgress, "status %s, want in_progress (m-2)", ts.Status)
		},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			m := newMesh(t)
			gate := make(chan struct{})
			// Holds the low priority (late) message until the gate opens.
			held := func(ctx context.Context, msg *agentkit.Message) error {
				if msg.Priority == wire.PriorityLow {
					select {
					case <-gate:
					case <-ctx.Done():
						return ctx.Err()
					}
				}
				return nil
			}
			handlers := map[string]agentkit.HandlerFunc{
				protocol.ActionTaskAssign: held, protocol.ActionTaskUpdate: held,
				protocol.ActionTaskComplete: held, protocol.ActionTaskFailed: held,
			}
			onErr := agentkit.WithErrorHandler(func(err error) { t.Log(err) })
			agents := map[string]*agentkit.Agent{}
			for _, id := range []string{"orch", "exec_a", "exec_b"} {
				agents[id] = m.started(id, handlers, agentkit.WithRegistration(false), onErr)
			}
			open := sync.OnceFunc(func() { close(gate) })
			t.Cleanup(open) // before the agents stop

			const task = "t1"
			c := ctx(t)
			send := func(msg taskMsg, p wire.Priority) *wire.Envelope {
				t.Helper()
				from := agents[msg.from]
				env, err := from.NewRequest(c, msg.to, msg.action, withTaskID(t, msg.payload, task),
					agentkit.WithTaskID(task), agentkit.WithPriority(p), agentkit.WithMessageType(wire.TypeNotification))
				if err != nil {
					t.Fatal(err)
				}
				if !msg.at.IsZero() {
					env.Timestamp, env.MessageID = msg.at, msg.id
				}
				if err := from.SendEnvelope(c, env); err != nil {
					t.Fatal(err)
				}
				return env
			}
			late := send(tc.late, wire.PriorityLow)
			early := send(tc.early, wire.PriorityHigh)
			if tc.late.at.IsZero() && !early.Timestamp.After(late.Timestamp) {
				t.Fatalf("timestamps %v, %v not increasing", late.Timestamp, early.Timestamp)
			}

			shared, err := agents["orch"].State(c)
			if err != nil {
				t.Fatal(err)
			}
			var ts *state.TaskState
			recorded := func(n int) func() bool {
				return func() bool {
					ts, err = shared.Task(c, task)
					return err == nil && len(ts.History) == n
				}
			}
			eventually(t, 10*time.Second, "the early message recorded", recorded(1))
			open()
			eventually(t, 10*time.Second, "both messages recorded", recorded(2))
			if msg := tc.want(ts); msg != "" {
				t.Error(msg)
			}
			var ids []string
			for _, ev := range ts.History {
				ids = append(ids, fmt.Sprint(ev.Details["message_id"]))
			}
			first, second := late, early
			if early.Timestamp.Before(late.Timestamp) || (early.Timestamp.Equal(late.Timestamp) && early.MessageID < late.MessageID) {
				first, second = early, late
			}
			if want := []string{first.MessageID, second.MessageID}; fmt.Sprint(ids) != fmt.Sprint(want) {
				t.Errorf("history message ids %v, want %v", ids, want)
			}
		})
	}
}

// withTaskID returns payload, a task protocol struct, with its TaskID set.
func withTaskID(t *testing.T, payload any, id string) any {
	t.Helper()
	switch p := payload.(type) {
	case protocol.TaskUpdate:
		p.TaskID = id
		return p
	case protocol.TaskComplete:
		p.TaskID = id
		return p
	case protocol.TaskFailure:
		p.TaskID, p.Error.TaskID = id, id
		return p
	case protocol.TaskAssignment:
		p.TaskID = id
		return p
	}
	t.Fatalf("payload %T", payload)
	return nil
}

// expect returns the message formatted from format and args unless ok.
func expect(ok bool, format string, args ...any) string {
	if ok {
		return ""
	}
	return fmt.Sprintf(format, args...)
}

// Every task.* action the runtime documents is recorded when its receiver
// acks it, also when the sender put the task id only in the payload, where
// every task protocol message carries it; task.assign also makes the
// receiver the assignee.
func TestTaskState_EveryActionRecordedFromPayloadTaskID(t *testing.T) {
	t.Parallel()
	failure := protocol.ErrorReport{ErrorID: "e1", AgentID: "exec", ErrorType: protocol.ErrorTypeTimeout, Severity: protocol.SeverityHigh, Message: "timed out"}
	cases := []struct {
		action  string
		payload any
		want    func(*state.TaskState) string
	}{
		{protocol.ActionTaskAssign, protocol.TaskAssignment{TaskType: "db"}, func(ts *state.TaskState) string {
			return expect(ts.Status == protocol.TaskInProgress && ts.AssignedAgent == "recv",
				"status %s, assigned to %q; want in_progress, recv", ts.Status, ts.AssignedAgent)
		}},
		{protocol.ActionTaskUpdate, protocol.TaskUpdate{Status: protocol.TaskInProgress, Progress: 0.5}, func(ts *state.TaskState) string {
			return expect(ts.Status == protocol.TaskInProgress, "status %s, want in_progress", ts.Status)
		}},
		{protocol.ActionTaskComplete, protocol.TaskComplete{Result: json.RawMessage(`1`)}, func(ts *state.TaskState) string {
			return expect(ts.Status == protocol.TaskCompleted && string(ts.Result) == `1`, "status %s, result %s; want completed, 1", ts.Status, ts.Result)
		}},
		{protocol.ActionTaskFailed, protocol.TaskFailure{Error: failure}, func(ts *state.TaskState) string {
			return expect(ts.Status == protocol.TaskFailed && ts.Error != nil, "status %s, error %v; want failed with the report", ts.Status, ts.Error)
		}},
		{protocol.ActionTaskHandoff, protocol.TaskHandoffRequest{FromAgent: "sender", ToAgent: "recv", Reason: protocol.HandoffLoadBalancing}, func(ts *state.TaskState) string {
			return expect(ts.Status == protocol.TaskPending && ts.AssignedAgent == "", "status %s, assigned to %q; want pending, none", ts.Status, ts.AssignedAgent)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.action, func(t *testing.T) {
			t.Parallel()
			m := newMesh(t)
			noop := func(context.Context, *agentkit.Message) error { return nil }
			m.started("recv", map[string]agentkit.HandlerFunc{tc.action: noop}, agentkit.WithRegistration(false))
			sender := m.agent("sender", agentkit.WithRegistration(false))
			c := ctx(t)
			const task = "t1"
			env, err := sender.Send(c, "recv", tc.action, payloadWithTaskID(t, tc.payload, task), agentkit.WithMessageType(wire.TypeNotification))
			if err != nil {
				t.Fatal(err)
			}
			if env.TaskID != "" {
				t.Fatalf("task_id %q set on the envelope, want it in the payload only", env.TaskID)
			}
			shared, err := sender.State(c)
			if err != nil {
				t.Fatal(err)
			}
			var ts *state.TaskState
			eventually(t, 10*time.Second, "the message recorded", func() bool {
				ts, err = shared.Task(c, task)
				return err == nil && len(ts.History) == 1
			})
			if ev := ts.History[0]; "task."+ev.EventType != tc.action || ev.Details["message_id"] != env.MessageID || ev.Details["receiver"] != "recv" {
				t.Errorf("event %+v, want %s of %s received by recv", ev, tc.action, env.MessageID)
			}
			if msg := tc.want(ts); msg != "" {
				t.Error(msg)
			}
		})
	}
}

// payloadWithTaskID is withTaskID for every task protocol payload,
// handoff requests included.
func payloadWithTaskID(t *testing.T, payload any, id string) any {
	t.Helper()
	if p, ok := payload.(protocol.TaskHandoffRequest); ok {
		p.TaskID = id
		return p
	}
	return withTaskID(t, payload, id)
}
