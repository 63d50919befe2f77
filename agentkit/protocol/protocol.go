package protocol

import (
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/agentmesh-io/agentmesh/agentkit/wire"
)

// The actions of the standard protocols. Each carries the payload
// type named beside it.
const (
	ActionTaskAssign   = "task.assign"   // TaskAssignment, request
	ActionTaskHandoff  = "task.handoff"  // TaskHandoffRequest, answered by TaskHandoffResponse
	ActionTaskUpdate   = "task.update"   // TaskUpdate, notification
	ActionTaskComplete = "task.complete" // TaskComplete, notification
	ActionTaskFailed   = "task.failed"   // TaskFailure, notification
	ActionHelpRequest  = "help.request"  // HelpRequest, answered by HelpResponse
	ActionHelpResponse = "help.response" // HelpResponse, the response action
	ActionAgentStatus  = "agent.status"  // StatusUpdate, notification
	ActionErrorReport  = "error.report"  // ErrorReport, notification
	ActionEscalation   = "escalation"    // Escalation, from the ack monitor to a director
)

// HandoffReason says why a task is handed to another agent.
type HandoffReason string

// The handoff reasons.
const (
	HandoffCapabilityLimit HandoffReason = "CAPABILITY_LIMIT"
	HandoffRateLimit       HandoffReason = "RATE_LIMIT"
	HandoffErrorRecovery   HandoffReason = "ERROR_RECOVERY"
	HandoffEscalation      HandoffReason = "ESCALATION"
	HandoffLoadBalancing   HandoffReason = "LOAD_BALANCING"
)

// HandoffReasons lists every handoff reason.
var HandoffReasons = []HandoffReason{HandoffCapabilityLimit, HandoffRateLimit, HandoffErrorRecovery, HandoffEscalation, HandoffLoadBalancing}

// Valid reports whether r is one of [HandoffReasons].
func (r HandoffReason) Valid() bool { return slices.Contains(HandoffReasons, r) }

// HelpType says what kind of help is asked for.
type HelpType string

// The help types.
const (
	HelpTechnicalGuidance   HelpType = "TECHNICAL_GUIDANCE"
	HelpDebuggingAssistance HelpType = "DEBUGGING_ASSISTANCE"
	HelpCodeReview          HelpType = "CODE_REVIEW"
	HelpArchitectureAdvice  HelpType = "ARCHITECTURE_ADVICE"
	HelpResourceSharing     HelpType = "RESOURCE_SHARING"
)

// HelpTypes lists every help type.
var HelpTypes = []HelpType{HelpTechnicalGuidance, HelpDebuggingAssistance, HelpCodeReview, HelpArchitectureAdvice, HelpResourceSharing}

// Valid reports whether t is one of [HelpTypes].
func (t HelpType) Valid() bool { return slices.Contains(HelpTypes, t) }

// HelpResponseType says how a helper answers.
type HelpResponseType string

// The help response types.
const (
	ResponseDirectAnswer         HelpResponseType = "DIRECT_ANSWER"
	ResponseResourceProvision    HelpResponseType = "RESOURCE_PROVISION"
	ResponseCollaborativeSession HelpResponseType = "COLLABORATIVE_SESSION"
	ResponseEscalation           HelpResponseType = "ESCALATION"
	ResponseUnableToHelp         HelpResponseType = "UNABLE_TO_HELP"
)

// HelpResponseTypes lists every help response type.
var HelpResponseTypes = []HelpResponseType{ResponseDirectAnswer, ResponseResourceProvision, ResponseCollaborativeSession, ResponseEscalation, ResponseUnableToHelp}

// Valid reports whether t is one of [HelpResponseTypes].
func (t HelpResponseType) Valid() bool { return slices.Contains(HelpResponseTypes, t) }

// Urgency is how soon help is needed.
type Urgency string

// The urgencies.
const (
	UrgencyLow      Urgency = "low"
	UrgencyMedium   Urgency = "medium"
	UrgencyHigh     Urgency = "high"
	UrgencyCritical Urgency = "critical"
)

// Urgencies lists every urgency, lowest first.
var Urgencies = []Urgency{UrgencyLow, UrgencyMedium, UrgencyHigh, UrgencyCritical}

// Valid reports whether u is one of [Urgencies].
func (u Urgency) Valid() bool { return slices.Contains(Urgencies, u) }

// Severity is how bad a reported error is.
type Severity string

