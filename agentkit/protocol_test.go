package agentkit_test

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/agentmesh-io/agentmesh/agentkit"
)

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("marshal %T: %v", v, err)
	}
	return b
}

// checkKeys fails unless the JSON object b has exactly the given keys.
func checkKeys(t *testing.T, b []byte, want ...string) {
	t.Helper()
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(b, &obj); err != nil {
		t.Fatalf("not a JSON object: %s: %v", b, err)
	}
	got := slices.Sorted(maps.Keys(obj))
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("keys of %s\n got %v\nwant %v", b, got, want)
	}
}

// subObject returns the member key of the JSON object b (the first element
// if it is an array).
func subObject(t *testing.T, b []byte, key string) []byte {
	t.Helper()
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(b, &obj); err != nil {
		t.Fatalf("not a JSON object: %s: %v", b, err)
	}
	v, ok := obj[key]
	if !ok {
		t.Fatalf("no %q in %s", key, b)
	}
	var arr []json.RawMessage
	if json.Unmarshal(v, &arr) == nil {
		if len(arr) == 0 {
			t.Fatalf("%q is empty in %s", key, b)
		}
		return arr[0]
	}
	return v
}

var (
	fixtureAt          = time.Date(2026, 1, 10, 14, 30, 0, 0, time.UTC)
	fixtureLater       = fixtureAt.Add(time.Hour)
	fixtureTaskCtx     = agentkit.TaskContext{TaskID: "t1", TaskType: "analysis", Priority: agentkit.PriorityHigh, Metadata: map[string]any{"k": "v"}, Dependencies: []string{"t0"}, History: []agentkit.TaskEvent{{Timestamp: fixtureAt, EventType: "created", AgentID: "a", Details: map[string]any{"x": "y"}}}}
	fixtureConstraints = agentkit.TaskConstraints{MaxTokens: 1000, Deadline: &fixtureLater, RequiredCapabilities: []string{"sql"}, BudgetUSD: 2.5, QualityThreshold: 0.9}
	fixtureReport      = agentkit.ErrorReport{ErrorID: "e1", AgentID: "a", TaskID: "t1", ErrorType: agentkit.ErrorTypeTimeout, Severity: agentkit.SeverityHigh, Message: "slow",
		StackTrace: "main.go:1", Context: map[string]any{"input_data": "x", "configuration": "y", "environment": "z"},
		RecoveryAttempts: []agentkit.RecoveryAttempt{{AttemptNumber: 1, Timestamp: fixtureAt, Strategy: "retry", Outcome: agentkit.RecoveryFailure, Details: "again"}},
		SuggestedActions: []string{"raise timeout"}}
)

// The seed 002 field names of the nested types.
var (
	fixtureTaskContextKeys = []string{"task_id", "task_type", "priority", "metadata", "dependencies", "history"}
	fixtureTaskEventKeys   = []string{"timestamp", "event_type", "agent_id", "details"}
	fixtureConstraintsKeys = []string{"max_tokens", "deadline", "required_capabilities", "budget_usd", "quality_threshold"}
	fixtureRecoveryKeys    = []string{"attempt_number", "timestamp", "strategy", "outcome", "details"}
)

