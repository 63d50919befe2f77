package agentkit

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"sync"
	"time"
)

// The runtime keeps each task's state in the shared state (seed 002) as
// task.* messages flow: the agent that acks one records it.
//
//	task.assign    in_progress, assigned to the receiver
//	task.update    the update's status (in_progress, ...), with its progress
//	task.complete  completed, with the result
//	task.failed    failed, with the error report
//	task.handoff   history only: the new owner is known once it acts
//
// Reroutes and fallbacks of a message with a task id are recorded in the
// task's history too. Failures to record are reported to the error
// handler; they never fail the message.

// sharedState opens the state bucket lazily, once.
type sharedState struct {
	mu    sync.Mutex
	state *State
}

// State returns the shared state of the agent's mesh (KV mesh_state),
// creating the bucket on first use when the agent provisions.
func (a *Agent) State(ctx context.Context) (*State, error) {
	a.shared.mu.Lock()
	defer a.shared.mu.Unlock()
	if a.shared.state != nil {
		return a.shared.state, nil
	}
	s, err := NewState(ctx, a.js, a.opts.scheme, a.opts.replicas)
	if err != nil {
		return nil, err
	}
	a.shared.state = s
	return s, nil
}

// trackTask records an acked task.* message in its task's state.
func (a *Agent) trackTask(env *Envelope) {
	if env.TaskID == "" || !strings.HasPrefix(env.Action, "task.") {
		return
	}
	a.recordTask(env.TaskID, func(t *TaskState) {
		// Messages are recorded when acked, which is not the order they
		// were sent in (an assignment is acked after its handler has sent
		// the task's updates): events are placed by the message's own
		// timestamp, and a finished task never goes back to in progress.
		ev := TaskEvent{Timestamp: env.Timestamp, EventType: strings.TrimPrefix(env.Action, "task."), AgentID: env.SenderID,
			Details: map[string]any{"message_id": env.MessageID, "receiver": a.id}}
		status := t.Status
		switch env.Action {
		case ActionTaskAssign:
			status = TaskInProgress
			if t.AssignedAgent == "" || !t.Status.Terminal() {
				t.AssignedAgent = a.id
			}
		case ActionTaskUpdate:
			var u TaskUpdate
			if json.Unmarshal(env.Payload, &u) == nil && u.Status.Valid() {
				status = u.Status
				ev.Details["progress"] = u.Progress
			}
		case ActionTaskComplete:
			var c TaskComplete
			if json.Unmarshal(env.Payload, &c) == nil {
				t.Result = c.Result
			}
			status = TaskCompleted
		case ActionTaskFailed:
			var f TaskFailure
			if json.Unmarshal(env.Payload, &f) == nil {
				t.Error = &f.Error
			}
			status = TaskFailed
		}
		if !t.Status.Terminal() || status.Terminal() {
			t.Status = status
		}
		t.History = insertEvent(t.History, ev)
	})
}

// insertEvent adds ev to history in timestamp order.
func insertEvent(history []TaskEvent, ev TaskEvent) []TaskEvent {
	i := len(history)
	for i > 0 && history[i-1].Timestamp.After(ev.Timestamp) {
		i--
	}
	return slices.Insert(history, i, ev)
}

// recordHandoff notes in the task's history that env moved from one agent
// to another.
func (a *Agent) recordHandoff(env *Envelope, from, to, reason string) {
	if env.TaskID == "" {
		return
	}
	a.recordTask(env.TaskID, func(t *TaskState) {
		t.History = insertEvent(t.History, TaskEvent{Timestamp: time.Now().UTC(), EventType: "handoff", AgentID: a.id,
			Details: map[string]any{"from": from, "to": to, "reason": reason, "message_id": env.MessageID}})
		if t.AssignedAgent == from {
			t.AssignedAgent = to
		}
	})
}

func (a *Agent) recordTask(id string, fn func(*TaskState)) {
	ctx, cancel := context.WithTimeout(context.Background(), a.opts.publishTimeout)
	defer cancel()
	state, err := a.State(ctx)
	if err == nil {
		_, err = state.UpdateTask(ctx, id, func(t *TaskState) error { fn(t); return nil })
	}
	if err != nil {
		a.asyncError(err)
	}
}
