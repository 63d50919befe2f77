package agentkit_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/protocol"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
)

// protoMsg is what a protocol handler saw.
type protoMsg struct {
	priority wire.Priority
	typ      wire.MessageType
	taskID   string
	payload  json.RawMessage
}

func recordProto(ch chan<- protoMsg, m *agentkit.Message) {
	ch <- protoMsg{priority: m.Priority, typ: m.MessageType, taskID: m.TaskID, payload: m.Payload}
}

func recvProto(t *testing.T, ch <-chan protoMsg) protoMsg {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("nothing received within 10s")
	}
	return protoMsg{}
}

func TestProtocol_HandoffEndToEnd(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	got := make(chan protoMsg, 4)
	m.started("executor", map[string]agentkit.HandlerFunc{
		protocol.ActionTaskHandoff: func(ctx context.Context, msg *agentkit.Message) error {
			recordProto(got, msg)
			var req protocol.TaskHandoffRequest
			if err := msg.DecodePayload(&req); err != nil {
				return agentkit.Reject(wire.CodeInvalid, err.Error())
			}
			if err := req.Validate(); err != nil {
				return agentkit.Reject(wire.CodeInvalid, err.Error())
			}
			if req.Reason == protocol.HandoffCapabilityLimit {
				return msg.Reply(ctx, protocol.ActionTaskHandoff, protocol.TaskHandoffResponse{AgentID: "executor", Error: "no capability either"})
			}
			return msg.Reply(ctx, protocol.ActionTaskHandoff, protocol.TaskHandoffResponse{
				Accepted: true, AgentID: "executor", EstimatedCompletion: req.Deadline.Add(-time.Minute),
				Requirements: []string{"read " + req.Context.TaskType}, Constraints: &req.Constraints,
			})
		},
	})
	planner := m.started("planner", nil)
	c := ctx(t)

	deadline := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	req := protocol.TaskHandoffRequest{
		TaskID: "t42", Reason: protocol.HandoffLoadBalancing, Deadline: deadline,
		Context:     protocol.TaskContext{TaskID: "t42", TaskType: "logs", Priority: wire.PriorityHigh},
		Constraints: protocol.TaskConstraints{RequiredCapabilities: []string{"sql"}, MaxTokens: 500},
	}
	resp, err := planner.Handoff(c, "executor", req)
	if err != nil {
		t.Fatal(err)
	}
	if !resp.Accepted || resp.AgentID != "executor" || !resp.EstimatedCompletion.Equal(deadline.Add(-time.Minute)) ||
		!slices.Equal(resp.Requirements, []string{"read logs"}) || resp.Constraints == nil || resp.Constraints.MaxTokens != 500 {
		t.Fatalf("Handoff response = %+v", resp)
	}
	r := recvProto(t, got)
	if r.priority != wire.PriorityHigh || r.typ != wire.TypeRequest || r.taskID != "t42" {
		t.Errorf("handoff sent as %s %s task %q, want high request task t42", r.priority, r.typ, r.taskID)
	}
	var sent protocol.TaskHandoffRequest
	if err := json.Unmarshal(r.payload, &sent); err != nil {
		t.Fatal(err)
	}
	if sent.FromAgent != "planner" || sent.ToAgent != "executor" {
		t.Errorf("from %q to %q, want planner and executor filled in", sent.FromAgent, sent.ToAgent)
	}

	// A declined handoff is an answer, not an error; the priority can be overridden.
	req.Reason = protocol.HandoffCapabilityLimit
	resp, err = planner.Handoff(c, "executor", req, agentkit.WithPriority(wire.PriorityCritical))
	if err != nil {
		t.Fatal(err)
	}
	if resp.Accepted || resp.Error == "" {
		t.Errorf("declined handoff = %+v", resp)
	}
	if r := recvProto(t, got); r.priority != wire.PriorityCritical {
		t.Errorf("priority %s, want the caller's critical", r.priority)
	}

	// An invalid request is refused before anything is sent.
	req.Reason = "BORED"
	if _, err := planner.Handoff(c, "executor", req); !errors.Is(err, wire.ErrInvalidEnvelope) {
		t.Fatalf("Handoff with a bad reason: %v, want ErrInvalidEnvelope", err)
	}
	select {
	case r := <-got:
		t.Fatalf("invalid handoff was sent: %+v", r)
	default:
	}
}

