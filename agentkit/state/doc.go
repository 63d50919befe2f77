// Package state is the mesh's shared state and sessions in KV: [State]
// keeps TASK, AGENT, RESOURCE and POLICY entities in bucket mesh_state
// with compare-and-swap updates and a change feed ([State.Watch]);
// [TaskState.Record] holds the rules by which the task.* messages of a task
// make its state; [Sessions] keeps sessions (participants, decisions,
// artifacts) in bucket mesh_sessions, expiring on their own.
//
// Both stores are built on package bucket (create-or-bind, the
// compare-and-swap loop) and name their keys through package subjects.
// The runtime opens them for an agent (agentkit's Agent.State) and
// records task.* messages as they are acked; any program with a JetStream
// context can open them too ([Open], [OpenSessions]).
package state
