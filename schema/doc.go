// Package schema embeds acl.schema.json, the ACL v1 envelope of
// [github.com/agentmesh-io/agentmesh/agentkit/wire.Envelope] written as JSON
// Schema (draft 2020-12), for agents written in other languages and for
// tools that validate messages without linking agentkit.
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
