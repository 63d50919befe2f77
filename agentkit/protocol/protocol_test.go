package protocol_test

import (
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/agentmesh-io/agentmesh/agentkit/protocol"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/internal/jsontest"
)

var (
	fixtureAt          = time.Date(2026, 1, 10, 14, 30, 0, 0, time.UTC)
	fixtureLater       = fixtureAt.Add(time.Hour)
	fixtureTaskCtx     = protocol.TaskContext{TaskID: "t1", TaskType: "analysis", Priority: wire.PriorityHigh, Metadata: map[string]any{"k": "v"}, Dependencies: []string{"t0"}, History: []protocol.TaskEvent{{Timestamp: fixtureAt, EventType: "created", AgentID: "a", Details: map[string]any{"x": "y"}}}}
	fixtureConstraints = protocol.TaskConstraints{MaxTokens: 1000, Deadline: &fixtureLater, RequiredCapabilities: []string{"sql"}, BudgetUSD: 2.5, QualityThreshold: 0.9}
	fixtureReport      = protocol.ErrorReport{ErrorID: "e1", AgentID: "a", TaskID: "t1", ErrorType: protocol.ErrorTypeTimeout, Severity: protocol.SeverityHigh, Message: "slow",
		StackTrace: "main.go:1", Context: map[string]any{"input_data": "x", "configuration": "y", "environment": "z"},
		RecoveryAttempts: []protocol.RecoveryAttempt{{AttemptNumber: 1, Timestamp: fixtureAt, Strategy: "retry", Outcome: protocol.RecoveryFailure, Details: "again"}},
		SuggestedActions: []string{"raise timeout"}}
)