func TestProtocol_HelpEndToEnd(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	got := make(chan protoMsg, 2)
	m.started("expert", map[string]agentkit.HandlerFunc{
		protocol.ActionHelpRequest: func(ctx context.Context, msg *agentkit.Message) error {
			recordProto(got, msg)
			var req protocol.HelpRequest
			if err := msg.DecodePayload(&req); err != nil {
				return agentkit.Reject(wire.CodeInvalid, err.Error())
			}
			return msg.Reply(ctx, protocol.ActionHelpResponse, protocol.HelpResponse{
				ResponderID: "expert", RequestID: msg.MessageID, ResponseType: protocol.ResponseResourceProvision,
				Content:   "see the docs about " + req.Context.CurrentState,
				Resources: []protocol.ResourceReference{{Type: protocol.ReferenceDocumentation, URL: "https://docs.nats.io", Title: "NATS"}},
			})
		},
	})
	asker := m.started("asker", nil)
	resp, err := asker.RequestHelp(ctx(t), "expert", protocol.HelpRequest{
		TaskID: "t7", HelpType: protocol.HelpTechnicalGuidance, Description: "how do I watch a bucket",
		Context: protocol.HelpContext{CurrentState: "kv", AttemptedSolutions: []string{"polling"}}, Urgency: protocol.UrgencyMedium,
	})
	if err != nil {
		t.Fatal(err)
	}
	r := recvProto(t, got)
	if resp.ResponderID != "expert" || resp.ResponseType != protocol.ResponseResourceProvision || resp.Content != "see the docs about kv" ||
		len(resp.Resources) != 1 || resp.Resources[0].URL != "https://docs.nats.io" || resp.RequestID == "" {
		t.Fatalf("help response = %+v", resp)
	}
	if r.priority != wire.PriorityHigh || r.taskID != "t7" {
		t.Errorf("help sent as %s task %q, want high task t7", r.priority, r.taskID)
	}
	var sent protocol.HelpRequest
	if err := json.Unmarshal(r.payload, &sent); err != nil || sent.RequesterID != "asker" {
		t.Errorf("requester %q (%v), want asker filled in", sent.RequesterID, err)
	}
}

type quoteReq struct {
	Item  string  `json:"item"`
	Price float64 `json:"price"`
}

func TestProtocol_Call(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	m.started("shop", map[string]agentkit.HandlerFunc{
		"quote": func(ctx context.Context, msg *agentkit.Message) error {
			var q quoteReq
			if err := msg.DecodePayload(&q); err != nil {
				return agentkit.Reject(wire.CodeInvalid, err.Error())
			}
			if q.Item == "unicorn" {
				return agentkit.Reject(wire.CodeNotFound, "no unicorns")
			}
			return msg.Reply(ctx, "quote", quoteReq{Item: q.Item, Price: 9.5})
		},
		"ping": func(ctx context.Context, msg *agentkit.Message) error { return msg.Reply(ctx, "pong", nil) },
		"garbled": func(ctx context.Context, msg *agentkit.Message) error {
			return msg.Reply(ctx, "garbled", json.RawMessage(`"not an object"`))
		},
	})
	buyer := m.started("buyer", nil)
	c := ctx(t)

	q, err := agentkit.Call[quoteReq](c, buyer, "shop", "quote", quoteReq{Item: "apple"})
	if err != nil {
		t.Fatal(err)
	}
	if q != (quoteReq{Item: "apple", Price: 9.5}) {
		t.Fatalf("Call = %+v", q)
	}
	if p, err := agentkit.Call[*quoteReq](c, buyer, "shop", "quote", &quoteReq{Item: "pear"}); err != nil || p == nil || p.Price != 9.5 {
		t.Fatalf("Call into a pointer = %+v, %v", p, err)
	}

	_, err = agentkit.Call[quoteReq](c, buyer, "shop", "quote", quoteReq{Item: "unicorn"})
	var remote *wire.Error
	if !errors.As(err, &remote) || !wire.IsRemote(err) || remote.Code != wire.CodeNotFound || remote.Message != "no unicorns" {
		t.Fatalf("Call rejected: %v, want the remote NOT_FOUND error", err)
	}

	if empty, err := agentkit.Call[quoteReq](c, buyer, "shop", "ping", nil); err != nil || empty != (quoteReq{}) {
		t.Fatalf("Call with an empty response = %+v, %v", empty, err)
	}
	if _, err := agentkit.Call[quoteReq](c, buyer, "shop", "garbled", nil); !errors.Is(err, wire.ErrInvalidEnvelope) {
		t.Fatalf("Call with an undecodable response: %v, want ErrInvalidEnvelope", err)
	}
	// A request with a Validate method is checked before sending, also behind a pointer.
	if _, err := agentkit.Call[protocol.HelpResponse](c, buyer, "shop", protocol.ActionHelpRequest, &protocol.HelpRequest{}); !errors.Is(err, wire.ErrInvalidEnvelope) {
		t.Fatalf("Call with an invalid request: %v, want ErrInvalidEnvelope", err)
	}
	var nilReq *protocol.HelpRequest
	if _, err := agentkit.Call[quoteReq](c, buyer, "shop", "ping", nilReq); err != nil {
		t.Fatalf("Call with a nil pointer request: %v", err)
	}
}

