// Package schema embeds the JSON Schemas (draft 2020-12) of what agentmesh
// puts on the wire, for agents written in other languages and for tools
// that validate messages without linking agentkit:
//
//   - acl.schema.json: the ACL v1 envelope
//     ([github.com/agentmesh-io/agentmesh/agentkit/wire.Envelope]);
//   - protocol.schema.json: the payloads of the standard actions (package
//     agentkit/protocol), one definition each under $defs;
//   - registry.schema.json: an agent instance's registry record
//     (agentkit/registry.Instance);
//   - alert.schema.json: the alert the ack monitor publishes
//     (ackmonitor.AlertEvent).
//
// The tests keep each schema and its Go type equal: the same member names
// at every depth, and the same verdict on tables of edge cases (and, for
// the envelope and the payloads, on fuzzed or exhaustively varied
// documents). TestAjvStrict compiles them in Ajv's strict mode and checks
// that Ajv gives the same verdicts (ajv/check.mjs; it needs Node.js).
//
// The schema accepts what wire.Decode accepts: agentkit omits optional
// fields it has no value for, and a receiver reads an optional member that
// is null or "" as absent; unknown fields are rejected. The tests in this
// package check that the schema and wire.Decode accept and reject the same
// envelopes (the examples under testdata and a table of edge cases), so the
// two cannot drift apart unnoticed. The few envelopes only Decode rejects
// are those JSON Schema cannot express: duplicate members, integers written
// with a fraction or an exponent, the zero time written with a non-zero
// offset.
package schema

import _ "embed"

// ACL is the JSON Schema of the ACL v1 envelope. Its $id is
// https://agentmesh.io/schema/acl/v1.json. Do not modify the slice.
//
//go:embed acl.schema.json
var ACL []byte

// Protocol holds the JSON Schemas of the standard payloads, under $defs:
// validate a task.assign payload against
// https://agentmesh.io/schema/protocol/v1.json#/$defs/taskAssignment. Do
// not modify the slice.
//
//go:embed protocol.schema.json
var Protocol []byte

// Registry is the JSON Schema of a registry record. Its $id is
// https://agentmesh.io/schema/registry/v1.json. Do not modify the slice.
//
//go:embed registry.schema.json
var Registry []byte

// Alert is the JSON Schema of an ack monitor alert. Its $id is
// https://agentmesh.io/schema/alert/v1.json. Do not modify the slice.
//
//go:embed alert.schema.json
var Alert []byte