func TestProtocol_JSONFieldNames(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name   string
		give   any
		keys   []string
		nested map[string][]string // member → its keys (first element of arrays)
	}{
		{
			name: "TaskAssignment",
			give: agentkit.TaskAssignment{TaskID: "t1", TaskType: "analysis", Description: "d", Context: &fixtureTaskCtx, Constraints: &fixtureConstraints, Deadline: &fixtureLater},
			keys: []string{"task_id", "task_type", "description", "context", "constraints", "deadline"},
		},
		{
			name:   "TaskHandoffRequest",
			give:   agentkit.TaskHandoffRequest{TaskID: "t1", FromAgent: "a", ToAgent: "b", Reason: agentkit.HandoffRateLimit, Context: fixtureTaskCtx, Constraints: fixtureConstraints, Deadline: fixtureLater},
			keys:   []string{"task_id", "from_agent", "to_agent", "reason", "context", "constraints", "deadline"},
			nested: map[string][]string{"context": fixtureTaskContextKeys, "constraints": fixtureConstraintsKeys},
		},
		{
			name:   "TaskHandoffResponse",
			give:   agentkit.TaskHandoffResponse{Accepted: true, AgentID: "b", EstimatedCompletion: fixtureLater, Requirements: []string{"logs"}, Constraints: &fixtureConstraints, Error: "e"},
			keys:   []string{"accepted", "agent_id", "estimated_completion", "requirements", "constraints", "error"},
			nested: map[string][]string{"constraints": fixtureConstraintsKeys},
		},
		{
			name: "TaskUpdate",
			give: agentkit.TaskUpdate{TaskID: "t1", Status: agentkit.TaskInProgress, Progress: 0.5, Message: "half", Details: map[string]any{"rows": "10"}},
			keys: []string{"task_id", "status", "progress", "message", "details"},
		},
		{
			name: "TaskComplete",
			give: agentkit.TaskComplete{TaskID: "t1", Result: json.RawMessage(`{"ok":true}`)},
			keys: []string{"task_id", "result"},
		},
		{
			name:   "TaskFailure",
			give:   agentkit.TaskFailure{TaskID: "t1", Error: fixtureReport},
			keys:   []string{"task_id", "error"},
			nested: map[string][]string{"error": {"error_id", "agent_id", "task_id", "error_type", "severity", "message", "stack_trace", "context", "recovery_attempts", "suggested_actions"}},
		},
		{
			name: "HelpRequest",
			give: agentkit.HelpRequest{RequesterID: "a", TaskID: "t1", HelpType: agentkit.HelpCodeReview, Description: "d",
				Context: agentkit.HelpContext{CurrentState: "stuck", ErrorDetails: "e", AttemptedSolutions: []string{"x"}}, Urgency: agentkit.UrgencyHigh, Deadline: &fixtureLater},
			keys:   []string{"requester_id", "task_id", "help_type", "description", "context", "urgency", "deadline"},
			nested: map[string][]string{"context": {"current_state", "error_details", "attempted_solutions"}},
		},
		{
			name: "HelpResponse",
			give: agentkit.HelpResponse{ResponderID: "b", RequestID: "m1", ResponseType: agentkit.ResponseDirectAnswer, Content: "c",
				Resources: []agentkit.ResourceReference{{Type: agentkit.ReferenceDocumentation, URL: "https://x", Title: "t", Description: "d"}}, FollowUpRequired: true, EstimatedEffortMinutes: 15},
			keys:   []string{"responder_id", "request_id", "response_type", "content", "resources", "follow_up_required", "estimated_effort"},
			nested: map[string][]string{"resources": {"type", "url", "title", "description"}},
		},
		{
			name: "StatusUpdate",
			give: agentkit.StatusUpdate{AgentID: "a",
				Status:        agentkit.AgentStatusInfo{State: agentkit.AgentStateBusy, CapabilityLevel: 80, ErrorRate: 0.1, AvgResponseTimeMS: 12.5, LastHeartbeat: fixtureAt},
				CurrentTasks:  []string{"t1"},
				ResourceUsage: agentkit.ResourceUsage{TokensUsed: 10, TokensRemaining: 90, CostUSD: 0.2, CPUUsage: 50, MemoryUsage: 40},
				HealthMetrics: agentkit.HealthMetrics{UptimeSeconds: 60, SuccessRate: 0.99, AvgLatencyMS: 3, ErrorCount: 1, LastError: &fixtureAt},
				NextAvailable: &fixtureLater},
			keys: []string{"agent_id", "status", "current_tasks", "resource_usage", "health_metrics", "next_available"},
			nested: map[string][]string{
				"status":         {"state", "capability_level", "error_rate", "avg_response_time_ms", "last_heartbeat"},
				"resource_usage": {"tokens_used", "tokens_remaining", "cost_usd", "cpu_usage", "memory_usage"},
				"health_metrics": {"uptime_seconds", "success_rate", "avg_latency_ms", "error_count", "last_error"},
			},
		},
		{
			name:   "ErrorReport",
			give:   fixtureReport,
			keys:   []string{"error_id", "agent_id", "task_id", "error_type", "severity", "message", "stack_trace", "context", "recovery_attempts", "suggested_actions"},
			nested: map[string][]string{"context": {"input_data", "configuration", "environment"}, "recovery_attempts": fixtureRecoveryKeys},
		},
		{
			name: "Escalation",
			give: agentkit.Escalation{Reason: "max_deliveries", MessageID: "m1", Sender: "a", Receiver: "b", Consumer: "b_high", Priority: "high",
				Subject: "mesh.agent.b.high.a", StreamSeq: 3, Attempts: 4, Naks: 1, Timeouts: 3, Reasons: []string{"delivery 1: NAK"},
				CorrelationID: "c", WorkflowID: "w", InReplyTo: "m0", Original: json.RawMessage(`{"acl":"1"}`), DLQSubject: "mesh.dlq.b.high.a",
				DLQSeq: 7, SentAt: fixtureAt, FailedAt: fixtureLater},
			keys: []string{"reason", "message_id", "sender", "receiver", "consumer", "priority", "subject", "stream_seq", "attempts", "naks", "timeouts",
				"reasons", "correlation_id", "workflow_id", "in_reply_to", "original", "dlq_subject", "dlq_seq", "sent_at", "failed_at"},
		},
		{
			name: "TaskState",
			give: agentkit.TaskState{ID: "t1", Status: agentkit.TaskFailed, AssignedAgent: "a", CreatedAt: fixtureAt, UpdatedAt: fixtureLater, Context: &fixtureTaskCtx,
				Result: json.RawMessage(`1`), Error: &fixtureReport, History: fixtureTaskCtx.History},
			keys:   []string{"id", "status", "assigned_agent", "created_at", "updated_at", "context", "result", "error", "history"},
			nested: map[string][]string{"context": fixtureTaskContextKeys, "history": fixtureTaskEventKeys},
		},
		{
			name: "ResourceAllocation",
			give: agentkit.ResourceAllocation{AgentID: "a", ResourceType: "tokens", Allocated: 10, Consumed: 5, Limit: 20, ExpiresAt: &fixtureLater},
			keys: []string{"agent_id", "resource_type", "allocated", "consumed", "limit", "expires_at"},
		},
		{
			name: "PolicyState",
			give: agentkit.PolicyState{Version: "1", EnabledChains: []string{"c"}},
			keys: []string{"version", "enabled_chains", "risk_thresholds", "budget_limits", "circuit_breaker_config"},
			nested: map[string][]string{
				"risk_thresholds":        {"low", "high"},
				"budget_limits":          {"per_task", "per_agent", "total"},
				"circuit_breaker_config": {"error_threshold", "timeout_ms", "reset_timeout_ms"},
			},
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b := mustJSON(t, tt.give)
			checkKeys(t, b, tt.keys...)
			for member, keys := range tt.nested {
				checkKeys(t, subObject(t, b, member), keys...)
			}
			// Round trip: decoding and encoding again gives the same JSON.
			back := reflect.New(reflect.TypeOf(tt.give))
			if err := json.Unmarshal(b, back.Interface()); err != nil {
				t.Fatal(err)
			}
			if again := mustJSON(t, back.Elem().Interface()); string(again) != string(b) {
				t.Errorf("round trip changed the JSON\n got %s\nwant %s", again, b)
			}
			if v, ok := tt.give.(interface{ Validate() error }); ok {
				if err := v.Validate(); err != nil {
					t.Errorf("Validate of a complete %s: %v", tt.name, err)
				}
			}
		})
	}
}

