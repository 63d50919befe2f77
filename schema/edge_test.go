package schema_test

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/agentmesh-io/agentmesh/agentkit/wire"
)

// edgeBase is a valid direct request; each edge case changes one member.
const edgeBase = `{"acl":"1","message_id":"m-1","message_type":"request","action":"a",
"priority":"normal","timestamp":"2025-08-21T10:30:00Z","sender_id":"s","receiver_id":"r"}`

// The outcomes of an edge case: both sides accept it, both reject it, or
// only the schema accepts it because Decode rejects what JSON Schema
// cannot express (the reason says what).
const (
	accept = "accept"
	reject = "reject"
)

// edge is one envelope edge case: set replaces or adds members of
// edgeBase (a nil value deletes one), want is accept, reject or the reason
// why only the schema accepts it.
type edge struct {
	set  map[string]any
	want string
}

// raw is a member value written as is, so numbers keep their spelling.
type raw string

func (r raw) MarshalJSON() ([]byte, error) { return []byte(r), nil }

// del deletes a member.
var del = struct{}{}

// intOnlyWithoutFraction is why the schema alone accepts 6e5 or 600000.0:
// JSON Schema compares numbers by value, Decode reads integers by spelling.
const intOnlyWithoutFraction = "schema only: an integer written with a fraction or exponent"

// zeroTimeWithOffset is why the schema alone accepts the zero instant
// written with a non-zero offset: a pattern cannot compute the instant.
const zeroTimeWithOffset = "schema only: the zero time with a non-zero offset"