// The severities.
const (
	SeverityLow      Severity = "low"
	SeverityMedium   Severity = "medium"
	SeverityHigh     Severity = "high"
	SeverityCritical Severity = "critical"
)

// Severities lists every severity, lowest first.
var Severities = []Severity{SeverityLow, SeverityMedium, SeverityHigh, SeverityCritical}

// Valid reports whether s is one of [Severities].
func (s Severity) Valid() bool { return slices.Contains(Severities, s) }

// AgentState is an agent's working state in a [StatusUpdate]. It is what
// the agent says about itself; the registry's AgentStatus (package
// agentkit) is its lifecycle as the mesh sees it.
type AgentState string

// The agent states.
const (
	AgentStateIdle        AgentState = "IDLE"
	AgentStateBusy        AgentState = "BUSY"
	AgentStateError       AgentState = "ERROR"
	AgentStateOffline     AgentState = "OFFLINE"
	AgentStateMaintenance AgentState = "MAINTENANCE"
)

// AgentStates lists every agent state.
var AgentStates = []AgentState{AgentStateIdle, AgentStateBusy, AgentStateError, AgentStateOffline, AgentStateMaintenance}

// Valid reports whether s is one of [AgentStates].
func (s AgentState) Valid() bool { return slices.Contains(AgentStates, s) }

// ErrorType classifies a reported error. It is finer than the
// envelope's [wire.ErrorCode], which only says what the sender should do.
type ErrorType string

// The error types.
const (
	ErrorTypeTimeout           ErrorType = "TIMEOUT"
	ErrorTypeRateLimit         ErrorType = "RATE_LIMIT"
	ErrorTypeValidation        ErrorType = "VALIDATION_ERROR"
	ErrorTypeNetwork           ErrorType = "NETWORK_ERROR"
	ErrorTypeAuthentication    ErrorType = "AUTHENTICATION_ERROR"
	ErrorTypeResourceExhausted ErrorType = "RESOURCE_EXHAUSTED"
	ErrorTypeInternal          ErrorType = "INTERNAL_ERROR"
	ErrorTypeExternalService   ErrorType = "EXTERNAL_SERVICE_ERROR"
)

// ErrorTypes lists every error type.
var ErrorTypes = []ErrorType{ErrorTypeTimeout, ErrorTypeRateLimit, ErrorTypeValidation, ErrorTypeNetwork,
	ErrorTypeAuthentication, ErrorTypeResourceExhausted, ErrorTypeInternal, ErrorTypeExternalService}

// Valid reports whether t is one of [ErrorTypes].
func (t ErrorType) Valid() bool { return slices.Contains(ErrorTypes, t) }

// ReferenceType says what a [ResourceReference] points to.
type ReferenceType string

// The reference types.
const (
	ReferenceDocumentation ReferenceType = "documentation"
	ReferenceCode          ReferenceType = "code"
	ReferenceAPI           ReferenceType = "api"
	ReferenceExample       ReferenceType = "example"
	ReferenceTool          ReferenceType = "tool"
)

// ReferenceTypes lists every reference type.
var ReferenceTypes = []ReferenceType{ReferenceDocumentation, ReferenceCode, ReferenceAPI, ReferenceExample, ReferenceTool}

// Valid reports whether t is one of [ReferenceTypes].
func (t ReferenceType) Valid() bool { return slices.Contains(ReferenceTypes, t) }

// The outcomes of a [RecoveryAttempt].
const (
	RecoverySuccess = "success"
	RecoveryFailure = "failure"
	RecoveryPartial = "partial"
)

// TaskEvent is one entry of a task's history.
type TaskEvent struct {
	Timestamp time.Time      `json:"timestamp"`
	EventType string         `json:"event_type"`
	AgentID   string         `json:"agent_id,omitempty"`
	Details   map[string]any `json:"details"`
}

// TaskContext is what an agent needs to know to work on a task.
type TaskContext struct {
	TaskID       string         `json:"task_id"`
	TaskType     string         `json:"task_type"`
	Priority     wire.Priority  `json:"priority,omitempty"` // empty: not set
	Metadata     map[string]any `json:"metadata"`
	Dependencies []string       `json:"dependencies"` // ids of tasks this one waits for
	History      []TaskEvent    `json:"history"`
}

// validate checks c as the field named at.
func (c *TaskContext) validate(at string) error {
	if c.Priority != "" && !c.Priority.Valid() {
		return invalid(at+".priority", fmt.Sprintf("unknown priority %q", string(c.Priority)))
	}
	return nil
}

