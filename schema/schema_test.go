package schema_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/schema"
)

const schemaID = "https://agentmesh.io/schema/acl/v1.json"

// Invalid examples whose name ends in schemaAccepts are invalid to
// wire.Decode only, and TestExamples_Invalid pins that: Decode rejects what
// JSON Schema cannot express, such as duplicate members and integers
// written with an exponent.
const schemaAccepts = ".schema_accepts.json"

var compiled = sync.OnceValues(func() (*jsonschema.Schema, error) {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(schema.ACL))
	if err != nil {
		return nil, err
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.AssertFormat()
	if err := c.AddResource(schemaID, doc); err != nil {
		return nil, err
	}
	return c.Compile(schemaID)
})

// aclSchema returns the compiled embedded schema.
func aclSchema(tb testing.TB) *jsonschema.Schema {
	tb.Helper()
	sch, err := compiled()
	if err != nil {
		tb.Fatalf("compile acl.schema.json: %v", err)
	}
	return sch
}

// validate checks one JSON document against the schema.
func validate(tb testing.TB, data []byte) error {
	tb.Helper()
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(data))
	if err != nil {
		return err
	}
	return aclSchema(tb).Validate(inst)
}

// rawSchema returns the schema as a generic JSON value.
func rawSchema(tb testing.TB) map[string]any {
	tb.Helper()
	var m map[string]any
	if err := json.Unmarshal(schema.ACL, &m); err != nil {
		tb.Fatalf("acl.schema.json: %v", err)
	}
	return m
}

// examples returns the files of testdata/<dir> matching keep, failing when
// there are fewer than atLeast so a wrong glob cannot make a test vacuous.
func examples(tb testing.TB, dir string, atLeast int, keep func(name string) bool) map[string][]byte {
	tb.Helper()
	paths, err := filepath.Glob(filepath.Join("testdata", dir, "*.json"))
	if err != nil {
		tb.Fatal(err)
	}
	out := make(map[string][]byte)
	for _, p := range paths {
		if !keep(filepath.Base(p)) {
			continue
		}
		b, err := os.ReadFile(p)
		if err != nil {
			tb.Fatal(err)
		}
		out[filepath.Base(p)] = b
	}
	if len(out) < atLeast {
		tb.Fatalf("testdata/%s: %d examples, want at least %d", dir, len(out), atLeast)
	}
	return out
}

func TestSchema_Header(t *testing.T) {
	t.Parallel()
	aclSchema(t) // compiles and validates against the 2020-12 metaschema
	m := rawSchema(t)
	for key, want := range map[string]any{
		"$schema":              "https://json-schema.org/draft/2020-12/schema",
		"$id":                  schemaID,
		"type":                 "object",
		"additionalProperties": false,
	} {
		if got := m[key]; got != want {
			t.Errorf("%s = %v, want %v", key, got, want)
		}
	}
}

// TestSchema_Descriptions checks that every property, at any depth, has a
// description. Properties inside "if" are conditions, not declarations.
func TestSchema_Descriptions(t *testing.T) {
	t.Parallel()
	var walk func(path string, v any)
	count := 0
	walk = func(path string, v any) {
		switch v := v.(type) {
		case map[string]any:
			if props, ok := v["properties"].(map[string]any); ok {
				for name, p := range props {
					count++
					pm, _ := p.(map[string]any)
					if d, _ := pm["description"].(string); d == "" {
						t.Errorf("%s.properties.%s has no description", path, name)
					}
				}
			}
			for k, c := range v {
				if k == "if" {
					continue
				}
				walk(path+"."+k, c)
			}
		case []any:
			for _, c := range v {
				walk(path+"[]", c)
			}
		}
	}
	walk("$", rawSchema(t))
	if count < 30 {
		t.Errorf("found %d properties, want the envelope's, error's and trace's (at least 30)", count)
	}
}