// The wire field names of the nested types.
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
			give: protocol.TaskAssignment{TaskID: "t1", TaskType: "analysis", Description: "d", Context: &fixtureTaskCtx, Constraints: &fixtureConstraints, Deadline: &fixtureLater},
			keys: []string{"task_id", "task_type", "description", "context", "constraints", "deadline"},
		},
		{
			name:   "TaskHandoffRequest",
			give:   protocol.TaskHandoffRequest{TaskID: "t1", FromAgent: "a", ToAgent: "b", Reason: protocol.HandoffRateLimit, Context: fixtureTaskCtx, Constraints: fixtureConstraints, Deadline: fixtureLater},
			keys:   []string{"task_id", "from_agent", "to_agent", "reason", "context", "constraints", "deadline"},
			nested: map[string][]string{"context": fixtureTaskContextKeys, "constraints": fixtureConstraintsKeys},
		},
		{
			name:   "TaskHandoffResponse",
			give:   protocol.TaskHandoffResponse{Accepted: true, AgentID: "b", EstimatedCompletion: fixtureLater, Requirements: []string{"logs"}, Constraints: &fixtureConstraints, Error: "e"},
			keys:   []string{"accepted", "agent_id", "estimated_completion", "requirements", "constraints", "error"},
			nested: map[string][]string{"constraints": fixtureConstraintsKeys},
		},
		{
			name: "TaskUpdate",
			give: protocol.TaskUpdate{TaskID: "t1", Status: protocol.TaskInProgress, Progress: 0.5, Message: "half", Details: map[string]any{"rows": "10"}},
			keys: []string{"task_id", "status", "progress", "message", "details"},
		},
		{
			name: "TaskComplete",
			give: protocol.TaskComplete{TaskID: "t1", Result: json.RawMessage(`{"ok":true}`)},
			keys: []string{"task_id", "result"},
		},
		{
			name:   "TaskFailure",
			give:   protocol.TaskFailure{TaskID: "t1", Error: fixtureReport},
			keys:   []string{"task_id", "error"},
			nested: map[string][]string{"error": {"error_id", "agent_id", "task_id", "error_type", "severity", "message", "stack_trace", "context", "recovery_attempts", "suggested_actions"}},
		},
		{
			name: "HelpRequest",
			give: protocol.HelpRequest{RequesterID: "a", TaskID: "t1", HelpType: protocol.HelpCodeReview, Description: "d",
				Context: protocol.HelpContext{CurrentState: "stuck", ErrorDetails: "e", AttemptedSolutions: []string{"x"}}, Urgency: protocol.UrgencyHigh, Deadline: &fixtureLater},
			keys:   []string{"requester_id", "task_id", "help_type", "description", "context", "urgency", "deadline"},
			nested: map[string][]string{"context": {"current_state", "error_details", "attempted_solutions"}},
		},
		{
			name: "HelpResponse",
			give: protocol.HelpResponse{ResponderID: "b", RequestID: "m1", ResponseType: protocol.ResponseDirectAnswer, Content: "c",
				Resources: []protocol.ResourceReference{{Type: protocol.ReferenceDocumentation, URL: "https://x", Title: "t", Description: "d"}}, FollowUpRequired: true, EstimatedEffortMinutes: 15},
			keys:   []string{"responder_id", "request_id", "response_type", "content", "resources", "follow_up_required", "estimated_effort"},
			nested: map[string][]string{"resources": {"type", "url", "title", "description"}},
		},
		{
			name: "StatusUpdate",
			give: protocol.StatusUpdate{AgentID: "a",
				Status:        protocol.AgentStatusInfo{State: protocol.AgentStateBusy, CapabilityLevel: 80, ErrorRate: 0.1, AvgResponseTimeMS: 12.5, LastHeartbeat: fixtureAt},
				CurrentTasks:  []string{"t1"},
				ResourceUsage: protocol.ResourceUsage{TokensUsed: 10, TokensRemaining: 90, CostUSD: 0.2, CPUUsage: 50, MemoryUsage: 40},
				HealthMetrics: protocol.HealthMetrics{UptimeSeconds: 60, SuccessRate: 0.99, AvgLatencyMS: 3, ErrorCount: 1, LastError: &fixtureAt},
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
			give: protocol.Escalation{Reason: "max_deliveries", MessageID: "m1", Sender: "a", Receiver: "b", Consumer: "b_high", Priority: "high",
				Subject: "mesh.agent.b.high.a", StreamSeq: 3, Attempts: 4, Naks: 1, Timeouts: 3, Reasons: []string{"delivery 1: NAK"},
				CorrelationID: "c", WorkflowID: "w", InReplyTo: "m0", Original: json.RawMessage(`{"acl":"1"}`), DLQSubject: "mesh.dlq.b.high.a",
				DLQSeq: 7, SentAt: fixtureAt, FailedAt: fixtureLater},
			keys: []string{"reason", "message_id", "sender", "receiver", "consumer", "priority", "subject", "stream_seq", "attempts", "naks", "timeouts",
				"reasons", "correlation_id", "workflow_id", "in_reply_to", "original", "dlq_subject", "dlq_seq", "sent_at", "failed_at"},
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b := jsontest.Marshal(t, tt.give)
			jsontest.Keys(t, b, tt.keys...)
			for member, keys := range tt.nested {
				jsontest.Keys(t, jsontest.Member(t, b, member), keys...)
			}
			// Round trip: decoding and encoding again gives the same JSON.
			back := reflect.New(reflect.TypeOf(tt.give))
			if err := json.Unmarshal(b, back.Interface()); err != nil {
				t.Fatal(err)
			}
			if again := jsontest.Marshal(t, back.Elem().Interface()); string(again) != string(b) {
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
	jsontest.Keys(t, jsontest.Marshal(t, protocol.TaskHandoffRequest{TaskID: "t1"}),
		"task_id", "from_agent", "to_agent", "reason", "context", "constraints")
	jsontest.Keys(t, jsontest.Marshal(t, protocol.TaskContext{}), "task_id", "task_type", "metadata", "dependencies", "history")
	jsontest.Keys(t, jsontest.Marshal(t, protocol.HelpResponse{}), "responder_id", "request_id", "response_type", "content", "follow_up_required", "estimated_effort")
	jsontest.Keys(t, jsontest.Marshal(t, protocol.TaskHandoffResponse{}), "accepted", "agent_id", "requirements")
	// Priority accepts "medium" as normal.
	var c protocol.TaskContext
	if err := json.Unmarshal([]byte(`{"priority":"medium"}`), &c); err != nil || c.Priority != wire.PriorityNormal {
		t.Errorf("priority medium = %q, %v", c.Priority, err)
	}
}

func TestProtocol_EnumsValid(t *testing.T) {
	t.Parallel()
	check := func(name string, valid []bool, got []string, want []string) {
		t.Helper()
		if !slices.Equal(got, want) {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
		for i, ok := range valid {
			if !ok {
				t.Errorf("%s %s not Valid", name, got[i])
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
	check("HandoffReasons", validAll(len(protocol.HandoffReasons), func(i int) bool { return protocol.HandoffReasons[i].Valid() }),
		toStrings(protocol.HandoffReasons), strs("CAPABILITY_LIMIT", "RATE_LIMIT", "ERROR_RECOVERY", "ESCALATION", "LOAD_BALANCING"))
	check("HelpTypes", validAll(len(protocol.HelpTypes), func(i int) bool { return protocol.HelpTypes[i].Valid() }),
		toStrings(protocol.HelpTypes), strs("TECHNICAL_GUIDANCE", "DEBUGGING_ASSISTANCE", "CODE_REVIEW", "ARCHITECTURE_ADVICE", "RESOURCE_SHARING"))
	check("HelpResponseTypes", validAll(len(protocol.HelpResponseTypes), func(i int) bool { return protocol.HelpResponseTypes[i].Valid() }),
		toStrings(protocol.HelpResponseTypes), strs("DIRECT_ANSWER", "RESOURCE_PROVISION", "COLLABORATIVE_SESSION", "ESCALATION", "UNABLE_TO_HELP"))
	check("Urgencies", validAll(len(protocol.Urgencies), func(i int) bool { return protocol.Urgencies[i].Valid() }),
		toStrings(protocol.Urgencies), strs("low", "medium", "high", "critical"))
	check("Severities", validAll(len(protocol.Severities), func(i int) bool { return protocol.Severities[i].Valid() }),
		toStrings(protocol.Severities), strs("low", "medium", "high", "critical"))
	check("AgentStates", validAll(len(protocol.AgentStates), func(i int) bool { return protocol.AgentStates[i].Valid() }),
		toStrings(protocol.AgentStates), strs("IDLE", "BUSY", "ERROR", "OFFLINE", "MAINTENANCE"))
	check("ErrorTypes", validAll(len(protocol.ErrorTypes), func(i int) bool { return protocol.ErrorTypes[i].Valid() }),
		toStrings(protocol.ErrorTypes), strs("TIMEOUT", "RATE_LIMIT", "VALIDATION_ERROR", "NETWORK_ERROR", "AUTHENTICATION_ERROR", "RESOURCE_EXHAUSTED", "INTERNAL_ERROR", "EXTERNAL_SERVICE_ERROR"))
	check("ReferenceTypes", validAll(len(protocol.ReferenceTypes), func(i int) bool { return protocol.ReferenceTypes[i].Valid() }),
		toStrings(protocol.ReferenceTypes), strs("documentation", "code", "api", "example", "tool"))
	check("TaskStatuses", validAll(len(protocol.TaskStatuses), func(i int) bool { return protocol.TaskStatuses[i].Valid() }),
		toStrings(protocol.TaskStatuses), strs("pending", "in_progress", "completed", "failed", "cancelled"))

	for name, v := range map[string]interface{ Valid() bool }{
		"reason":   protocol.HandoffReason("capability_limit"),
		"help":     protocol.HelpType(""),
		"response": protocol.HelpResponseType("ANSWER"),
		"urgency":  protocol.Urgency("normal"),
		"severity": protocol.Severity("CRITICAL"),
		"state":    protocol.AgentState("READY"),
		"error":    protocol.ErrorType("TIMEOUT_ERROR"),
		"ref":      protocol.ReferenceType("doc"),
	} {
		if v.Valid() {
			t.Errorf("%s %v is Valid", name, v)
		}
	}
}

func TestProtocol_Validate(t *testing.T) {
	t.Parallel()
	handoff := protocol.TaskHandoffRequest{TaskID: "t1", FromAgent: "a", ToAgent: "b", Reason: protocol.HandoffLoadBalancing}
	help := protocol.HelpRequest{RequesterID: "a", HelpType: protocol.HelpDebuggingAssistance, Description: "d", Urgency: protocol.UrgencyLow}
	status := protocol.StatusUpdate{AgentID: "a", Status: protocol.AgentStatusInfo{State: protocol.AgentStateIdle}}
	for _, tt := range []struct {
		name      string
		give      interface{ Validate() error }
		wantField string // "" means valid
	}{
		{"handoff ok", handoff, ""},
		{"handoff no task", func() protocol.TaskHandoffRequest { r := handoff; r.TaskID = ""; return r }(), "payload.task_id"},
		{"handoff no from", func() protocol.TaskHandoffRequest { r := handoff; r.FromAgent = ""; return r }(), "payload.from_agent"},
		{"handoff no to", func() protocol.TaskHandoffRequest { r := handoff; r.ToAgent = ""; return r }(), "payload.to_agent"},
		{"handoff reason", func() protocol.TaskHandoffRequest { r := handoff; r.Reason = "BORED"; return r }(), "payload.reason"},
		{"handoff priority", func() protocol.TaskHandoffRequest { r := handoff; r.Context.Priority = "urgent"; return r }(), "payload.context.priority"},
		{"handoff quality", func() protocol.TaskHandoffRequest { r := handoff; r.Constraints.QualityThreshold = 2; return r }(), "payload.constraints.quality_threshold"},
		{"handoff response accepted anonymously", protocol.TaskHandoffResponse{Accepted: true}, "payload.agent_id"},
		{"handoff response declined", protocol.TaskHandoffResponse{Error: "busy"}, ""},
		{"assignment ok", protocol.TaskAssignment{TaskID: "t1", TaskType: "x"}, ""},
		{"assignment no type", protocol.TaskAssignment{TaskID: "t1"}, "payload.task_type"},
		{"assignment budget", protocol.TaskAssignment{TaskID: "t1", TaskType: "x", Constraints: &protocol.TaskConstraints{BudgetUSD: -1}}, "payload.constraints.budget_usd"},
		{"update ok", protocol.TaskUpdate{TaskID: "t1", Status: protocol.TaskInProgress, Progress: 1}, ""},
		{"update status", protocol.TaskUpdate{TaskID: "t1", Status: "running"}, "payload.status"},
		{"update progress", protocol.TaskUpdate{TaskID: "t1", Status: protocol.TaskInProgress, Progress: 1.5}, "payload.progress"},
		{"complete no task", protocol.TaskComplete{}, "payload.task_id"},
		{"failure report", protocol.TaskFailure{TaskID: "t1", Error: protocol.ErrorReport{ErrorID: "e"}}, "payload.error.agent_id"},
		{"help ok", help, ""},
		{"help type", func() protocol.HelpRequest { r := help; r.HelpType = "ADVICE"; return r }(), "payload.help_type"},
		{"help urgency", func() protocol.HelpRequest { r := help; r.Urgency = "normal"; return r }(), "payload.urgency"},
		{"help description", func() protocol.HelpRequest { r := help; r.Description = ""; return r }(), "payload.description"},
		{"help response type", protocol.HelpResponse{ResponderID: "b", ResponseType: "YES"}, "payload.response_type"},
		{"help response resource", protocol.HelpResponse{ResponderID: "b", ResponseType: protocol.ResponseResourceProvision, Resources: []protocol.ResourceReference{{Type: "book"}}}, "payload.resources[0].type"},
		{"status ok", status, ""},
		{"status state", func() protocol.StatusUpdate { s := status; s.Status.State = "READY"; return s }(), "payload.status.state"},
		{"status capability", func() protocol.StatusUpdate { s := status; s.Status.CapabilityLevel = 101; return s }(), "payload.status.capability_level"},
		{"status error rate", func() protocol.StatusUpdate { s := status; s.Status.ErrorRate = -0.1; return s }(), "payload.status.error_rate"},
		{"status cpu", func() protocol.StatusUpdate { s := status; s.ResourceUsage.CPUUsage = 120; return s }(), "payload.resource_usage.cpu_usage"},
		{"report ok", fixtureReport, ""},
		{"report type", func() protocol.ErrorReport { r := fixtureReport; r.ErrorType = "OOPS"; return r }(), "payload.error_type"},
		{"report severity", func() protocol.ErrorReport { r := fixtureReport; r.Severity = "fatal"; return r }(), "payload.severity"},
		{"report outcome", func() protocol.ErrorReport {
			r := fixtureReport
			r.RecoveryAttempts = []protocol.RecoveryAttempt{{Outcome: "meh"}}
			return r
		}(), "payload.recovery_attempts[0].outcome"},
		{"escalation no id", protocol.Escalation{Reason: "terminated"}, "payload.message_id"},
		{"escalation reason", protocol.Escalation{MessageID: "m1", Reason: "bored"}, "payload.reason"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.give.Validate()
			if tt.wantField == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			var ve *wire.ValidationError
			if !errors.Is(err, wire.ErrInvalidEnvelope) || !errors.As(err, &ve) || ve.Field != tt.wantField {
				t.Fatalf("Validate: %v, want a ValidationError on %s", err, tt.wantField)
			}
		})
	}
}