// TaskConstraints bound how a task may be done. Zero values mean no
// constraint.
type TaskConstraints struct {
	MaxTokens            int        `json:"max_tokens,omitempty"`
	Deadline             *time.Time `json:"deadline,omitempty"`
	RequiredCapabilities []string   `json:"required_capabilities"`
	BudgetUSD            float64    `json:"budget_usd,omitempty"`
	QualityThreshold     float64    `json:"quality_threshold,omitempty"` // 0-1
}

// validate checks c as the field named at.
func (c *TaskConstraints) validate(at string) error {
	switch {
	case c.MaxTokens < 0:
		return invalid(at+".max_tokens", "negative")
	case c.BudgetUSD < 0:
		return invalid(at+".budget_usd", "negative")
	case c.QualityThreshold < 0 || c.QualityThreshold > 1:
		return invalid(at+".quality_threshold", "outside 0-1")
	}
	return nil
}

// ResourceReference points to something that helps.
type ResourceReference struct {
	Type        ReferenceType `json:"type"`
	URL         string        `json:"url"`
	Title       string        `json:"title"`
	Description string        `json:"description,omitempty"`
}

// TaskAssignment asks an agent to do a task (action [ActionTaskAssign]).
type TaskAssignment struct {
	TaskID      string           `json:"task_id"`
	TaskType    string           `json:"task_type"`
	Description string           `json:"description"`
	Context     *TaskContext     `json:"context,omitempty"`
	Constraints *TaskConstraints `json:"constraints,omitempty"`
	Deadline    *time.Time       `json:"deadline,omitempty"`
}

// Validate checks the required fields (task_id, task_type) and the enums.
// The error matches [wire.ErrInvalidEnvelope] and is a [*wire.ValidationError] naming
// the field.
func (t TaskAssignment) Validate() error {
	if t.TaskID == "" {
		return invalid("payload.task_id", "required")
	}
	if t.TaskType == "" {
		return invalid("payload.task_type", "required")
	}
	if t.Context != nil {
		if err := t.Context.validate("payload.context"); err != nil {
			return err
		}
	}
	if t.Constraints != nil {
		return t.Constraints.validate("payload.constraints")
	}
	return nil
}

// TaskHandoffRequest asks an agent to take over a task (action
// [ActionTaskHandoff]). A zero Deadline means none and is left
// out of the JSON.
type TaskHandoffRequest struct {
	TaskID      string          `json:"task_id"`
	FromAgent   string          `json:"from_agent"`
	ToAgent     string          `json:"to_agent"`
	Reason      HandoffReason   `json:"reason"`
	Context     TaskContext     `json:"context"`
	Constraints TaskConstraints `json:"constraints"`
	Deadline    time.Time       `json:"deadline,omitzero"`
}

// Validate checks the required fields (task_id, from_agent, to_agent) and
// the enums. The error matches [wire.ErrInvalidEnvelope] and is a
// [*wire.ValidationError] naming the field.
func (r TaskHandoffRequest) Validate() error {
	switch {
	case r.TaskID == "":
		return invalid("payload.task_id", "required")
	case r.FromAgent == "":
		return invalid("payload.from_agent", "required")
	case r.ToAgent == "":
		return invalid("payload.to_agent", "required")
	case !r.Reason.Valid():
		return invalid("payload.reason", fmt.Sprintf("unknown handoff reason %q", string(r.Reason)))
	}
	if err := r.Context.validate("payload.context"); err != nil {
		return err
	}
	return r.Constraints.validate("payload.constraints")
}

// TaskHandoffResponse answers a [TaskHandoffRequest]. A declined
// handoff has Accepted false and says why in Error.
type TaskHandoffResponse struct {
	Accepted            bool             `json:"accepted"`
	AgentID             string           `json:"agent_id"`
	EstimatedCompletion time.Time        `json:"estimated_completion,omitzero"`
	Requirements        []string         `json:"requirements"`
	Constraints         *TaskConstraints `json:"constraints,omitempty"`
	Error               string           `json:"error,omitempty"`
}

// Validate checks that an accepted handoff names the agent taking it. The
// error matches [wire.ErrInvalidEnvelope].
func (r TaskHandoffResponse) Validate() error {
	if r.Accepted && r.AgentID == "" {
		return invalid("payload.agent_id", "required when accepted")
	}
	if r.Constraints != nil {
		return r.Constraints.validate("payload.constraints")
	}
	return nil
}