// jsonFields returns the JSON names of t's fields and of those agentkit
// always writes (neither omitempty nor omitzero).
func jsonFields(t reflect.Type) (all, required []string) {
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if !f.IsExported() || tag == "-" {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		all = append(all, name)
		if o := strings.Split(opts, ","); !slices.Contains(o, "omitempty") && !slices.Contains(o, "omitzero") {
			required = append(required, name)
		}
	}
	slices.Sort(all)
	slices.Sort(required)
	return all, required
}

func keys(m map[string]any) []string { return slices.Sorted(maps.Keys(m)) }

func stringList(v any) []string {
	var out []string
	for _, s := range v.([]any) {
		out = append(out, s.(string))
	}
	return out
}

// TestSchema_FieldsMatchStructs fails when a field is added to or renamed in
// agentkit's Envelope, Error or Trace without updating the schema.
func TestSchema_FieldsMatchStructs(t *testing.T) {
	t.Parallel()
	m := rawSchema(t)
	defs := m["$defs"].(map[string]any)
	for _, tc := range []struct {
		name   string
		typ    reflect.Type
		schema map[string]any
	}{
		{"Envelope", reflect.TypeFor[wire.Envelope](), m},
		{"Error", reflect.TypeFor[wire.Error](), defs["error"].(map[string]any)},
		{"Trace", reflect.TypeFor[wire.Trace](), defs["trace"].(map[string]any)},
	} {
		all, _ := jsonFields(tc.typ)
		if got := keys(tc.schema["properties"].(map[string]any)); !slices.Equal(got, all) {
			t.Errorf("%s: schema properties %v, struct JSON fields %v", tc.name, got, all)
		}
		if tc.schema["additionalProperties"] != false {
			t.Errorf("%s: additionalProperties is not false", tc.name)
		}
	}
	// The envelope's required fields are exactly those agentkit always writes.
	_, required := jsonFields(reflect.TypeFor[wire.Envelope]())
	got := stringList(m["required"])
	slices.Sort(got)
	if !slices.Equal(got, required) {
		t.Errorf("required %v, Envelope fields without omitempty or omitzero %v", got, required)
	}
}

// TestSchema_EnumsMatchAgentkit fails when agentkit's closed sets and the
// schema's enums differ.
func TestSchema_EnumsMatchAgentkit(t *testing.T) {
	t.Parallel()
	m := rawSchema(t)
	props := m["properties"].(map[string]any)
	enum := func(v any) []string { return stringList(v.(map[string]any)["enum"]) }

	var priorities []string
	for _, p := range wire.Priorities {
		priorities = append(priorities, string(p))
	}
	if got, want := enum(props["priority"]), append(priorities, "medium"); !slices.Equal(got, want) {
		t.Errorf("priority enum %v, want %v", got, want)
	}
	for _, p := range enum(props["priority"]) {
		if _, err := wire.ParsePriority(p); err != nil {
			t.Errorf("schema priority %q: agentkit rejects it: %v", p, err)
		}
	}

	types := []wire.MessageType{wire.TypeRequest, wire.TypeResponse, wire.TypeNotification, wire.TypeError, wire.TypeAck}
	var typeNames []string
	for _, ty := range types {
		typeNames = append(typeNames, string(ty))
	}
	if got := enum(props["message_type"]); !slices.Equal(got, typeNames) {
		t.Errorf("message_type enum %v, want %v", got, typeNames)
	}
	for _, s := range enum(props["message_type"]) {
		if !wire.MessageType(s).Valid() {
			t.Errorf("schema message_type %q: agentkit rejects it", s)
		}
	}

	var codes []string
	for _, c := range wire.ErrorCodes {
		codes = append(codes, string(c))
	}
	errDef := m["$defs"].(map[string]any)["error"].(map[string]any)
	if got := enum(errDef["properties"].(map[string]any)["code"]); !slices.Equal(got, codes) {
		t.Errorf("error.code enum %v, want wire.ErrorCodes %v", got, codes)
	}
}

func TestExamples_Valid(t *testing.T) {
	t.Parallel()
	for name, data := range examples(t, "valid", 8, func(string) bool { return true }) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			if err := validate(t, data); err != nil {
				t.Errorf("schema rejects it: %v", err)
			}
			if _, err := wire.Decode(data); err != nil {
				t.Errorf("wire.Decode rejects it: %v", err)
			}
		})
	}
}

