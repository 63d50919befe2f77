package agentkit

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/agentmesh-io/agentmesh/agentkit/protocol"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// The runtime keeps each task's state in the shared state as
// task.* messages flow: the agent that acks one records it.
//
//	task.assign    in_progress, assigned to the receiver
//	task.update    the update's status (in_progress, ...), with its progress
//	task.complete  completed, with the result (and no error report)
//	task.failed    failed, with the error report (and no result)
//	task.handoff   history only: the new owner is known once it acts
//
// Whatever order the messages are acked in, the status, result and error
// are those of the newest message by its timestamp (ties: the greater
// message id), a finished status outranking an unfinished one; the
// assigned agent is that of the newest task.assign. The history holds
// every message once, in timestamp order: a redelivery of a message the
// agent already recorded changes nothing.
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
// creating the bucket on first use when the agent provisions. Without
// provisioning ([WithProvisioning](false)) it only binds to the bucket an
// administrator created (e.g. with [NewState]), and fails with an error
// matching jetstream.ErrBucketNotFound while there is none.
func (a *Agent) State(ctx context.Context) (*State, error) {
	a.shared.mu.Lock()
	defer a.shared.mu.Unlock()
	if a.shared.state != nil {
		return a.shared.state, nil
	}
	s, err := openState(ctx, a.js, a.opts.scheme, a.opts.replicas, a.opts.provision)
	if err != nil {
		return nil, err
	}
	a.shared.state = s
	return s, nil
}

// trackTask records an acked task.* message in its task's state.
func (a *Agent) trackTask(env *wire.Envelope) {
	if !strings.HasPrefix(env.Action, "task.") || env.MessageType == wire.TypeAck || env.MessageType == wire.TypeError {
		// An ack or error envelope repeats the action it answers: it is
		// not that action, and recording it would make its receiver the
		// assignee.
		return
	}
	id := taskID(env)
	if id == "" {
		return
	}
	a.recordTask(id, func(t *TaskState) {
		// Messages are recorded when acked, which is not the order they
		// were sent in (priorities, redeliveries, several instances; an
		// assignment is acked after its handler has sent the task's
		// updates): the event is placed by the message's own timestamp,
		// and the message sets the task's fields only if no message
		// recorded before it supersedes it.
		ev := protocol.TaskEvent{Timestamp: env.Timestamp, EventType: strings.TrimPrefix(env.Action, "task."), AgentID: env.SenderID,
			Details: map[string]any{"message_id": env.MessageID, "receiver": a.id}}
		if slices.ContainsFunc(t.History, func(o protocol.TaskEvent) bool { return sameEvent(o, ev) }) {
			// A redelivery this agent already recorded (another instance,
			// a lost ack, a consumer reset): the task is as it left it.
			return
		}
		var result json.RawMessage
		var report *protocol.ErrorReport
		switch env.Action {
		case protocol.ActionTaskUpdate:
			var u protocol.TaskUpdate
			if json.Unmarshal(env.Payload, &u) == nil && u.Status.Valid() {
				ev.Details["status"] = string(u.Status)
				ev.Details["progress"] = u.Progress
			}
		case protocol.ActionTaskComplete:
			var c protocol.TaskComplete
			if json.Unmarshal(env.Payload, &c) == nil {
				result = c.Result
			}
		case protocol.ActionTaskFailed:
			var f protocol.TaskFailure
			if json.Unmarshal(env.Payload, &f) == nil {
				report = &f.Error
			}
		}
		status, ok := eventStatus(ev)
		if ok && (!t.Status.Terminal() || status.Terminal()) &&
			!slices.ContainsFunc(t.History, func(o protocol.TaskEvent) bool { return supersedes(o, ev) }) {
			t.Status = status
			if env.Action == protocol.ActionTaskComplete || env.Action == protocol.ActionTaskFailed {
				t.Result, t.Error = result, report
			}
		}
		if env.Action == protocol.ActionTaskAssign &&
			!slices.ContainsFunc(t.History, func(o protocol.TaskEvent) bool { return o.EventType == ev.EventType && later(o, ev) }) {
			t.AssignedAgent = a.id
		}
		t.History = insertEvent(t.History, ev)
	})
}

// taskID returns the task env is about: its task_id, else the task_id
// every task.* payload carries, which a sender may set alone.
func taskID(env *wire.Envelope) string {
	if env.TaskID != "" {
		return env.TaskID
	}
	var p struct {
		TaskID string `json:"task_id"`
	}
	if json.Unmarshal(env.Payload, &p) != nil || subjects.ValidateToken("task id", p.TaskID) != nil {
		return ""
	}
	return p.TaskID
}

// eventStatus returns the status a task event recorded by trackTask sets,
// and false for events that set none.
func eventStatus(ev protocol.TaskEvent) (protocol.TaskStatus, bool) {
	switch "task." + ev.EventType {
	case protocol.ActionTaskAssign:
		return protocol.TaskInProgress, true
	case protocol.ActionTaskUpdate:
		s, _ := ev.Details["status"].(string)
		return protocol.TaskStatus(s), protocol.TaskStatus(s).Valid()
	case protocol.ActionTaskComplete:
		return protocol.TaskCompleted, true
	case protocol.ActionTaskFailed:
		return protocol.TaskFailed, true
	}
	return "", false
}

// supersedes reports whether the recorded event a takes precedence over ev
// for the task's status: a finished status over an unfinished one, else
// the later message.
func supersedes(a, ev protocol.TaskEvent) bool {
	sa, ok := eventStatus(a)
	if !ok {
		return false
	}
	s, _ := eventStatus(ev)
	if sa.Terminal() != s.Terminal() {
		return sa.Terminal()
	}
	return later(a, ev)
}

// sameEvent reports whether a and b record one message acked by one agent.
func sameEvent(a, b protocol.TaskEvent) bool {
	str := func(e protocol.TaskEvent, k string) string { s, _ := e.Details[k].(string); return s }
	return a.EventType == b.EventType && str(a, "message_id") == str(b, "message_id") &&
		str(a, "receiver") == str(b, "receiver")
}

// later reports whether event a comes after b: by timestamp, ties broken
// by message id.
func later(a, b protocol.TaskEvent) bool {
	if !a.Timestamp.Equal(b.Timestamp) {
		return a.Timestamp.After(b.Timestamp)
	}
	ida, _ := a.Details["message_id"].(string)
	idb, _ := b.Details["message_id"].(string)
	return ida > idb
}

// insertEvent adds ev to history in timestamp order (see later).
func insertEvent(history []protocol.TaskEvent, ev protocol.TaskEvent) []protocol.TaskEvent {
	i := len(history)
	for i > 0 && later(history[i-1], ev) {
		i--
	}
	return slices.Insert(history, i, ev)
}

// recordHandoff notes in the task's history that env moved from one agent
// to another.
func (a *Agent) recordHandoff(env *wire.Envelope, from, to, reason string) {
	if env.TaskID == "" {
		return
	}
	a.recordTask(env.TaskID, func(t *TaskState) {
		t.History = insertEvent(t.History, protocol.TaskEvent{Timestamp: time.Now().UTC(), EventType: "handoff", AgentID: a.id,
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
