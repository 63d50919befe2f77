package agentkit

import (
	"context"
	"fmt"
	"reflect"

	"github.com/agentmesh-io/agentmesh/agentkit/protocol"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
)

// The protocol enums below are open on the wire: unknown values decode, and
// each payload's Validate method rejects them.

// payloadValidator is a payload that can check itself.
type payloadValidator interface{ Validate() error }

// Call sends req to agent to as a request for action and decodes the
// response's payload into a Resp. If req has a Validate method it is called
// first and nothing is sent when it fails. Errors are those of
// [Agent.Request]: an error reply from the receiver is an [*wire.Error]
// ([wire.IsRemote] is true), no reply in time is [ErrTimeout]. An empty response
// payload leaves Resp at its zero value; one that does not decode into Resp
// is an error matching [wire.ErrInvalidEnvelope].
func Call[Resp any](ctx context.Context, a *Agent, to, action string, req any, opts ...SendOption) (Resp, error) {
	var resp Resp
	if v, ok := req.(payloadValidator); ok && !isNilPointer(req) {
		if err := v.Validate(); err != nil {
			return resp, fmt.Errorf("agentkit: %s to %s: %w", action, to, err)
		}
	}
	r, err := a.Request(ctx, to, action, req, opts...)
	if err != nil {
		return resp, err
	}
	if len(r.Payload) == 0 || string(r.Payload) == "null" {
		return resp, nil
	}
	if err := r.DecodePayload(&resp); err != nil {
		return resp, fmt.Errorf("agentkit: %s to %s: response: %w", action, to, err)
	}
	return resp, nil
}

// isNilPointer reports whether v is a nil pointer, whose value methods
// cannot be called.
func isNilPointer(v any) bool {
	rv := reflect.ValueOf(v)
	return rv.Kind() == reflect.Pointer && rv.IsNil()
}

// Handoff asks agent to to take over a task and returns its answer, which
// may decline (Accepted false); see [Call] for the errors. An empty
// FromAgent is set to this agent and an empty ToAgent to to; the request
// must then pass [protocol.TaskHandoffRequest.Validate]. It is sent at
// [wire.PriorityHigh] (the protocol's routing priority) with task_id set; opts may
// override both.
func (a *Agent) Handoff(ctx context.Context, to string, req protocol.TaskHandoffRequest, opts ...SendOption) (*protocol.TaskHandoffResponse, error) {
	if req.FromAgent == "" {
		req.FromAgent = a.ID()
	}
	if req.ToAgent == "" {
		req.ToAgent = to
	}
	opts = append([]SendOption{WithPriority(wire.PriorityHigh), WithTaskID(req.TaskID)}, opts...)
	resp, err := Call[protocol.TaskHandoffResponse](ctx, a, to, protocol.ActionTaskHandoff, req, opts...)
	if err != nil {
		return nil, err
	}
	return &resp, nil
}

// RequestHelp asks agent to for help and returns its answer; see [Call] for
// the errors. An empty RequesterID is set to this agent; the request must
// then pass [protocol.HelpRequest.Validate]. It is sent at
// [wire.PriorityHigh] with task_id set when the request names a task; opts
// may override both.
func (a *Agent) RequestHelp(ctx context.Context, to string, req protocol.HelpRequest, opts ...SendOption) (*protocol.HelpResponse, error) {
	if req.RequesterID == "" {
		req.RequesterID = a.ID()
	}
	defaults := []SendOption{WithPriority(wire.PriorityHigh)}
	if req.TaskID != "" {
		defaults = append(defaults, WithTaskID(req.TaskID))
	}
	resp, err := Call[protocol.HelpResponse](ctx, a, to, protocol.ActionHelpRequest, req, append(defaults, opts...)...)
	if err != nil {
		return nil, err
	}
	return &resp, nil
}

// ReportError sends r to agent to (typically a director) as a notification
// at [wire.PriorityCritical] (the protocol's routing priority) and returns once
// the stream has stored it. An empty AgentID is set to this agent and an
// empty ErrorID to a new UUID; the report must then pass
// [protocol.ErrorReport.Validate]. task_id is set when the report names a
// task. opts may override the priority.
func (a *Agent) ReportError(ctx context.Context, to string, r protocol.ErrorReport, opts ...SendOption) (*wire.Envelope, error) {
	if r.AgentID == "" {
		r.AgentID = a.ID()
	}
	if r.ErrorID == "" {
		r.ErrorID = wire.NewMessageID()
	}
	if err := r.Validate(); err != nil {
		return nil, fmt.Errorf("agentkit: %s to %s: %w", protocol.ActionErrorReport, to, err)
	}
	defaults := []SendOption{WithPriority(wire.PriorityCritical), WithMessageType(wire.TypeNotification)}
	if r.TaskID != "" {
		defaults = append(defaults, WithTaskID(r.TaskID))
	}
	return a.Send(ctx, to, protocol.ActionErrorReport, r, append(defaults, opts...)...)
}

// ReportStatus sends s to agent to as a notification at
// [wire.PriorityNormal] and returns once the stream has stored it. An empty
// AgentID is set to this agent; the update must then pass
// [protocol.StatusUpdate.Validate]. opts may override the priority.
func (a *Agent) ReportStatus(ctx context.Context, to string, s protocol.StatusUpdate, opts ...SendOption) (*wire.Envelope, error) {
	if s.AgentID == "" {
		s.AgentID = a.ID()
	}
	if err := s.Validate(); err != nil {
		return nil, fmt.Errorf("agentkit: %s to %s: %w", protocol.ActionAgentStatus, to, err)
	}
	defaults := []SendOption{WithPriority(wire.PriorityNormal), WithMessageType(wire.TypeNotification)}
	return a.Send(ctx, to, protocol.ActionAgentStatus, s, append(defaults, opts...)...)
}