func TestProtocol_JSONOptionalFieldsOmitted(t *testing.T) {
	t.Parallel()
	checkKeys(t, mustJSON(t, agentkit.TaskHandoffRequest{TaskID: "t1"}),
		"task_id", "from_agent", "to_agent", "reason", "context", "constraints")
	checkKeys(t, mustJSON(t, agentkit.TaskContext{}), "task_id", "task_type", "metadata", "dependencies", "history")
	checkKeys(t, mustJSON(t, agentkit.HelpResponse{}), "responder_id", "request_id", "response_type", "content", "follow_up_required", "estimated_effort")
	checkKeys(t, mustJSON(t, agentkit.TaskHandoffResponse{}), "accepted", "agent_id", "requirements")
	// Priority accepts seed 004's "medium" as normal.
	var c agentkit.TaskContext
	if err := json.Unmarshal([]byte(`{"priority":"medium"}`), &c); err != nil || c.Priority != agentkit.PriorityNormal {
		t.Errorf("priority medium = %q, %v", c.Priority, err)
	}
}

func TestProtocol_EnumsValid(t *testing.T) {
	t.Parallel()
	check := func(name string, valid []bool, wire []string, want []string) {
		t.Helper()
		if !slices.Equal(wire, want) {
			t.Errorf("%s = %v, want seed 002's %v", name, wire, want)
		}
		for i, ok := range valid {
			if !ok {
				t.Errorf("%s %s not Valid", name, wire[i])
			}
		}
	}
	strs := func(vs ...string) []string { return vs }
	validAll := func(n int, f func(int) bool) []bool {
		out := make([]bool, n)
		for i := range out {
			out[i] = f(i)
		}
		return out
	}
	toStrings := func(v any) []string {
		rv := reflect.ValueOf(v)
		out := make([]string, rv.Len())
		for i := range out {
			out[i] = rv.Index(i).String()
		}
		return out
	}
	check("HandoffReasons", validAll(len(agentkit.HandoffReasons), func(i int) bool { return agentkit.HandoffReasons[i].Valid() }),
		toStrings(agentkit.HandoffReasons), strs("CAPABILITY_LIMIT", "RATE_LIMIT", "ERROR_RECOVERY", "ESCALATION", "LOAD_BALANCING"))
	check("HelpTypes", validAll(len(agentkit.HelpTypes), func(i int) bool { return agentkit.HelpTypes[i].Valid() }),
		toStrings(agentkit.HelpTypes), strs("TECHNICAL_GUIDANCE", "DEBUGGING_ASSISTANCE", "CODE_REVIEW", "ARCHITECTURE_ADVICE", "RESOURCE_SHARING"))
	check("HelpResponseTypes", validAll(len(agentkit.HelpResponseTypes), func(i int) bool { return agentkit.HelpResponseTypes[i].Valid() }),
		toStrings(agentkit.HelpResponseTypes), strs("DIRECT_ANSWER", "RESOURCE_PROVISION", "COLLABORATIVE_SESSION", "ESCALATION", "UNABLE_TO_HELP"))
	check("Urgencies", validAll(len(agentkit.Urgencies), func(i int) bool { return agentkit.Urgencies[i].Valid() }),
		toStrings(agentkit.Urgencies), strs("low", "medium", "high", "critical"))
	check("Severities", validAll(len(agentkit.Severities), func(i int) bool { return agentkit.Severities[i].Valid() }),
		toStrings(agentkit.Severities), strs("low", "medium", "high", "critical"))
	check("AgentStates", validAll(len(agentkit.AgentStates), func(i int) bool { return agentkit.AgentStates[i].Valid() }),
		toStrings(agentkit.AgentStates), strs("IDLE", "BUSY", "ERROR", "OFFLINE", "MAINTENANCE"))
	check("ErrorTypes", validAll(len(agentkit.ErrorTypes), func(i int) bool { return agentkit.ErrorTypes[i].Valid() }),
		toStrings(agentkit.ErrorTypes), strs("TIMEOUT", "RATE_LIMIT", "VALIDATION_ERROR", "NETWORK_ERROR", "AUTHENTICATION_ERROR", "RESOURCE_EXHAUSTED", "INTERNAL_ERROR", "EXTERNAL_SERVICE_ERROR"))
	check("ReferenceTypes", validAll(len(agentkit.ReferenceTypes), func(i int) bool { return agentkit.ReferenceTypes[i].Valid() }),
		toStrings(agentkit.ReferenceTypes), strs("documentation", "code", "api", "example", "tool"))
	check("TaskStatuses", validAll(len(agentkit.TaskStatuses), func(i int) bool { return agentkit.TaskStatuses[i].Valid() }),
		toStrings(agentkit.TaskStatuses), strs("pending", "in_progress", "completed", "failed", "cancelled"))
	check("EntityKinds", validAll(len(agentkit.EntityKinds), func(i int) bool { return agentkit.EntityKinds[i].Valid() }),
		toStrings(agentkit.EntityKinds), strs("TASK", "AGENT", "RESOURCE", "POLICY"))

	for name, v := range map[string]interface{ Valid() bool }{
		"reason":   agentkit.HandoffReason("capability_limit"),
		"help":     agentkit.HelpType(""),
		"response": agentkit.HelpResponseType("ANSWER"),
		"urgency":  agentkit.Urgency("normal"),
		"severity": agentkit.Severity("CRITICAL"),
		"state":    agentkit.AgentState("READY"),
		"error":    agentkit.ErrorType("TIMEOUT_ERROR"),
		"ref":      agentkit.ReferenceType("doc"),
	} {
		if v.Valid() {
			t.Errorf("%s %v is Valid", name, v)
		}
	}
}

