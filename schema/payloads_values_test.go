package schema_test

import (
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentmesh-io/agentmesh/agentkit/protocol"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
)

var (
	valAt     = time.Date(2026, 1, 10, 14, 30, 0, 0, time.UTC)
	valLater  = valAt.Add(time.Hour)
	valTaskCx = protocol.TaskContext{TaskID: "t1", TaskType: "analysis", Priority: wire.PriorityHigh,
		Metadata: map[string]any{"k": "v"}, Dependencies: []string{"t0"},
		History: []protocol.TaskEvent{{Timestamp: valAt, EventType: "created", AgentID: "a", Details: map[string]any{"x": "y"}}}}
	valConstraints = protocol.TaskConstraints{MaxTokens: 1000, Deadline: &valLater, RequiredCapabilities: []string{"sql"},
		BudgetUSD: 2.5, QualityThreshold: 0.9}
	valReport = protocol.ErrorReport{ErrorID: "e1", AgentID: "a", TaskID: "t1", ErrorType: protocol.ErrorTypeTimeout,
		Severity: protocol.SeverityHigh, Message: "slow", StackTrace: "main.go:1",
		Context:          map[string]any{"input_data": "x", "configuration": "y", "environment": "z"},
		RecoveryAttempts: []protocol.RecoveryAttempt{{AttemptNumber: 1, Timestamp: valAt, Strategy: "retry", Outcome: protocol.RecoveryFailure, Details: "again"}},
		SuggestedActions: []string{"raise timeout"}}
)

// validator is a payload that checks itself.
type validator interface{ Validate() error }

// variants returns base and base changed by each of muts, named.
func variants[T validator](base T, muts map[string]func(*T)) map[string]validator {
	out := map[string]validator{"base": base}
	for name, m := range muts {
		v := base
		m(&v)
		out[name] = v
	}
	return out
}

// constraintMuts changes the constraints c points at, which the caller
// has copied.
func constraintMuts(c func(any) *protocol.TaskConstraints) map[string]func(any) {
	return map[string]func(any){
		"max_tokens -1":          func(v any) { c(v).MaxTokens = -1 },
		"max_tokens 0":           func(v any) { c(v).MaxTokens = 0 },
		"budget -0.01":           func(v any) { c(v).BudgetUSD = -0.01 },
		"budget 0":               func(v any) { c(v).BudgetUSD = 0 },
		"quality 1":              func(v any) { c(v).QualityThreshold = 1 },
		"quality 1.01":           func(v any) { c(v).QualityThreshold = 1.01 },
		"quality -0.1":           func(v any) { c(v).QualityThreshold = -0.1 },
		"no deadline":            func(v any) { c(v).Deadline = nil },
		"zero deadline":          func(v any) { c(v).Deadline = &time.Time{} },
		"no capabilities":        func(v any) { c(v).RequiredCapabilities = nil },
		"empty capability":       func(v any) { c(v).RequiredCapabilities = []string{""} },
		"max_tokens max int":     func(v any) { c(v).MaxTokens = int(^uint(0) >> 1) },
		"quality smallest above": func(v any) { c(v).QualityThreshold = 1.0000000000000002 },
	}
}

// withConstraints adds constraintMuts for constraints reached by c, on a
// copy made by clone.
func withConstraints[T validator](muts map[string]func(*T), c func(*T) *protocol.TaskConstraints) map[string]func(*T) {
	for name, m := range constraintMuts(func(v any) *protocol.TaskConstraints { return c(v.(*T)) }) {
		muts["constraints "+name] = func(t *T) { m(t) }
	}
	return muts
}