func envelopeEdges() map[string]edge {
	m := map[string]edge{
		// ttl_ms
		"ttl 600000":       {map[string]any{"ttl_ms": raw("600000")}, accept},
		"ttl 600000.0":     {map[string]any{"ttl_ms": raw("600000.0")}, intOnlyWithoutFraction},
		"ttl 6e5":          {map[string]any{"ttl_ms": raw("6e5")}, intOnlyWithoutFraction},
		"ttl 6E+5":         {map[string]any{"ttl_ms": raw("6E+5")}, intOnlyWithoutFraction},
		"ttl 1.5":          {map[string]any{"ttl_ms": raw("1.5")}, reject},
		"ttl max":          {map[string]any{"ttl_ms": raw(strconv.FormatInt(wire.MaxTTLMillis, 10))}, accept},
		"ttl above max":    {map[string]any{"ttl_ms": raw(strconv.FormatInt(wire.MaxTTLMillis+1, 10))}, reject},
		"ttl max int64":    {map[string]any{"ttl_ms": raw("9223372036854775807")}, reject},
		"ttl above int64":  {map[string]any{"ttl_ms": raw("9223372036854775808")}, reject},
		"ttl 1e400":        {map[string]any{"ttl_ms": raw("1e400")}, reject},
		"ttl negative":     {map[string]any{"ttl_ms": raw("-1")}, reject},
		"ttl minus zero":   {map[string]any{"ttl_ms": raw("-0")}, accept},
		"ttl zero":         {map[string]any{"ttl_ms": raw("0")}, accept},
		"ttl null":         {map[string]any{"ttl_ms": nil}, accept},
		"ttl string":       {map[string]any{"ttl_ms": "600000"}, reject},
		"ttl bool":         {map[string]any{"ttl_ms": true}, reject},
		"retry_after 1.0":  {map[string]any{"error": raw(`{"code":"BUSY","retry_after_ms":1.0}`)}, intOnlyWithoutFraction},
		"retry_after -5":   {map[string]any{"error": raw(`{"code":"BUSY","retry_after_ms":-5}`)}, accept},
		"retry_after null": {map[string]any{"error": raw(`{"code":"BUSY","retry_after_ms":null}`)}, accept},
		"retry_after str":  {map[string]any{"error": raw(`{"code":"BUSY","retry_after_ms":"5"}`)}, reject},

		// requires_ack, metadata, trace, error, payload, context
		"requires_ack null":     {map[string]any{"requires_ack": nil}, accept},
		"requires_ack string":   {map[string]any{"requires_ack": "true"}, reject},
		"metadata null":         {map[string]any{"metadata": nil}, accept},
		"metadata empty":        {map[string]any{"metadata": raw(`{}`)}, accept},
		"metadata value null":   {map[string]any{"metadata": raw(`{"a":null}`)}, accept},
		"metadata value number": {map[string]any{"metadata": raw(`{"a":1}`)}, reject},
		"metadata array":        {map[string]any{"metadata": raw(`[]`)}, reject},
		"trace null":            {map[string]any{"trace": nil}, accept},
		"trace empty":           {map[string]any{"trace": raw(`{}`)}, accept},
		"trace id empty":        {map[string]any{"trace": raw(`{"trace_id":"","span_id":null}`)}, accept},
		"trace unknown":         {map[string]any{"trace": raw(`{"traceId":"x"}`)}, reject},
		"error null":            {map[string]any{"error": nil}, accept},
		"error message empty":   {map[string]any{"error": raw(`{"code":"BUSY","message":""}`)}, accept},
		"error message null":    {map[string]any{"error": raw(`{"code":"BUSY","message":null}`)}, accept},
		"error details null":    {map[string]any{"error": raw(`{"code":"BUSY","details":null}`)}, accept},
		"error details array":   {map[string]any{"error": raw(`{"code":"BUSY","details":[]}`)}, reject},
		"error retryable null":  {map[string]any{"error": raw(`{"code":"BUSY","retryable":null}`)}, accept},
		"error code null":       {map[string]any{"error": raw(`{"code":null}`)}, reject},
		"error code empty":      {map[string]any{"error": raw(`{"code":""}`)}, reject},
		"error code Busy":       {map[string]any{"error": raw(`{"code":"Busy"}`)}, reject},
		"error unknown":         {map[string]any{"error": raw(`{"code":"BUSY","Message":"x"}`)}, reject},
		"error empty object":    {map[string]any{"error": raw(`{}`)}, reject},
		"payload null":          {map[string]any{"payload": nil}, accept},
		"payload string":        {map[string]any{"payload": ""}, accept},
		"context empty string":  {map[string]any{"context": ""}, accept},

		// message types and their conditional members
		"error type without error":   {map[string]any{"message_type": "error"}, reject},
		"error type with null error": {map[string]any{"message_type": "error", "error": nil}, reject},
		"error type with error":      {map[string]any{"message_type": "error", "error": raw(`{"code":"INTERNAL"}`)}, accept},
		"request action empty":       {map[string]any{"action": ""}, reject},
		"request action null":        {map[string]any{"action": nil}, reject},
		"request action missing":     {map[string]any{"action": del}, reject},
		"notification action empty":  {map[string]any{"message_type": "notification", "action": ""}, reject},
		"response action empty":      {map[string]any{"message_type": "response", "action": "", "in_reply_to": "m-0"}, accept},
		"response in_reply_to empty": {map[string]any{"message_type": "response", "in_reply_to": ""}, reject},
		"response in_reply_to null":  {map[string]any{"message_type": "response", "in_reply_to": nil}, reject},
		"ack in_reply_to missing":    {map[string]any{"message_type": "ack"}, reject},
		"ack in_reply_to set":        {map[string]any{"message_type": "ack", "in_reply_to": "m-0"}, accept},
		// Direct messages need receiver_id, but only the subject says a
		// message is direct: the runtime's routing check rejects it on
		// receipt, neither the schema nor Decode can.
		"direct request receiver missing": {map[string]any{"receiver_id": del}, accept},
		"receiver and topic both set":     {map[string]any{"topic": "t"}, accept},

		// enums in the wrong case, unknown members
		"priority medium":              {map[string]any{"priority": "medium"}, accept},
		"priority Medium":              {map[string]any{"priority": "Medium"}, reject},
		"priority Normal":              {map[string]any{"priority": "Normal"}, reject},
		"priority NORMAL":              {map[string]any{"priority": "NORMAL"}, reject},
		"priority empty":               {map[string]any{"priority": ""}, reject},
		"message_type Request":         {map[string]any{"message_type": "Request"}, reject},
		"message_type ACK":             {map[string]any{"message_type": "ACK", "in_reply_to": "m-0"}, reject},
		"acl 1 as number":              {map[string]any{"acl": raw("1")}, reject},
		"acl 1.0":                      {map[string]any{"acl": "1.0"}, reject},
		"unknown member":               {map[string]any{"extra": 1}, reject},
		"unknown member null":          {map[string]any{"extra": nil}, reject},
		"key in another case":          {map[string]any{"Receiver_id": "r"}, reject},
		"key camel case":               {map[string]any{"receiverId": "r"}, reject},
		"message_id with tab":          {map[string]any{"message_id": "m\t1"}, reject},
		"message_id 256 chars":         {map[string]any{"message_id": strings.Repeat("é", 256)}, accept},
		"message_id 257 chars":         {map[string]any{"message_id": strings.Repeat("m", 257)}, reject},
		"action with space":            {map[string]any{"action": "plan workflow"}, accept},
		"action 256 chars":             {map[string]any{"action": strings.Repeat("é", 256)}, accept},
		"action with DEL":              {map[string]any{"action": "a\x7f"}, reject},
		"action with NEL":              {map[string]any{"action": "a\u0085"}, reject},
		"action with line separator":   {map[string]any{"action": "a\u2028"}, accept},
		"sender_id 64 chars":           {map[string]any{"sender_id": strings.Repeat("s", 64)}, accept},
		"sender_id non-ASCII letter":   {map[string]any{"sender_id": "é"}, reject},
		"receiver_id wildcard":         {map[string]any{"receiver_id": "*"}, reject},
		"top-level empty object":       {map[string]any{"acl": del, "message_id": del, "message_type": del, "action": del, "priority": del, "timestamp": del, "sender_id": del, "receiver_id": del}, reject},
		"zero time in UTC":             {map[string]any{"timestamp": "0001-01-01T00:00:00Z"}, reject},
		"zero time with fraction":      {map[string]any{"timestamp": "0001-01-01T00:00:00.000Z"}, reject},
		"zero time +00:00":             {map[string]any{"timestamp": "0001-01-01T00:00:00+00:00"}, reject},
		"zero time -00:00":             {map[string]any{"timestamp": "0001-01-01T00:00:00-00:00"}, reject},
		"zero time +01:00":             {map[string]any{"timestamp": "0001-01-01T01:00:00+01:00"}, zeroTimeWithOffset},
		"zero time -01:00":             {map[string]any{"timestamp": "0000-12-31T23:00:00-01:00"}, zeroTimeWithOffset},
		"a second after the zero":      {map[string]any{"timestamp": "0001-01-01T00:00:01Z"}, accept},
		"year 0":                       {map[string]any{"timestamp": "0000-01-01T00:00:00Z"}, accept},
		"year 9999":                    {map[string]any{"timestamp": "9999-12-31T23:59:59Z"}, accept},
		"year 10000":                   {map[string]any{"timestamp": "10000-01-01T00:00:00Z"}, reject},
		"29 February 2024":             {map[string]any{"timestamp": "2024-02-29T00:00:00Z"}, accept},
		"29 February 2025":             {map[string]any{"timestamp": "2025-02-29T00:00:00Z"}, reject},
		"hour 24":                      {map[string]any{"timestamp": "2025-08-21T24:00:00Z"}, reject},
		"minute 60":                    {map[string]any{"timestamp": "2025-08-21T10:60:00Z"}, reject},
		"leap second":                  {map[string]any{"timestamp": "2016-12-31T23:59:60Z"}, reject},
		"offset +23:59":                {map[string]any{"timestamp": "2025-08-21T10:30:00+23:59"}, accept},
		"offset minute 60":             {map[string]any{"timestamp": "2025-08-21T10:30:00+02:60"}, reject},
		"offset without colon":         {map[string]any{"timestamp": "2025-08-21T10:30:00+0200"}, reject},
		"dot without fraction":         {map[string]any{"timestamp": "2025-08-21T10:30:00.Z"}, reject},
		"13-digit fraction":            {map[string]any{"timestamp": "2025-08-21T10:30:00.1234567891234Z"}, accept},
		"date only":                    {map[string]any{"timestamp": "2025-08-21"}, reject},
		"timestamp empty":              {map[string]any{"timestamp": ""}, reject},
		"timestamp null":               {map[string]any{"timestamp": nil}, reject},
		"timestamp unix seconds":       {map[string]any{"timestamp": raw("1755772200")}, reject},
		"timestamp with space":         {map[string]any{"timestamp": "2025-08-21 10:30:00Z"}, reject},
		"timestamp lower-case t and z": {map[string]any{"timestamp": "2025-08-21t10:30:00z"}, reject},
	}
	// Every optional string member reads null and "" as absent.
	for _, f := range []string{"sender_type", "receiver_id", "receiver_type", "topic", "correlation_id",
		"workflow_id", "task_id", "session_id", "in_reply_to", "status"} {
		m[f+" empty"] = edge{map[string]any{f: ""}, accept}
		m[f+" null"] = edge{map[string]any{f: nil}, accept}
		m[f+" number"] = edge{map[string]any{f: 1}, reject}
		m[f+" object"] = edge{map[string]any{f: raw(`{}`)}, reject}
	}
	// Every required member is neither null nor "".
	for _, f := range []string{"acl", "message_id", "message_type", "priority", "timestamp", "sender_id"} {
		m[f+" empty"] = edge{map[string]any{f: ""}, reject}
		m[f+" null"] = edge{map[string]any{f: nil}, reject}
		m[f+" missing"] = edge{map[string]any{f: del}, reject}
	}
	return m
}