func TestProtocol_Validate(t *testing.T) {
	t.Parallel()
	handoff := agentkit.TaskHandoffRequest{TaskID: "t1", FromAgent: "a", ToAgent: "b", Reason: agentkit.HandoffLoadBalancing}
	help := agentkit.HelpRequest{RequesterID: "a", HelpType: agentkit.HelpDebuggingAssistance, Description: "d", Urgency: agentkit.UrgencyLow}
	status := agentkit.StatusUpdate{AgentID: "a", Status: agentkit.AgentStatusInfo{State: agentkit.AgentStateIdle}}
	for _, tt := range []struct {
		name      string
		give      interface{ Validate() error }
		wantField string // "" means valid
	}{
		{"handoff ok", handoff, ""},
		{"handoff no task", func() agentkit.TaskHandoffRequest { r := handoff; r.TaskID = ""; return r }(), "payload.task_id"},
		{"handoff no from", func() agentkit.TaskHandoffRequest { r := handoff; r.FromAgent = ""; return r }(), "payload.from_agent"},
		{"handoff no to", func() agentkit.TaskHandoffRequest { r := handoff; r.ToAgent = ""; return r }(), "payload.to_agent"},
		{"handoff reason", func() agentkit.TaskHandoffRequest { r := handoff; r.Reason = "BORED"; return r }(), "payload.reason"},
		{"handoff priority", func() agentkit.TaskHandoffRequest { r := handoff; r.Context.Priority = "urgent"; return r }(), "payload.context.priority"},
		{"handoff quality", func() agentkit.TaskHandoffRequest { r := handoff; r.Constraints.QualityThreshold = 2; return r }(), "payload.constraints.quality_threshold"},
		{"handoff response accepted anonymously", agentkit.TaskHandoffResponse{Accepted: true}, "payload.agent_id"},
		{"handoff response declined", agentkit.TaskHandoffResponse{Error: "busy"}, ""},
		{"assignment ok", agentkit.TaskAssignment{TaskID: "t1", TaskType: "x"}, ""},
		{"assignment no type", agentkit.TaskAssignment{TaskID: "t1"}, "payload.task_type"},
		{"assignment budget", agentkit.TaskAssignment{TaskID: "t1", TaskType: "x", Constraints: &agentkit.TaskConstraints{BudgetUSD: -1}}, "payload.constraints.budget_usd"},
		{"update ok", agentkit.TaskUpdate{TaskID: "t1", Status: agentkit.TaskInProgress, Progress: 1}, ""},
		{"update status", agentkit.TaskUpdate{TaskID: "t1", Status: "running"}, "payload.status"},
		{"update progress", agentkit.TaskUpdate{TaskID: "t1", Status: agentkit.TaskInProgress, Progress: 1.5}, "payload.progress"},
		{"complete no task", agentkit.TaskComplete{}, "payload.task_id"},
		{"failure report", agentkit.TaskFailure{TaskID: "t1", Error: agentkit.ErrorReport{ErrorID: "e"}}, "payload.error.agent_id"},
		{"help ok", help, ""},
		{"help type", func() agentkit.HelpRequest { r := help; r.HelpType = "ADVICE"; return r }(), "payload.help_type"},
		{"help urgency", func() agentkit.HelpRequest { r := help; r.Urgency = "normal"; return r }(), "payload.urgency"},
		{"help description", func() agentkit.HelpRequest { r := help; r.Description = ""; return r }(), "payload.description"},
		{"help response type", agentkit.HelpResponse{ResponderID: "b", ResponseType: "YES"}, "payload.response_type"},
		{"help response resource", agentkit.HelpResponse{ResponderID: "b", ResponseType: agentkit.ResponseResourceProvision, Resources: []agentkit.ResourceReference{{Type: "book"}}}, "payload.resources[0].type"},
		{"status ok", status, ""},
		{"status state", func() agentkit.StatusUpdate { s := status; s.Status.State = "READY"; return s }(), "payload.status.state"},
		{"status capability", func() agentkit.StatusUpdate { s := status; s.Status.CapabilityLevel = 101; return s }(), "payload.status.capability_level"},
		{"status error rate", func() agentkit.StatusUpdate { s := status; s.Status.ErrorRate = -0.1; return s }(), "payload.status.error_rate"},
		{"status cpu", func() agentkit.StatusUpdate { s := status; s.ResourceUsage.CPUUsage = 120; return s }(), "payload.resource_usage.cpu_usage"},
		{"report ok", fixtureReport, ""},
		{"report type", func() agentkit.ErrorReport { r := fixtureReport; r.ErrorType = "OOPS"; return r }(), "payload.error_type"},
		{"report severity", func() agentkit.ErrorReport { r := fixtureReport; r.Severity = "fatal"; return r }(), "payload.severity"},
		{"report outcome", func() agentkit.ErrorReport {
			r := fixtureReport
			r.RecoveryAttempts = []agentkit.RecoveryAttempt{{Outcome: "meh"}}
			return r
		}(), "payload.recovery_attempts[0].outcome"},
		{"escalation no id", agentkit.Escalation{Reason: "terminated"}, "payload.message_id"},
		{"escalation reason", agentkit.Escalation{MessageID: "m1", Reason: "bored"}, "payload.reason"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.give.Validate()
			if tt.wantField == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			var ve *agentkit.ValidationError
			if !errors.Is(err, agentkit.ErrInvalidEnvelope) || !errors.As(err, &ve) || ve.Field != tt.wantField {
				t.Fatalf("Validate: %v, want a ValidationError on %s", err, tt.wantField)
			}
		})
	}
}