// TaskUpdate reports progress on a task (action [ActionTaskUpdate]).
type TaskUpdate struct {
	TaskID   string         `json:"task_id"`
	Status   TaskStatus     `json:"status"`
	Progress float64        `json:"progress"` // 0-1
	Message  string         `json:"message,omitempty"`
	Details  map[string]any `json:"details,omitempty"`
}

// Validate checks task_id, the status and that progress is within 0-1. The
// error matches [wire.ErrInvalidEnvelope].
func (u TaskUpdate) Validate() error {
	switch {
	case u.TaskID == "":
		return invalid("payload.task_id", "required")
	case !u.Status.Valid():
		return invalid("payload.status", fmt.Sprintf("unknown task status %q", string(u.Status)))
	case u.Progress < 0 || u.Progress > 1:
		return invalid("payload.progress", "outside 0-1")
	}
	return nil
}

// TaskComplete reports a finished task and its result (action
// [ActionTaskComplete]).
type TaskComplete struct {
	TaskID string          `json:"task_id"`
	Result json.RawMessage `json:"result,omitempty"`
}

// Validate checks task_id. The error matches [wire.ErrInvalidEnvelope].
func (c TaskComplete) Validate() error {
	if c.TaskID == "" {
		return invalid("payload.task_id", "required")
	}
	return nil
}

// TaskFailure reports a task that failed for good (action [ActionTaskFailed]).
// It is not called TaskFailed, the name of the [TaskStatus] constant.
type TaskFailure struct {
	TaskID string      `json:"task_id"`
	Error  ErrorReport `json:"error"`
}

// Validate checks task_id and the error report. The error matches
// [wire.ErrInvalidEnvelope].
func (f TaskFailure) Validate() error {
	if f.TaskID == "" {
		return invalid("payload.task_id", "required")
	}
	return f.Error.validate("payload.error")
}

// HelpContext is where a help requester stands.
type HelpContext struct {
	CurrentState       string   `json:"current_state"`
	ErrorDetails       string   `json:"error_details,omitempty"`
	AttemptedSolutions []string `json:"attempted_solutions"`
}

// HelpRequest asks another agent for help (action [ActionHelpRequest]).
type HelpRequest struct {
	RequesterID string      `json:"requester_id"`
	TaskID      string      `json:"task_id"`
	HelpType    HelpType    `json:"help_type"`
	Description string      `json:"description"`
	Context     HelpContext `json:"context"`
	Urgency     Urgency     `json:"urgency"`
	Deadline    *time.Time  `json:"deadline,omitempty"`
}

// Validate checks the required fields (requester_id, description) and the
// enums (help_type, urgency). The error matches [wire.ErrInvalidEnvelope].
func (r HelpRequest) Validate() error {
	switch {
	case r.RequesterID == "":
		return invalid("payload.requester_id", "required")
	case !r.HelpType.Valid():
		return invalid("payload.help_type", fmt.Sprintf("unknown help type %q", string(r.HelpType)))
	case r.Description == "":
		return invalid("payload.description", "required")
	case !r.Urgency.Valid():
		return invalid("payload.urgency", fmt.Sprintf("unknown urgency %q", string(r.Urgency)))
	}
	return nil
}

// HelpResponse answers a [HelpRequest]. RequestID is the
// message id of the request.
type HelpResponse struct {
	ResponderID            string              `json:"responder_id"`
	RequestID              string              `json:"request_id"`
	ResponseType           HelpResponseType    `json:"response_type"`
	Content                string              `json:"content"`
	Resources              []ResourceReference `json:"resources,omitempty"`
	FollowUpRequired       bool                `json:"follow_up_required"`
	EstimatedEffortMinutes int                 `json:"estimated_effort"` // minutes
}

// Validate checks responder_id, the response type, the resources and that
// the effort is not negative. The error matches [wire.ErrInvalidEnvelope].
func (r HelpResponse) Validate() error {
	switch {
	case r.ResponderID == "":
		return invalid("payload.responder_id", "required")
	case !r.ResponseType.Valid():
		return invalid("payload.response_type", fmt.Sprintf("unknown help response type %q", string(r.ResponseType)))
	case r.EstimatedEffortMinutes < 0:
		return invalid("payload.estimated_effort", "negative")
	}
	for i, res := range r.Resources {
		if !res.Type.Valid() {
			return invalid(fmt.Sprintf("payload.resources[%d].type", i), fmt.Sprintf("unknown reference type %q", string(res.Type)))
		}
	}
	return nil
}