// edgeDoc returns edgeBase with e's changes.
func edgeDoc(tb testing.TB, e edge) []byte {
	tb.Helper()
	doc := make(map[string]any)
	if err := json.Unmarshal([]byte(edgeBase), &doc); err != nil {
		tb.Fatal(err)
	}
	for k, v := range e.set {
		if v == del {
			delete(doc, k)
			continue
		}
		doc[k] = v
	}
	b, err := json.Marshal(doc)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// TestEnvelopeEdges checks that the schema and wire.Decode agree on each
// edge case, and that the few they cannot agree on stay one-sided.
func TestEnvelopeEdges(t *testing.T) {
	t.Parallel()
	for name, e := range envelopeEdges() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			data := edgeDoc(t, e)
			schemaErr := validate(t, data)
			_, decodeErr := wire.Decode(data)
			got := outcome(schemaErr == nil, decodeErr == nil)
			want := e.want
			if strings.HasPrefix(want, "schema only") {
				want = "schema only"
			}
			if got != want {
				t.Errorf("%s\n got %s, want %s\nschema: %v\nDecode: %v", data, got, e.want, schemaErr, decodeErr)
			}
		})
	}
}

// outcome names what the two sides did.
func outcome(schemaOK, decodeOK bool) string {
	switch {
	case schemaOK && decodeOK:
		return accept
	case !schemaOK && !decodeOK:
		return reject
	case schemaOK:
		return "schema only"
	}
	return "Decode only"
}