// payloadValues returns, per definition, Go values Validate accepts and
// values it rejects.
func payloadValues() map[string]map[string]validator {
	cloneCx := func(c protocol.TaskConstraints) *protocol.TaskConstraints { return &c }
	return map[string]map[string]validator{
		"taskAssignment": variants(protocol.TaskAssignment{TaskID: "t1", TaskType: "analysis", Description: "d",
			Context: &valTaskCx, Constraints: &valConstraints, Deadline: &valLater},
			withConstraints(map[string]func(*protocol.TaskAssignment){
				"no task_id":         func(v *protocol.TaskAssignment) { v.TaskID = "" },
				"no task_type":       func(v *protocol.TaskAssignment) { v.TaskType = "" },
				"no description":     func(v *protocol.TaskAssignment) { v.Description = "" },
				"no context":         func(v *protocol.TaskAssignment) { v.Context = nil },
				"no constraints":     func(v *protocol.TaskAssignment) { v.Constraints = nil },
				"no deadline":        func(v *protocol.TaskAssignment) { v.Deadline = nil },
				"no priority":        func(v *protocol.TaskAssignment) { c := valTaskCx; c.Priority = ""; v.Context = &c },
				"priority batch":     func(v *protocol.TaskAssignment) { c := valTaskCx; c.Priority = wire.PriorityBatch; v.Context = &c },
				"empty context":      func(v *protocol.TaskAssignment) { v.Context = &protocol.TaskContext{} },
				"empty constraints":  func(v *protocol.TaskAssignment) { v.Constraints = &protocol.TaskConstraints{} },
				"zero history event": func(v *protocol.TaskAssignment) { c := valTaskCx; c.History = []protocol.TaskEvent{{}}; v.Context = &c },
			}, func(v *protocol.TaskAssignment) *protocol.TaskConstraints {
				v.Constraints = cloneCx(*v.Constraints)
				return v.Constraints
			})),
		"taskHandoffRequest": variants(protocol.TaskHandoffRequest{TaskID: "t1", FromAgent: "a", ToAgent: "b",
			Reason: protocol.HandoffRateLimit, Context: valTaskCx, Constraints: valConstraints, Deadline: valLater},
			withConstraints(map[string]func(*protocol.TaskHandoffRequest){
				"no task_id":      func(v *protocol.TaskHandoffRequest) { v.TaskID = "" },
				"no from_agent":   func(v *protocol.TaskHandoffRequest) { v.FromAgent = "" },
				"no to_agent":     func(v *protocol.TaskHandoffRequest) { v.ToAgent = "" },
				"no reason":       func(v *protocol.TaskHandoffRequest) { v.Reason = "" },
				"reason lower":    func(v *protocol.TaskHandoffRequest) { v.Reason = "rate_limit" },
				"reason unknown":  func(v *protocol.TaskHandoffRequest) { v.Reason = "BORED" },
				"reason escalate": func(v *protocol.TaskHandoffRequest) { v.Reason = protocol.HandoffEscalation },
				"zero context":    func(v *protocol.TaskHandoffRequest) { v.Context = protocol.TaskContext{} },
				"zero deadline":   func(v *protocol.TaskHandoffRequest) { v.Deadline = time.Time{} },
				"minimal": func(v *protocol.TaskHandoffRequest) {
					*v = protocol.TaskHandoffRequest{TaskID: "t", FromAgent: "a", ToAgent: "b", Reason: protocol.HandoffLoadBalancing}
				},
			}, func(v *protocol.TaskHandoffRequest) *protocol.TaskConstraints { return &v.Constraints })),
		"taskHandoffResponse": variants(protocol.TaskHandoffResponse{Accepted: true, AgentID: "b", EstimatedCompletion: valLater,
			Requirements: []string{"logs"}, Constraints: &valConstraints, Error: "e"},
			withConstraints(map[string]func(*protocol.TaskHandoffResponse){
				"accepted without agent": func(v *protocol.TaskHandoffResponse) { v.AgentID = "" },
				"declined without agent": func(v *protocol.TaskHandoffResponse) { v.Accepted, v.AgentID = false, "" },
				"zero":                   func(v *protocol.TaskHandoffResponse) { *v = protocol.TaskHandoffResponse{} },
				"no constraints":         func(v *protocol.TaskHandoffResponse) { v.Constraints = nil },
			}, func(v *protocol.TaskHandoffResponse) *protocol.TaskConstraints {
				v.Constraints = cloneCx(*v.Constraints)
				return v.Constraints
			})),
		"taskUpdate": variants(protocol.TaskUpdate{TaskID: "t1", Status: protocol.TaskInProgress, Progress: 0.5, Message: "m", Details: map[string]any{"a": 1.0}},
			map[string]func(*protocol.TaskUpdate){
				"no task_id":       func(v *protocol.TaskUpdate) { v.TaskID = "" },
				"no status":        func(v *protocol.TaskUpdate) { v.Status = "" },
				"status done":      func(v *protocol.TaskUpdate) { v.Status = "done" },
				"status Completed": func(v *protocol.TaskUpdate) { v.Status = "Completed" },
				"status cancelled": func(v *protocol.TaskUpdate) { v.Status = protocol.TaskCancelled },
				"status pending":   func(v *protocol.TaskUpdate) { v.Status = protocol.TaskPending },
				"progress 0":       func(v *protocol.TaskUpdate) { v.Progress = 0 },
				"progress 1":       func(v *protocol.TaskUpdate) { v.Progress = 1 },
				"progress -0.1":    func(v *protocol.TaskUpdate) { v.Progress = -0.1 },
				"progress 1.5":     func(v *protocol.TaskUpdate) { v.Progress = 1.5 },
				"no details":       func(v *protocol.TaskUpdate) { v.Details, v.Message = nil, "" },
			}),
		"taskComplete": variants(protocol.TaskComplete{TaskID: "t1", Result: json.RawMessage(`{"rows":3}`)},
			map[string]func(*protocol.TaskComplete){
				"no task_id":    func(v *protocol.TaskComplete) { v.TaskID = "" },
				"no result":     func(v *protocol.TaskComplete) { v.Result = nil },
				"result string": func(v *protocol.TaskComplete) { v.Result = json.RawMessage(`"done"`) },
				"zero":          func(v *protocol.TaskComplete) { *v = protocol.TaskComplete{} },
			}),
		"taskFailure": variants(protocol.TaskFailure{TaskID: "t1", Error: valReport},
			map[string]func(*protocol.TaskFailure){
				"no task_id":  func(v *protocol.TaskFailure) { v.TaskID = "" },
				"no attempts": func(v *protocol.TaskFailure) { v.Error.RecoveryAttempts = nil },
				"error minimal": func(v *protocol.TaskFailure) {
					v.Error = protocol.ErrorReport{ErrorID: "e", AgentID: "a", ErrorType: protocol.ErrorTypeNetwork, Severity: protocol.SeverityLow, Message: "m"}
				},
				"zero error":       func(v *protocol.TaskFailure) { v.Error = protocol.ErrorReport{} },
				"error no message": func(v *protocol.TaskFailure) { v.Error.Message = "" },
				"error severity":   func(v *protocol.TaskFailure) { v.Error.Severity = "fatal" },
				"error outcome": func(v *protocol.TaskFailure) {
					v.Error.RecoveryAttempts = []protocol.RecoveryAttempt{{Outcome: "meh"}}
				},
			}),
		"helpRequest": variants(protocol.HelpRequest{RequesterID: "a", TaskID: "t1", HelpType: protocol.HelpCodeReview,
			Description: "d", Context: protocol.HelpContext{CurrentState: "s", ErrorDetails: "e", AttemptedSolutions: []string{"x"}},
			Urgency: protocol.UrgencyHigh, Deadline: &valLater},
			map[string]func(*protocol.HelpRequest){
				"no requester_id":   func(v *protocol.HelpRequest) { v.RequesterID = "" },
				"no task_id":        func(v *protocol.HelpRequest) { v.TaskID = "" },
				"no help_type":      func(v *protocol.HelpRequest) { v.HelpType = "" },
				"help_type lower":   func(v *protocol.HelpRequest) { v.HelpType = "code_review" },
				"no description":    func(v *protocol.HelpRequest) { v.Description = "" },
				"no urgency":        func(v *protocol.HelpRequest) { v.Urgency = "" },
				"urgency urgent":    func(v *protocol.HelpRequest) { v.Urgency = "urgent" },
				"urgency critical":  func(v *protocol.HelpRequest) { v.Urgency = protocol.UrgencyCritical },
				"zero context":      func(v *protocol.HelpRequest) { v.Context = protocol.HelpContext{} },
				"no deadline":       func(v *protocol.HelpRequest) { v.Deadline = nil },
				"resource sharing":  func(v *protocol.HelpRequest) { v.HelpType = protocol.HelpResourceSharing },
				"help_type unknown": func(v *protocol.HelpRequest) { v.HelpType = "MORAL_SUPPORT" },
			}),
		"helpResponse": variants(protocol.HelpResponse{ResponderID: "b", RequestID: "m-1", ResponseType: protocol.ResponseDirectAnswer,
			Content: "c", Resources: []protocol.ResourceReference{{Type: protocol.ReferenceDocumentation, URL: "https://x", Title: "t", Description: "d"}},
			FollowUpRequired: true, EstimatedEffortMinutes: 15},
			map[string]func(*protocol.HelpResponse){
				"no responder_id":     func(v *protocol.HelpResponse) { v.ResponderID = "" },
				"no request_id":       func(v *protocol.HelpResponse) { v.RequestID = "" },
				"no response_type":    func(v *protocol.HelpResponse) { v.ResponseType = "" },
				"response_type lower": func(v *protocol.HelpResponse) { v.ResponseType = "direct_answer" },
				"effort -1":           func(v *protocol.HelpResponse) { v.EstimatedEffortMinutes = -1 },
				"effort 0":            func(v *protocol.HelpResponse) { v.EstimatedEffortMinutes = 0 },
				"no resources":        func(v *protocol.HelpResponse) { v.Resources = nil },
				"resource no type":    func(v *protocol.HelpResponse) { v.Resources = []protocol.ResourceReference{{URL: "u"}} },
				"resource type API":   func(v *protocol.HelpResponse) { v.Resources = []protocol.ResourceReference{{Type: "API"}} },
				"resource type tool": func(v *protocol.HelpResponse) {
					v.Resources = []protocol.ResourceReference{{Type: protocol.ReferenceTool}}
				},
				"unable to help": func(v *protocol.HelpResponse) { v.ResponseType = protocol.ResponseUnableToHelp },
			}),
		"statusUpdate": variants(protocol.StatusUpdate{AgentID: "a",
			Status:        protocol.AgentStatusInfo{State: protocol.AgentStateBusy, CapabilityLevel: 80, ErrorRate: 0.01, AvgResponseTimeMS: 120, LastHeartbeat: valAt},
			CurrentTasks:  []string{"t1"},
			ResourceUsage: protocol.ResourceUsage{TokensUsed: 10, TokensRemaining: 90, CostUSD: 0.5, CPUUsage: 50, MemoryUsage: 60},
			HealthMetrics: protocol.HealthMetrics{UptimeSeconds: 60, SuccessRate: 0.99, AvgLatencyMS: 100, ErrorCount: 1, LastError: &valAt},
			NextAvailable: &valLater},
			map[string]func(*protocol.StatusUpdate){
				"no agent_id":        func(v *protocol.StatusUpdate) { v.AgentID = "" },
				"no state":           func(v *protocol.StatusUpdate) { v.Status.State = "" },
				"state idle lower":   func(v *protocol.StatusUpdate) { v.Status.State = "idle" },
				"state maintenance":  func(v *protocol.StatusUpdate) { v.Status.State = protocol.AgentStateMaintenance },
				"capability -1":      func(v *protocol.StatusUpdate) { v.Status.CapabilityLevel = -1 },
				"capability 0":       func(v *protocol.StatusUpdate) { v.Status.CapabilityLevel = 0 },
				"capability 100":     func(v *protocol.StatusUpdate) { v.Status.CapabilityLevel = 100 },
				"capability 101":     func(v *protocol.StatusUpdate) { v.Status.CapabilityLevel = 101 },
				"error_rate 1":       func(v *protocol.StatusUpdate) { v.Status.ErrorRate = 1 },
				"error_rate 1.1":     func(v *protocol.StatusUpdate) { v.Status.ErrorRate = 1.1 },
				"error_rate -0.1":    func(v *protocol.StatusUpdate) { v.Status.ErrorRate = -0.1 },
				"success_rate 1.01":  func(v *protocol.StatusUpdate) { v.HealthMetrics.SuccessRate = 1.01 },
				"success_rate -1":    func(v *protocol.StatusUpdate) { v.HealthMetrics.SuccessRate = -1 },
				"cpu 100":            func(v *protocol.StatusUpdate) { v.ResourceUsage.CPUUsage = 100 },
				"cpu 100.5":          func(v *protocol.StatusUpdate) { v.ResourceUsage.CPUUsage = 100.5 },
				"cpu -1":             func(v *protocol.StatusUpdate) { v.ResourceUsage.CPUUsage = -1 },
				"memory 101":         func(v *protocol.StatusUpdate) { v.ResourceUsage.MemoryUsage = 101 },
				"memory -0.5":        func(v *protocol.StatusUpdate) { v.ResourceUsage.MemoryUsage = -0.5 },
				"negative tokens":    func(v *protocol.StatusUpdate) { v.ResourceUsage.TokensUsed = -5 },
				"negative latency":   func(v *protocol.StatusUpdate) { v.HealthMetrics.AvgLatencyMS = -5 },
				"negative error_cnt": func(v *protocol.StatusUpdate) { v.HealthMetrics.ErrorCount = -1 },
				"no last_error":      func(v *protocol.StatusUpdate) { v.HealthMetrics.LastError = nil },
				"no next_available":  func(v *protocol.StatusUpdate) { v.NextAvailable = nil },
				"only required": func(v *protocol.StatusUpdate) {
					*v = protocol.StatusUpdate{AgentID: "a", Status: protocol.AgentStatusInfo{State: protocol.AgentStateIdle}}
				},
				"zero health and use": func(v *protocol.StatusUpdate) {
					v.HealthMetrics, v.ResourceUsage = protocol.HealthMetrics{}, protocol.ResourceUsage{}
				},
			}),
		"errorReport": variants(valReport, map[string]func(*protocol.ErrorReport){
			"no error_id":         func(v *protocol.ErrorReport) { v.ErrorID = "" },
			"no agent_id":         func(v *protocol.ErrorReport) { v.AgentID = "" },
			"no task_id":          func(v *protocol.ErrorReport) { v.TaskID = "" },
			"no error_type":       func(v *protocol.ErrorReport) { v.ErrorType = "" },
			"error_type lower":    func(v *protocol.ErrorReport) { v.ErrorType = "timeout" },
			"error_type external": func(v *protocol.ErrorReport) { v.ErrorType = protocol.ErrorTypeExternalService },
			"no severity":         func(v *protocol.ErrorReport) { v.Severity = "" },
			"severity HIGH":       func(v *protocol.ErrorReport) { v.Severity = "HIGH" },
			"severity low":        func(v *protocol.ErrorReport) { v.Severity = protocol.SeverityLow },
			"no message":          func(v *protocol.ErrorReport) { v.Message = "" },
			"no attempts":         func(v *protocol.ErrorReport) { v.RecoveryAttempts = nil },
			"outcome empty": func(v *protocol.ErrorReport) {
				v.RecoveryAttempts = []protocol.RecoveryAttempt{{AttemptNumber: 1}}
			},
			"outcome Success": func(v *protocol.ErrorReport) {
				v.RecoveryAttempts = []protocol.RecoveryAttempt{{Outcome: "Success"}}
			},
			"outcome partial": func(v *protocol.ErrorReport) {
				v.RecoveryAttempts = []protocol.RecoveryAttempt{{Outcome: protocol.RecoveryPartial}}
			},
			"second outcome bad": func(v *protocol.ErrorReport) {
				v.RecoveryAttempts = []protocol.RecoveryAttempt{{Outcome: protocol.RecoverySuccess}, {Outcome: "x"}}
			},
			"no context": func(v *protocol.ErrorReport) { v.Context, v.SuggestedActions, v.StackTrace = nil, nil, "" },
		}),
		"escalation": variants(protocol.Escalation{Reason: "max_deliveries", MessageID: "m-1", Sender: "a", Receiver: "b",
			Consumer: "b_normal", Priority: "normal", Subject: "mesh.agent.b.normal.a", StreamSeq: 42, Attempts: 3, Naks: 1, Timeouts: 2,
			Reasons: []string{"delivery 1: NAK"}, CorrelationID: "c", WorkflowID: "w", InReplyTo: "m-0",
			Original: json.RawMessage(`{"acl":"1"}`), DLQSubject: "mesh.dlq.b", DLQSeq: 7, SentAt: valAt, FailedAt: valLater},
			map[string]func(*protocol.Escalation){
				"no message_id":   func(v *protocol.Escalation) { v.MessageID = "" },
				"no reason":       func(v *protocol.Escalation) { v.Reason = "" },
				"reason upper":    func(v *protocol.Escalation) { v.Reason = "MAX_DELIVERIES" },
				"terminated":      func(v *protocol.Escalation) { v.Reason = "terminated" },
				"attempts -1":     func(v *protocol.Escalation) { v.Attempts = -1 },
				"naks -1":         func(v *protocol.Escalation) { v.Naks = -1 },
				"timeouts -1":     func(v *protocol.Escalation) { v.Timeouts = -1 },
				"zero counts":     func(v *protocol.Escalation) { v.Attempts, v.Naks, v.Timeouts = 0, 0, 0 },
				"max stream_seq":  func(v *protocol.Escalation) { v.StreamSeq, v.DLQSeq = ^uint64(0), ^uint64(0) },
				"no original":     func(v *protocol.Escalation) { v.Original = nil },
				"zero times":      func(v *protocol.Escalation) { v.SentAt, v.FailedAt = time.Time{}, time.Time{} },
				"priority urgent": func(v *protocol.Escalation) { v.Priority = "urgent" },
				"only required":   func(v *protocol.Escalation) { *v = protocol.Escalation{Reason: "terminated", MessageID: "m"} },
			}),
	}
}