// TestExamples_Invalid checks that the schema and wire.Decode both
// reject every invalid example, except for the one-sided ones named with
// [schemaAccepts], which must stay one-sided: when both sides come to
// reject one, the test asks for the suffix to be dropped.
func TestExamples_Invalid(t *testing.T) {
	t.Parallel()
	for name, data := range examples(t, "invalid", 8, func(string) bool { return true }) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			wantSchemaOK := strings.HasSuffix(name, schemaAccepts)
			schemaErr := validate(t, data)
			_, decodeErr := wire.Decode(data)
			switch {
			case wantSchemaOK && schemaErr != nil:
				t.Errorf("schema now rejects it (%v): drop the %q suffix", schemaErr, schemaAccepts)
			case !wantSchemaOK && schemaErr == nil:
				t.Error("schema accepts it")
			}
			if !errors.Is(decodeErr, wire.ErrInvalidEnvelope) {
				t.Errorf("wire.Decode: err = %v, want ErrInvalidEnvelope", decodeErr)
			}
		})
	}
}

// TestEncode_MatchesSchema validates envelopes built and encoded by agentkit.
func TestEncode_MatchesSchema(t *testing.T) {
	t.Parallel()
	at := time.Date(2025, 8, 21, 10, 30, 0, 123456789, time.UTC)

	req := wire.NewEnvelope(wire.TypeRequest, "orchestrator_1", "plan_workflow")
	req.Priority = wire.PriorityHigh
	req.TTLMillis = 30_000
	req.SenderType = "orchestrator"
	req.ReceiverID = "planner-1"
	req.ReceiverType = "planner"
	req.Correlation = wire.NewCorrelationID("session_user_1692633600", "update CUST001", at)
	req.WorkflowID = "wf_12345"
	req.TaskID = "task_1"
	req.SessionID = "session_user_1692633600"
	req.RequiresAck = true
	req.Payload = json.RawMessage(`{"operation":"update","customer_id":"CUST001"}`)
	req.Context = json.RawMessage(`{"previousDecisions":["use JSONL"]}`)
	req.Metadata = map[string]string{"source": "test"}
	req.Trace = &wire.Trace{TraceID: "trace_123", SpanID: "span_456", ParentSpan: "span_123"}

	topic := wire.NewEnvelope(wire.TypeNotification, "agent-analyzer", "VerificationComplete")
	topic.Topic = "verification-complete"
	topic.Payload = json.RawMessage(`null`)

	nack := wire.NewError(wire.CodeBusy, "resource busy")
	nack.RetryAfterMS = 10_000
	nack.Details = map[string]any{"queue": 42.0}

	cases := map[string]*wire.Envelope{
		"request":   req,
		"topic":     topic,
		"broadcast": wire.NewEnvelope(wire.TypeNotification, "supervisor", "SystemShutdown"),
		"response":  req.NewResponse("planner-1", "plan_complete", json.RawMessage(`{"tasks":[]}`)),
		"ack":       req.NewAck("planner-1", nil, 230*time.Millisecond),
		"nack":      req.NewAck("planner-1", nack, 0),
	}
	for _, c := range wire.ErrorCodes {
		cases["error_"+string(c)] = req.NewErrorReply("planner-1", wire.NewError(c, ""))
	}
	for _, p := range wire.Priorities {
		e := wire.NewEnvelope(wire.TypeRequest, "a", "ping")
		e.Priority = p
		cases["priority_"+string(p)] = e
	}
	for name, e := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			data, err := e.Encode()
			if err != nil {
				t.Fatalf("Encode: %v", err)
			}
			if err := validate(t, data); err != nil {
				t.Errorf("schema rejects agentkit's encoding %s: %v", data, err)
			}
		})
	}
}

