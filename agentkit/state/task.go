package state

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/agentmesh-io/agentmesh/agentkit/protocol"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
)

// TaskState is a task's entry in the shared state,
// stored as [EntityTask].
type TaskState struct {
	ID            string                `json:"id"`
	Status        protocol.TaskStatus   `json:"status"`
	AssignedAgent string                `json:"assigned_agent,omitempty"`
	CreatedAt     time.Time             `json:"created_at"`
	UpdatedAt     time.Time             `json:"updated_at"`
	Context       *protocol.TaskContext `json:"context,omitempty"`
	Result        json.RawMessage       `json:"result,omitempty"`
	Error         *protocol.ErrorReport `json:"error,omitempty"`
	History       []protocol.TaskEvent  `json:"history,omitempty"`
}

// Task returns the state of task id, or an error matching [ErrNotFound].
func (s *State) Task(ctx context.Context, id string) (*TaskState, error) {
	e, err := s.Get(ctx, EntityTask, id)
	if err != nil {
		return nil, err
	}
	var t TaskState
	if err := e.Decode(&t); err != nil {
		return nil, err
	}
	return &t, nil
}

// UpdateTask applies fn to the state of task id and stores the result with
// compare-and-swap, as [State.Update] does: fn may run several times and
// must only change the TaskState it is given. A task that does not exist
// yet starts as a pending TaskState with its ID and CreatedAt set. After fn,
// UpdateTask restores ID, sets UpdatedAt to now and checks the status. It
// returns the task as stored.
func (s *State) UpdateTask(ctx context.Context, id string, fn func(*TaskState) error) (*TaskState, error) {
	var t TaskState
	_, err := s.Update(ctx, EntityTask, id, func(old json.RawMessage) (any, error) {
		now := time.Now().UTC()
		t = TaskState{ID: id, Status: protocol.TaskPending, CreatedAt: now}
		if old != nil {
			t = TaskState{}
			if err := json.Unmarshal(old, &t); err != nil {
				return nil, fmt.Errorf("decode: %w", err)
			}
		}
		if err := fn(&t); err != nil {
			return nil, err
		}
		t.ID = id
		t.UpdatedAt = now
		if !t.Status.Valid() {
			return nil, fmt.Errorf("%w: task status %q", ErrInvalid, string(t.Status))
		}
		return &t, nil
	})
	if err != nil {
		return nil, err
	}
	return &t, nil
}

// Record applies the task.* message env, acked by agent receiver, to t.
// It changes nothing but t and reads no clock, so any number of agents can
// apply the messages of one task, in any order, through
// [State.UpdateTask] and agree on the result:
//
//	task.assign    in_progress, assigned to the receiver
//	task.update    the update's status (in_progress, ...), with its progress
//	task.complete  completed, with the result (and no error report)
//	task.failed    failed, with the error report (and no result)
//	task.handoff   history only: the new owner is known once it acts
//
// Whatever order the messages are recorded in, the status, result and
// error are those of the newest message by its timestamp (ties: the
// greater message id), a finished status outranking an unfinished one;
// the assigned agent is that of the newest task.assign. The history holds
// every message once, in timestamp order: recording again a message that
// receiver already recorded changes nothing.
//
// Which messages to record is the caller's choice: Record takes env's
// action as it is, so an ack or error envelope repeating a task.* action
// must not be given to it.
func (t *TaskState) Record(env *wire.Envelope, receiver string) {
	// Messages are recorded when acked, which is not the order they were
	// sent in (priorities, redeliveries, several instances; an assignment
	// is acked after its handler has sent the task's updates): the event
	// is placed by the message's own timestamp, and the message sets the
	// task's fields only if no message recorded before it supersedes it.
	ev := protocol.TaskEvent{Timestamp: env.Timestamp, EventType: strings.TrimPrefix(env.Action, "task."), AgentID: env.SenderID,
		Details: map[string]any{"message_id": env.MessageID, "receiver": receiver}}
	if slices.ContainsFunc(t.History, func(o protocol.TaskEvent) bool { return sameEvent(o, ev) }) {
		// A redelivery this agent already recorded (another instance, a
		// lost ack, a consumer reset): the task is as it left it.
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
		t.AssignedAgent = receiver
	}
	t.History = insertEvent(t.History, ev)
}

// Handoff is a message of a task moved from one agent to another: rerouted
// by its receiver, or sent to a fallback while the circuit to its receiver
// was open.
type Handoff struct {
	At        time.Time // when the move happened
	By        string    // the agent that moved the message
	MessageID string
	From, To  string // the agent the message was for, and the one it went to
	Reason    string // e.g. "reroute", "circuit open"
}

// RecordHandoff notes h in t's history and makes h.To the assigned agent
// if h.From was. Like [TaskState.Record] it changes nothing but t.
func (t *TaskState) RecordHandoff(h Handoff) {
	t.History = insertEvent(t.History, protocol.TaskEvent{Timestamp: h.At, EventType: "handoff", AgentID: h.By,
		Details: map[string]any{"from": h.From, "to": h.To, "reason": h.Reason, "message_id": h.MessageID}})
	if t.AssignedAgent == h.From {
		t.AssignedAgent = h.To
	}
}

// eventStatus returns the status a task event recorded by Record sets, and
// false for events that set none.
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