// protoMsg is what a protocol handler saw.
type protoMsg struct {
	priority agentkit.Priority
	typ      agentkit.MessageType
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
		agentkit.ActionTaskHandoff: func(ctx context.Context, msg *agentkit.Message) error {
			recordProto(got, msg)
			var req agentkit.TaskHandoffRequest
			if err := msg.DecodePayload(&req); err != nil {
				return agentkit.Reject(agentkit.CodeInvalid, err.Error())
			}
			if err := req.Validate(); err != nil {
				return agentkit.Reject(agentkit.CodeInvalid, err.Error())
			}
			if req.Reason == agentkit.HandoffCapabilityLimit {
				return msg.Reply(ctx, agentkit.ActionTaskHandoff, agentkit.TaskHandoffResponse{AgentID: "executor", Error: "no capability either"})
			}
			return msg.Reply(ctx, agentkit.ActionTaskHandoff, agentkit.TaskHandoffResponse{
				Accepted: true, AgentID: "executor", EstimatedCompletion: req.Deadline.Add(-time.Minute),
				Requirements: []string{"read " + req.Context.TaskType}, Constraints: &req.Constraints,
			})
		},
	})
	planner := m.started("planner", nil)
	c := ctx(t)

	deadline := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	req := agentkit.TaskHandoffRequest{
		TaskID: "t42", Reason: agentkit.HandoffLoadBalancing, Deadline: deadline,
		Context:     agentkit.TaskContext{TaskID: "t42", TaskType: "logs", Priority: agentkit.PriorityHigh},
		Constraints: agentkit.TaskConstraints{RequiredCapabilities: []string{"sql"}, MaxTokens: 500},
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
	if r.priority != agentkit.PriorityHigh || r.typ != agentkit.TypeRequest || r.taskID != "t42" {
		t.Errorf("handoff sent as %s %s task %q, want high request task t42", r.priority, r.typ, r.taskID)
	}
	var sent agentkit.TaskHandoffRequest
	if err := json.Unmarshal(r.payload, &sent); err != nil {
		t.Fatal(err)
	}
	if sent.FromAgent != "planner" || sent.ToAgent != "executor" {
		t.Errorf("from %q to %q, want planner and executor filled in", sent.FromAgent, sent.ToAgent)
	}

	// A declined handoff is an answer, not an error; the priority can be overridden.
	req.Reason = agentkit.HandoffCapabilityLimit
	resp, err = planner.Handoff(c, "executor", req, agentkit.WithPriority(agentkit.PriorityCritical))
	if err != nil {
		t.Fatal(err)
	}
	if resp.Accepted || resp.Error == "" {
		t.Errorf("declined handoff = %+v", resp)
	}
	if r := recvProto(t, got); r.priority != agentkit.PriorityCritical {
		t.Errorf("priority %s, want the caller's critical", r.priority)
	}

	// An invalid request is refused before anything is sent.
	req.Reason = "BORED"
	if _, err := planner.Handoff(c, "executor", req); !errors.Is(err, agentkit.ErrInvalidEnvelope) {
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
		agentkit.ActionHelpRequest: func(ctx context.Context, msg *agentkit.Message) error {
			recordProto(got, msg)
			var req agentkit.HelpRequest
			if err := msg.DecodePayload(&req); err != nil {
				return agentkit.Reject(agentkit.CodeInvalid, err.Error())
			}
			return msg.Reply(ctx, agentkit.ActionHelpResponse, agentkit.HelpResponse{
				ResponderID: "expert", RequestID: msg.MessageID, ResponseType: agentkit.ResponseResourceProvision,
				Content:   "see the docs about " + req.Context.CurrentState,
				Resources: []agentkit.ResourceReference{{Type: agentkit.ReferenceDocumentation, URL: "https://docs.nats.io", Title: "NATS"}},
			})
		},
	})
	asker := m.started("asker", nil)
	resp, err := asker.RequestHelp(ctx(t), "expert", agentkit.HelpRequest{
		TaskID: "t7", HelpType: agentkit.HelpTechnicalGuidance, Description: "how do I watch a bucket",
		Context: agentkit.HelpContext{CurrentState: "kv", AttemptedSolutions: []string{"polling"}}, Urgency: agentkit.UrgencyMedium,
	})
	if err != nil {
		t.Fatal(err)
	}
	r := recvProto(t, got)
	if resp.ResponderID != "expert" || resp.ResponseType != agentkit.ResponseResourceProvision || resp.Content != "see the docs about kv" ||
		len(resp.Resources) != 1 || resp.Resources[0].URL != "https://docs.nats.io" || resp.RequestID == "" {
		t.Fatalf("help response = %+v", resp)
	}
	if r.priority != agentkit.PriorityHigh || r.taskID != "t7" {
		t.Errorf("help sent as %s task %q, want high task t7", r.priority, r.taskID)
	}
	var sent agentkit.HelpRequest
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
				return agentkit.Reject(agentkit.CodeInvalid, err.Error())
			}
			if q.Item == "unicorn" {
				return agentkit.Reject(agentkit.CodeNotFound, "no unicorns")
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
	var remote *agentkit.Error
	if !errors.As(err, &remote) || !agentkit.IsRemote(err) || remote.Code != agentkit.CodeNotFound || remote.Message != "no unicorns" {
		t.Fatalf("Call rejected: %v, want the remote NOT_FOUND error", err)
	}

	if empty, err := agentkit.Call[quoteReq](c, buyer, "shop", "ping", nil); err != nil || empty != (quoteReq{}) {
		t.Fatalf("Call with an empty response = %+v, %v", empty, err)
	}
	if _, err := agentkit.Call[quoteReq](c, buyer, "shop", "garbled", nil); !errors.Is(err, agentkit.ErrInvalidEnvelope) {
		t.Fatalf("Call with an undecodable response: %v, want ErrInvalidEnvelope", err)
	}
	// A request with a Validate method is checked before sending, also behind a pointer.
	if _, err := agentkit.Call[agentkit.HelpResponse](c, buyer, "shop", agentkit.ActionHelpRequest, &agentkit.HelpRequest{}); !errors.Is(err, agentkit.ErrInvalidEnvelope) {
		t.Fatalf("Call with an invalid request: %v, want ErrInvalidEnvelope", err)
	}
	var nilReq *agentkit.HelpRequest
	if _, err := agentkit.Call[quoteReq](c, buyer, "shop", "ping", nilReq); err != nil {
		t.Fatalf("Call with a nil pointer request: %v", err)
	}
}