// TestPayloads_GoValues encodes Go values as agentkit does and checks that
// the schema accepts exactly those Validate accepts.
func TestPayloads_GoValues(t *testing.T) {
	t.Parallel()
	all := payloadValues()
	for _, d := range payloadDefs {
		vals, ok := all[d.def]
		if !ok {
			t.Errorf("%s: no values", d.def)
			continue
		}
		accepted, rejected := 0, 0
		for name, v := range vals {
			if reflectTypeOf(v) != d.typ {
				t.Fatalf("%s/%s: a %T", d.def, name, v)
			}
			data, err := json.Marshal(v)
			if err != nil {
				t.Errorf("%s/%s: marshal: %v", d.def, name, err)
				continue
			}
			goErr := v.Validate()
			if goErr == nil {
				accepted++
			} else {
				rejected++
				if !errors.Is(goErr, wire.ErrInvalidEnvelope) {
					t.Errorf("%s/%s: Validate: %v, want ErrInvalidEnvelope", d.def, name, goErr)
				}
			}
			schemaErr := validateAt(t, protocolID+"#/$defs/"+d.def, data)
			if (schemaErr == nil) != (goErr == nil) {
				t.Errorf("%s/%s: %s", d.def, name, diffMsg(data, schemaErr, goErr))
			}
			// What agentkit writes, it reads back as the same verdict.
			if checkErr := d.check(data); (checkErr == nil) != (goErr == nil) {
				t.Errorf("%s/%s: round trip changes the verdict: %v, then %v", d.def, name, goErr, checkErr)
			}
		}
		if accepted < 2 || rejected < 2 {
			t.Errorf("%s: %d accepted and %d rejected values, want at least 2 of each", d.def, accepted, rejected)
		}
	}
}

