// Package conformance checks that an agent, in any language, behaves on
// the wire as PROTOCOL.md says: a shared test suite in the manner of
// Watermill's pub/sub tests, run against one agent by id on any NATS
// server.
//
// [Run] acts as a peer agent written from PROTOCOL.md with nothing but
// nats.go, its jetstream package and the envelope codec of agentkit/wire
// (never the agentkit runtime, which is what it tests). It sends the agent
// requests, notifications, expired, malformed, spoofed and large messages
// and observes what the agent does with them: the replies it publishes
// (read from stream MESH), how it settles each message (the server's
// TERM advisories and ack metrics), its consumers' configuration, its
// registry record and heartbeats.
//
// The agent under test must be running, must handle the test actions
// [ActionEcho] and [ActionReject] (PROTOCOL.md, "Conformance kit"), and
// must not share its id with anything else.
//
// The kit's connection needs more rights than an isolated agent's: the
// JetStream API on MESH and the registry and payload buckets, and
// subscriptions to the advisory subjects ($JS.EVENT.>). Run it as the
// administrator or on a server without authorization.
//
// From the command line, against a running agent:
//
//	go test -modfile=go_test.mod ./conformance -run 'TestAgent$' -args -nats=nats://127.0.0.1:4222 -agent=planner_1
package conformance