func TestProtocol_ReportErrorAndStatus(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	got := make(chan protoMsg, 4)
	rec := func(_ context.Context, msg *agentkit.Message) error { recordProto(got, msg); return nil }
	m.started("director", map[string]agentkit.HandlerFunc{protocol.ActionErrorReport: rec, protocol.ActionAgentStatus: rec})
	worker := m.started("worker", nil)
	c := ctx(t)

	env, err := worker.ReportError(c, "director", protocol.ErrorReport{TaskID: "t9", ErrorType: protocol.ErrorTypeNetwork, Severity: protocol.SeverityCritical, Message: "down"})
	if err != nil {
		t.Fatal(err)
	}
	if env.Priority != wire.PriorityCritical || env.MessageType != wire.TypeNotification || env.Action != protocol.ActionErrorReport || env.TaskID != "t9" {
		t.Errorf("error report envelope = %s %s %s task %q", env.Priority, env.MessageType, env.Action, env.TaskID)
	}
	r := recvProto(t, got)
	var rep protocol.ErrorReport
	if err := json.Unmarshal(r.payload, &rep); err != nil {
		t.Fatal(err)
	}
	if r.priority != wire.PriorityCritical || r.typ != wire.TypeNotification || rep.AgentID != "worker" || rep.ErrorID == "" || rep.Message != "down" {
		t.Errorf("received %s %s %+v", r.priority, r.typ, rep)
	}

	if _, err := worker.ReportStatus(c, "director", protocol.StatusUpdate{Status: protocol.AgentStatusInfo{State: protocol.AgentStateBusy, CapabilityLevel: 70}, CurrentTasks: []string{"t9"}}); err != nil {
		t.Fatal(err)
	}
	r = recvProto(t, got)
	var st protocol.StatusUpdate
	if err := json.Unmarshal(r.payload, &st); err != nil {
		t.Fatal(err)
	}
	if r.priority != wire.PriorityNormal || r.typ != wire.TypeNotification || st.AgentID != "worker" || st.Status.State != protocol.AgentStateBusy {
		t.Errorf("received %s %s %+v", r.priority, r.typ, st)
	}

	// Low priority on request; invalid reports are refused before sending.
	if env, err := worker.ReportStatus(c, "director", protocol.StatusUpdate{Status: protocol.AgentStatusInfo{State: protocol.AgentStateIdle}}, agentkit.WithPriority(wire.PriorityLow)); err != nil || env.Priority != wire.PriorityLow {
		t.Fatalf("ReportStatus at low priority: %v", err)
	}
	recvProto(t, got)
	if _, err := worker.ReportStatus(c, "director", protocol.StatusUpdate{}); !errors.Is(err, wire.ErrInvalidEnvelope) {
		t.Errorf("ReportStatus without a state: %v, want ErrInvalidEnvelope", err)
	}
	if _, err := worker.ReportError(c, "director", protocol.ErrorReport{ErrorType: protocol.ErrorTypeNetwork, Severity: "fatal", Message: "x"}); !errors.Is(err, wire.ErrInvalidEnvelope) {
		t.Errorf("ReportError with a bad severity: %v, want ErrInvalidEnvelope", err)
	}
}