// memberValues are the JSON values TestPayloads_EveryMember puts in every
// member, at any depth.
var memberValues = []string{`null`, `""`, `"x"`, `"2026-01-10T14:30:00Z"`, `"0001-01-01T00:00:00Z"`,
	`"2026-01-10T14:30:00.Z"`, `"2026-01-10 14:30:00Z"`, `"2026-01-10t14:30:00z"`, `"2016-12-31T23:59:60Z"`,
	`"medium"`, `"normal"`, `"NORMAL"`, `"IDLE"`, `"Idle"`, `"success"`, `"max_deliveries"`, `"documentation"`,
	`0`, `-0`, `1`, `-1`, `0.5`, `1.5`, `100`, `101`, `100.5`, `-0.000001`, `1.0000001`,
	`5.0`, `1e2`, `1E0`, `-1e0`, `9223372036854775807`, `9223372036854775808`, `-9223372036854775808`,
	`-9223372036854775809`, `18446744073709551615`, `18446744073709551616`, `1e400`,
	`true`, `false`, `[]`, `[null]`, `["x"]`, `[1]`, `[{}]`, `[{"outcome":"success","type":"code"}]`, `{}`, `{"a":null}`}

// integralNumber reports whether v is a JSON number with a fraction or
// exponent and an integral value: JSON Schema calls it an integer,
// encoding/json does not.
func integralNumber(v string) bool {
	if !strings.ContainsAny(v, ".eE") || strings.HasPrefix(v, `"`) {
		return false
	}
	var f float64
	if json.Unmarshal([]byte(v), &f) != nil {
		return false
	}
	return f == float64(int64(f))
}