// AgentStatusInfo is an agent's own account of its state. It is not called
// AgentStatus, the name agentkit's registry gives an agent's lifecycle.
type AgentStatusInfo struct {
	State             AgentState `json:"state"`
	CapabilityLevel   int        `json:"capability_level"` // 0-100
	ErrorRate         float64    `json:"error_rate"`       // 0-1
	AvgResponseTimeMS float64    `json:"avg_response_time_ms"`
	LastHeartbeat     time.Time  `json:"last_heartbeat"`
}

// ResourceUsage is what an agent has consumed.
type ResourceUsage struct {
	TokensUsed      int64   `json:"tokens_used"`
	TokensRemaining int64   `json:"tokens_remaining"`
	CostUSD         float64 `json:"cost_usd"`
	CPUUsage        float64 `json:"cpu_usage"`    // 0-100
	MemoryUsage     float64 `json:"memory_usage"` // 0-100
}

// HealthMetrics summarise an agent's health.
type HealthMetrics struct {
	UptimeSeconds int64      `json:"uptime_seconds"`
	SuccessRate   float64    `json:"success_rate"` // 0-1
	AvgLatencyMS  float64    `json:"avg_latency_ms"`
	ErrorCount    int64      `json:"error_count"`
	LastError     *time.Time `json:"last_error,omitempty"`
}

// StatusUpdate is an agent's periodic report about itself (action
// [ActionAgentStatus]).
type StatusUpdate struct {
	AgentID       string          `json:"agent_id"`
	Status        AgentStatusInfo `json:"status"`
	CurrentTasks  []string        `json:"current_tasks"`
	ResourceUsage ResourceUsage   `json:"resource_usage"`
	HealthMetrics HealthMetrics   `json:"health_metrics"`
	NextAvailable *time.Time      `json:"next_available,omitempty"`
}

// Validate checks agent_id, the state and the ranges of the rates and
// percentages. The error matches [wire.ErrInvalidEnvelope].
func (s StatusUpdate) Validate() error {
	switch {
	case s.AgentID == "":
		return invalid("payload.agent_id", "required")
	case !s.Status.State.Valid():
		return invalid("payload.status.state", fmt.Sprintf("unknown agent state %q", string(s.Status.State)))
	case s.Status.CapabilityLevel < 0 || s.Status.CapabilityLevel > 100:
		return invalid("payload.status.capability_level", "outside 0-100")
	case !inUnitRange(s.Status.ErrorRate):
		return invalid("payload.status.error_rate", "outside 0-1")
	case !inUnitRange(s.HealthMetrics.SuccessRate):
		return invalid("payload.health_metrics.success_rate", "outside 0-1")
	case s.ResourceUsage.CPUUsage < 0 || s.ResourceUsage.CPUUsage > 100:
		return invalid("payload.resource_usage.cpu_usage", "outside 0-100")
	case s.ResourceUsage.MemoryUsage < 0 || s.ResourceUsage.MemoryUsage > 100:
		return invalid("payload.resource_usage.memory_usage", "outside 0-100")
	}
	return nil
}

// inUnitRange reports whether f is within 0-1.
func inUnitRange(f float64) bool { return f >= 0 && f <= 1 }

// RecoveryAttempt is one thing an agent tried to recover from an error.
type RecoveryAttempt struct {
	AttemptNumber int       `json:"attempt_number"`
	Timestamp     time.Time `json:"timestamp"`
	Strategy      string    `json:"strategy"`
	Outcome       string    `json:"outcome"` // RecoverySuccess, RecoveryFailure or RecoveryPartial
	Details       string    `json:"details"`
}

// ErrorReport describes a failure (action [ActionErrorReport]).
// Context holds input_data, configuration and environment, each optional.
type ErrorReport struct {
	ErrorID          string            `json:"error_id"`
	AgentID          string            `json:"agent_id"`
	TaskID           string            `json:"task_id,omitempty"`
	ErrorType        ErrorType         `json:"error_type"`
	Severity         Severity          `json:"severity"`
	Message          string            `json:"message"`
	StackTrace       string            `json:"stack_trace,omitempty"`
	Context          map[string]any    `json:"context"`
	RecoveryAttempts []RecoveryAttempt `json:"recovery_attempts"`
	SuggestedActions []string          `json:"suggested_actions"`
}

