package agentkit

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"time"

	"github.com/agentmesh-io/agentmesh/agentkit/state"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// The runtime keeps each task's state in the shared state as task.*
// messages flow: the agent that acks one records it, by the rules of
// [state.TaskState.Record]. Reroutes and fallbacks of a message with a
// task id are recorded in the task's history too
// ([state.TaskState.RecordHandoff]). Failures to record are reported to
// the error handler; they never fail the message.

// sharedState opens the state bucket lazily, once.
type sharedState struct {
	mu    sync.Mutex
	state *state.State
}

// State returns the shared state of the agent's mesh (KV mesh_state),
// creating the bucket on first use when the agent provisions. Without
// provisioning ([WithProvisioning](false)) it only binds to the bucket an
// administrator created (e.g. with [state.Open]), and fails with an error
// matching jetstream.ErrBucketNotFound while there is none.
func (a *Agent) State(ctx context.Context) (*state.State, error) {
	a.shared.mu.Lock()
	defer a.shared.mu.Unlock()
	if a.shared.state != nil {
		return a.shared.state, nil
	}
	s, err := state.Open(ctx, a.js, a.opts.scheme, a.opts.replicas, a.opts.provision)
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
	a.recordTask(id, func(t *state.TaskState) { t.Record(env, a.id) })
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

// recordHandoff notes in the task's history that env moved from one agent
// to another.
func (a *Agent) recordHandoff(env *wire.Envelope, from, to, reason string) {
	if env.TaskID == "" {
		return
	}
	h := state.Handoff{At: time.Now().UTC(), By: a.id, MessageID: env.MessageID, From: from, To: to, Reason: reason}
	a.recordTask(env.TaskID, func(t *state.TaskState) { t.RecordHandoff(h) })
}

// recordTask applies fn to the state of task id, reporting a failure to
// the error handler.
func (a *Agent) recordTask(id string, fn func(*state.TaskState)) {
	ctx, cancel := context.WithTimeout(context.Background(), a.opts.publishTimeout)
	defer cancel()
	s, err := a.State(ctx)
	if err == nil {
		_, err = s.UpdateTask(ctx, id, func(t *state.TaskState) error { fn(t); return nil })
	}
	if err != nil {
		a.asyncError(err)
	}
}
