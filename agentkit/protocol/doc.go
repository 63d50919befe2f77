// Package protocol is the catalogue of agentmesh's standard payloads: the
// well-known actions (task.assign, task.handoff, help.request,
// agent.status, error.report, escalation, ...) and the JSON payload each
// carries in an envelope's payload ([TaskAssignment], [TaskHandoffRequest]
// and [TaskHandoffResponse], [TaskUpdate], [HelpRequest] and
// [HelpResponse], [StatusUpdate], [ErrorReport], [Escalation], ...).
//
// Each payload's Validate method checks its required fields and enums; the
// enums are open on the wire (unknown values decode) and closed by
// Validate. Errors match wire.ErrInvalidEnvelope and are a
// *wire.ValidationError naming the field, as "payload.task_id".
//
// The types only describe the data. Sending and handling them is the
// runtime's job: agentkit's Agent.Handoff, Agent.RequestHelp,
// Agent.ReportError, Agent.ReportStatus and Call.
package protocol