func TestProtocol_ReportErrorAndStatus(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	got := make(chan protoMsg, 4)
	rec := func(_ context.Context, msg *agentkit.Message) error { recordProto(got, msg); return nil }
	m.started("director", map[string]agentkit.HandlerFunc{agentkit.ActionErrorReport: rec, agentkit.ActionAgentStatus: rec})
	worker := m.started("worker", nil)
	c := ctx(t)

	env, err := worker.ReportError(c, "director", agentkit.ErrorReport{TaskID: "t9", ErrorType: agentkit.ErrorTypeNetwork, Severity: agentkit.SeverityCritical, Message: "down"})
	if err != nil {
		t.Fatal(err)
	}
	if env.Priority != agentkit.PriorityCritical || env.MessageType != agentkit.TypeNotification || env.Action != agentkit.ActionErrorReport || env.TaskID != "t9" {
		t.Errorf("error report envelope = %s %s %s task %q", env.Priority, env.MessageType, env.Action, env.TaskID)
	}
	r := recvProto(t, got)
	var rep agentkit.ErrorReport
	if err := json.Unmarshal(r.payload, &rep); err != nil {
		t.Fatal(err)
	}
	if r.priority != agentkit.PriorityCritical || r.typ != agentkit.TypeNotification || rep.AgentID != "worker" || rep.ErrorID == "" || rep.Message != "down" {
		t.Errorf("received %s %s %+v", r.priority, r.typ, rep)
	}

	if _, err := worker.ReportStatus(c, "director", agentkit.StatusUpdate{Status: agentkit.AgentStatusInfo{State: agentkit.AgentStateBusy, CapabilityLevel: 70}, CurrentTasks: []string{"t9"}}); err != nil {
		t.Fatal(err)
	}
	r = recvProto(t, got)
	var st agentkit.StatusUpdate
	if err := json.Unmarshal(r.payload, &st); err != nil {
		t.Fatal(err)
	}
	if r.priority != agentkit.PriorityNormal || r.typ != agentkit.TypeNotification || st.AgentID != "worker" || st.Status.State != agentkit.AgentStateBusy {
		t.Errorf("received %s %s %+v", r.priority, r.typ, st)
	}

	// Low priority on request; invalid reports are refused before sending.
	if env, err := worker.ReportStatus(c, "director", agentkit.StatusUpdate{Status: agentkit.AgentStatusInfo{State: agentkit.AgentStateIdle}}, agentkit.WithPriority(agentkit.PriorityLow)); err != nil || env.Priority != agentkit.PriorityLow {
		t.Fatalf("ReportStatus at low priority: %v", err)
	}
	recvProto(t, got)
	if _, err := worker.ReportStatus(c, "director", agentkit.StatusUpdate{}); !errors.Is(err, agentkit.ErrInvalidEnvelope) {
		t.Errorf("ReportStatus without a state: %v, want ErrInvalidEnvelope", err)
	}
	if _, err := worker.ReportError(c, "director", agentkit.ErrorReport{ErrorType: agentkit.ErrorTypeNetwork, Severity: "fatal", Message: "x"}); !errors.Is(err, agentkit.ErrInvalidEnvelope) {
		t.Errorf("ReportError with a bad severity: %v, want ErrInvalidEnvelope", err)
	}
}