// payloadDivergence explains why the schema may accept v where Go rejects
// it, or returns "".
func payloadDivergence(v string, goErr error) string {
	var te *json.UnmarshalTypeError
	switch {
	case integralNumber(v) && errors.As(goErr, &te):
		return "encoding/json reads integers by spelling"
	case v == "1e400" && errors.As(goErr, &te):
		return "encoding/json rejects numbers beyond a float64"
	case v == "-0" && errors.As(goErr, &te) && te.Type.Kind() == reflect.Uint64:
		return "encoding/json reads an unsigned integer by spelling"
	}
	return ""
}

// TestPayloads_EveryMember puts each of memberValues in every member of a
// full payload, at any depth, and checks that the schema and Go agree.
func TestPayloads_EveryMember(t *testing.T) {
	t.Parallel()
	all := payloadValues()
	for _, d := range payloadDefs {
		base, err := json.Marshal(all[d.def]["base"])
		if err != nil {
			t.Fatal(err)
		}
		var doc any
		if err := json.Unmarshal(base, &doc); err != nil {
			t.Fatal(err)
		}
		paths := memberPaths(doc, nil)
		if len(paths) < 2 {
			t.Fatalf("%s: %d members", d.def, len(paths))
		}
		url := protocolID + "#/$defs/" + d.def
		for _, p := range paths {
			for _, v := range memberValues {
				data := replaceAt(t, doc, p, json.RawMessage(v))
				schemaErr := validateAt(t, url, data)
				goErr := d.check(data)
				if (schemaErr == nil) == (goErr == nil) {
					continue
				}
				if schemaErr == nil && payloadDivergence(v, goErr) != "" {
					continue
				}
				t.Errorf("%s %s = %s: %s", d.def, strings.Join(p, "."), v, diffMsg(data, schemaErr, goErr))
			}
		}
	}
}

