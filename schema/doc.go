// Package schema embeds acl.schema.json, the ACL v1 envelope of
// [github.com/agentmesh-io/agentmesh/wire.Envelope] written as JSON Schema
// (draft 2020-12), for agents written in other languages and for tools that
// validate messages without linking agentkit.
//
// The schema describes the envelope exactly as agentkit encodes it: optional
// fields are omitted, never null or empty, and unknown fields are rejected.
// The tests in this package check that the schema and wire.Decode accept
// and reject the same example envelopes under testdata, so the two cannot
// drift apart unnoticed.
package schema

import _ "embed"

// ACL is the JSON Schema of the ACL v1 envelope. Its $id is
// https://agentmesh.io/schema/acl/v1.json. Do not modify the slice.
//
//go:embed acl.schema.json
var ACL []byte