// Validate checks the required fields (error_id, agent_id, message) and the
// enums (error_type, severity, recovery outcomes). The error matches
// [wire.ErrInvalidEnvelope].
func (r ErrorReport) Validate() error { return r.validate("payload") }

func (r *ErrorReport) validate(at string) error {
	switch {
	case r.ErrorID == "":
		return invalid(at+".error_id", "required")
	case r.AgentID == "":
		return invalid(at+".agent_id", "required")
	case !r.ErrorType.Valid():
		return invalid(at+".error_type", fmt.Sprintf("unknown error type %q", string(r.ErrorType)))
	case !r.Severity.Valid():
		return invalid(at+".severity", fmt.Sprintf("unknown severity %q", string(r.Severity)))
	case r.Message == "":
		return invalid(at+".message", "required")
	}
	for i, a := range r.RecoveryAttempts {
		switch a.Outcome {
		case RecoverySuccess, RecoveryFailure, RecoveryPartial:
		default:
			return invalid(fmt.Sprintf("%s.recovery_attempts[%d].outcome", at, i), fmt.Sprintf("unknown outcome %q (want success, failure or partial)", a.Outcome))
		}
	}
	return nil
}

// Escalation tells a director that a message could not be delivered or
// handled (action [ActionEscalation]). The
// ack monitor sends it when a message exhausts its deliveries and, when so
// configured, when one is terminated.
type Escalation struct {
	// Reason is "max_deliveries" (exhausted) or "terminated".
	Reason    string `json:"reason"`
	MessageID string `json:"message_id"` // the original message's id
	Sender    string `json:"sender"`
	Receiver  string `json:"receiver"`
	Consumer  string `json:"consumer"`
	Priority  string `json:"priority"`
	Subject   string `json:"subject"`
	StreamSeq uint64 `json:"stream_seq"`
	// Attempts is the number of deliveries made.
	Attempts int `json:"attempts"`
	Naks     int `json:"naks"`
	Timeouts int `json:"timeouts"`
	// Reasons lists what each failed delivery ended with: "delivery 1: NAK",
	// "delivery 2: TERM NOT_FOUND: ...", "delivery 3: MAX_DELIVERIES".
	Reasons       []string `json:"reasons"`
	CorrelationID string   `json:"correlation_id,omitempty"`
	WorkflowID    string   `json:"workflow_id,omitempty"`
	InReplyTo     string   `json:"in_reply_to,omitempty"`
	// Original is the original envelope (JSON) when the stream still has it.
	Original   json.RawMessage `json:"original,omitempty"`
	DLQSubject string          `json:"dlq_subject"`
	DLQSeq     uint64          `json:"dlq_seq"`
	SentAt     time.Time       `json:"sent_at,omitzero"`
	FailedAt   time.Time       `json:"failed_at"`
}

// Validate checks message_id, the reason and that counts are not negative.
// The error matches [wire.ErrInvalidEnvelope].
func (e Escalation) Validate() error {
	switch {
	case e.MessageID == "":
		return invalid("payload.message_id", "required")
	case e.Reason != "max_deliveries" && e.Reason != "terminated":
		return invalid("payload.reason", fmt.Sprintf("unknown reason %q (want max_deliveries or terminated)", e.Reason))
	case e.Attempts < 0 || e.Naks < 0 || e.Timeouts < 0:
		return invalid("payload.attempts", "negative count")
	}
	return nil
}

// TaskStatus is the lifecycle state of a task, as a [TaskUpdate] reports it
// and agentkit's task state keeps it.
type TaskStatus string

// The task statuses.
const (
	TaskPending    TaskStatus = "pending"
	TaskInProgress TaskStatus = "in_progress"
	TaskCompleted  TaskStatus = "completed"
	TaskFailed     TaskStatus = "failed"
	TaskCancelled  TaskStatus = "cancelled"
)

// TaskStatuses lists every task status.
var TaskStatuses = []TaskStatus{TaskPending, TaskInProgress, TaskCompleted, TaskFailed, TaskCancelled}

// Valid reports whether s is one of [TaskStatuses].
func (s TaskStatus) Valid() bool { return slices.Contains(TaskStatuses, s) }

// Terminal reports whether s is final: completed, failed or cancelled.
func (s TaskStatus) Terminal() bool {
	return s == TaskCompleted || s == TaskFailed || s == TaskCancelled
}

// invalid returns the error of a payload field that fails validation.
func invalid(field, reason string) error { return &wire.ValidationError{Field: field, Reason: reason} }