// memberPaths returns the path of every object member in v, descending
// into objects and the first element of arrays ("0").
func memberPaths(v any, at []string) [][]string {
	var out [][]string
	switch v := v.(type) {
	case map[string]any:
		for k, c := range v {
			p := append(slices.Clone(at), k)
			out = append(out, p)
			out = append(out, memberPaths(c, p)...)
		}
	case []any:
		if len(v) > 0 {
			out = append(out, memberPaths(v[0], append(slices.Clone(at), "0"))...)
		}
	}
	return out
}

// replaceAt returns doc encoded with the member at path set to v.
func replaceAt(tb testing.TB, doc any, path []string, v json.RawMessage) []byte {
	tb.Helper()
	var set func(cur any, path []string) any
	set = func(cur any, path []string) any {
		if len(path) == 0 {
			return v
		}
		switch c := cur.(type) {
		case map[string]any:
			m := make(map[string]any, len(c))
			for k, x := range c {
				m[k] = x
			}
			m[path[0]] = set(c[path[0]], path[1:])
			return m
		case []any:
			a := slices.Clone(c)
			a[0] = set(c[0], path[1:])
			return a
		}
		tb.Fatalf("path %v: %T", path, cur)
		return nil
	}
	b, err := json.Marshal(set(doc, path))
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// TestPayloads_OneSided pins the documents only one side accepts, all of
// them because encoding/json is looser or stricter than JSON: when both
// sides come to agree on one, move it to the agreeing cases.
func TestPayloads_OneSided(t *testing.T) {
	t.Parallel()
	byDef := make(map[string]payloadDef)
	for _, d := range payloadDefs {
		byDef[d.def] = d
	}
	for _, c := range []struct {
		name, def, doc string
		want           string // accept, reject, "schema only" or "Go only"
	}{
		// Agreeing cases around the one-sided ones.
		{"unknown member", "taskComplete", `{"task_id":"t","extra":1}`, accept},
		{"unknown null member", "taskComplete", `{"task_id":"t","extra":null}`, accept},
		{"null payload of a required member", "taskComplete", `{"task_id":null}`, reject},
		{"array payload", "taskComplete", `[{"task_id":"t"}]`, reject},
		{"string payload", "taskComplete", `"t"`, reject},
		{"null optional object", "taskAssignment", `{"task_id":"t","task_type":"x","context":null,"constraints":null}`, accept},
		{"null required object", "statusUpdate", `{"agent_id":"a","status":null}`, reject},
		{"priority medium", "taskAssignment", `{"task_id":"t","task_type":"x","context":{"priority":"medium"}}`, accept},
		{"priority empty", "taskAssignment", `{"task_id":"t","task_type":"x","context":{"priority":""}}`, reject},
		{"priority null", "taskAssignment", `{"task_id":"t","task_type":"x","context":{"priority":null}}`, accept},
		{"null recovery attempt", "errorReport", `{"error_id":"e","agent_id":"a","error_type":"TIMEOUT","severity":"low","message":"m","recovery_attempts":[null]}`, reject},
		{"null resource", "helpResponse", `{"responder_id":"b","response_type":"DIRECT_ANSWER","resources":[null]}`, reject},
		{"null history event", "taskAssignment", `{"task_id":"t","task_type":"x","context":{"history":[null]}}`, accept},
		{"null string in list", "taskUpdate", `{"task_id":"t","status":"pending","details":{"a":null}}`, accept},
		{"accepted null", "taskHandoffResponse", `{"accepted":null}`, accept},
		{"accepted false", "taskHandoffResponse", `{"accepted":false}`, accept},
		{"accepted true", "taskHandoffResponse", `{"accepted":true}`, reject},
		{"accepted true agent empty", "taskHandoffResponse", `{"accepted":true,"agent_id":""}`, reject},
		{"accepted true agent null", "taskHandoffResponse", `{"accepted":true,"agent_id":null}`, reject},
		{"accepted string", "taskHandoffResponse", `{"accepted":"true","agent_id":"b"}`, reject},
		{"time with offset", "escalation", `{"reason":"terminated","message_id":"m","failed_at":"2026-01-10T14:30:00+02:00"}`, accept},
		{"time empty", "escalation", `{"reason":"terminated","message_id":"m","failed_at":""}`, reject},
		// Go matches member names case-insensitively and keeps the last
		// of equal names; JSON Schema matches names exactly.
		{"member name upper-case", "taskComplete", `{"TASK_ID":"t"}`, "Go only"},
		{"member name in another case", "helpRequest", `{"Requester_Id":"a","help_type":"CODE_REVIEW","description":"d","urgency":"low"}`, "Go only"},
		{"member repeated in another case", "taskComplete", `{"task_id":"t","Task_ID":""}`, "schema only"},
		// Both parsers here keep the last of repeated names; a validator
		// whose parser keeps the first would accept this.
		{"member repeated", "taskComplete", `{"task_id":"t","task_id":""}`, reject},
		// A null payload is the zero value to Go, which a declined
		// handoff's answer may be; agentkit never sends a null payload
		// (the envelope omits it) and Call returns the zero value then.
		{"null handoff response", "taskHandoffResponse", `null`, "Go only"},
		// encoding/json reads numbers by spelling.
		{"integer with fraction", "helpResponse", `{"responder_id":"b","response_type":"DIRECT_ANSWER","estimated_effort":15.0}`, "schema only"},
		{"integer with exponent", "escalation", `{"reason":"terminated","message_id":"m","attempts":3e0}`, "schema only"},
		{"unsigned minus zero", "escalation", `{"reason":"terminated","message_id":"m","stream_seq":-0}`, "schema only"},
		{"float beyond float64", "taskUpdate", `{"task_id":"t","status":"pending","details":{},"progress":1e400}`, reject},
		{"float beyond float64 unbounded", "statusUpdate", `{"agent_id":"a","status":{"state":"IDLE","avg_response_time_ms":1e400}}`, "schema only"},
	} {
		d, ok := byDef[c.def]
		if !ok {
			t.Fatalf("%s: no definition %s", c.name, c.def)
		}
		schemaErr := validateAt(t, protocolID+"#/$defs/"+c.def, []byte(c.doc))
		goErr := d.check([]byte(c.doc))
		got := outcome(schemaErr == nil, goErr == nil)
		if got == "Decode only" {
			got = "Go only"
		}
		if got != c.want {
			t.Errorf("%s: got %s, want %s: %s", c.name, got, c.want, diffMsg([]byte(c.doc), schemaErr, goErr))
		}
	}
}
