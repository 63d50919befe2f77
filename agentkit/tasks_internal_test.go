package agentkit

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/agentmesh-io/agentmesh/agentkit/protocol"
	"github.com/agentmesh-io/agentmesh/agentkit/state"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/internal/natstest"
)

// An ack or error envelope repeats the action of the message it answers:
// the agent that handles one records nothing, so the sender of a
// task.assign does not become its assignee when the assignee's ack comes
// back.
func TestTrackTask_AnswersAreNotTheAction(t *testing.T) {
	s := natstest.RunServer(t)
	a, err := New(natstest.Connect(t, s), "orch", WithRegistration(false))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Stop)
	assign := wire.NewEnvelope(wire.TypeRequest, "orch", protocol.ActionTaskAssign)
	assign.ReceiverID, assign.TaskID = "exec", "t1"
	assign.Payload = json.RawMessage(`{"task_id":"t1","task_type":"db"}`)
	ack := assign.NewAck("exec", nil, time.Millisecond)
	a.trackTask(ack)
	a.trackTask(assign.NewErrorReply("exec", wire.NewError(wire.CodeInternal, "boom")))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	shared, err := a.State(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ts, err := shared.Task(ctx, "t1"); !errors.Is(err, state.ErrNotFound) {
		t.Fatalf("after an ack and an error reply: task %+v, %v; want none", ts, err)
	}
}