// diffBase is valid for every message type, so a fuzzed message_type only
// changes the one field under test.
const diffBase = `{"acl":"1","message_id":"m-1","message_type":"request","action":"a",
"priority":"normal","timestamp":"2025-08-21T10:30:00Z","sender_id":"s","receiver_id":"r",
"in_reply_to":"m-0","error":{"code":"BUSY","retryable":true}}`

// diffFields are the fields FuzzSchemaAgreesWithDecode replaces.
var diffFields = []string{"timestamp", "message_id", "priority", "message_type", "sender_id",
	"receiver_id", "topic", "correlation_id", "error.code", "action", "status", "sender_type", "task_id"}

// knownDivergence explains why the schema and Decode may disagree about v in
// field, or returns "" when they must agree.
func knownDivergence(field, v string, schemaOK, decodeOK bool) string {
	if field == "timestamp" && !decodeOK && schemaOK {
		if ts, err := time.Parse(time.RFC3339, v); err == nil && ts.IsZero() {
			return "the schema rejects the zero time only when written in UTC"
		}
	}
	return ""
}

// FuzzSchemaAgreesWithDecode replaces one field of a valid envelope with an
// arbitrary string and checks that the schema and wire.Decode agree.
func FuzzSchemaAgreesWithDecode(f *testing.F) {
	for _, seed := range []struct{ field, v string }{
		{"timestamp", "2025-08-21T10:30:00Z"},
		{"timestamp", "2025-08-21T10:30:00.123456789+02:00"},
		{"timestamp", "2025-08-21t10:30:00z"},
		{"timestamp", "2016-12-31T23:59:60Z"},
		{"timestamp", "2025-08-21T10:30:00,5Z"},
		{"timestamp", "2025-08-21T9:30:00Z"},
		{"timestamp", "0001-01-01T00:00:00Z"},
		{"timestamp", "2025-08-21T10:30:00+24:00"},
		{"message_id", "msg 001"},
		{"message_id", strings.Repeat("é", 200)},
		{"priority", "medium"},
		{"priority", "HIGH"},
		{"message_type", "ack"},
		{"message_type", "REQUEST"},
		{"sender_id", "planner_1"},
		{"sender_id", "a.b"},
		{"receiver_id", ""},
		{"topic", strings.Repeat("t", 65)},
		{"correlation_id", "session_user_1692633600_a7b2c9d4_1692633612"},
		{"error.code", "NOT_FOUND"},
		{"error.code", "not_found"},
		{"action", strings.Repeat("a", 257)},
		{"action", "plan\nworkflow"},
		{"status", "ok\u0085"},
		{"sender_type", "planner\x7f"},
		{"task_id", "t\r\nNats-Msg-Id: x"},
		{"message_id", "m\x01"},
	} {
		f.Add(uint8(slices.Index(diffFields, seed.field)), seed.v)
	}
	base := make(map[string]any)
	if err := json.Unmarshal([]byte(diffBase), &base); err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, sel uint8, v string) {
		field := diffFields[int(sel)%len(diffFields)]
		doc := make(map[string]any, len(base))
		for k, x := range base {
			doc[k] = x
		}
		if name, ok := strings.CutPrefix(field, "error."); ok {
			doc["error"] = map[string]any{name: v}
		} else {
			doc[field] = v
		}
		data, err := json.Marshal(doc)
		if err != nil {
			t.Fatal(err)
		}
		// json.Marshal replaced invalid UTF-8; compare against what both sides see.
		var seen map[string]any
		if err := json.Unmarshal(data, &seen); err != nil {
			t.Fatal(err)
		}
		if e, ok := seen["error"].(map[string]any); ok && field == "error.code" {
			v = e["code"].(string)
		} else if s, ok := seen[field].(string); ok {
			v = s
		}
		schemaErr := validate(t, data)
		_, decodeErr := wire.Decode(data)
		schemaOK, decodeOK := schemaErr == nil, decodeErr == nil
		if schemaOK == decodeOK || knownDivergence(field, v, schemaOK, decodeOK) != "" {
			return
		}
		t.Errorf("%s = %q: schema error %v, Decode error %v", field, v, schemaErr, decodeErr)
	})
}
