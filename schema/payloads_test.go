package schema_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/agentmesh-io/agentmesh/agentkit/protocol"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/schema"
)

const protocolID = "https://agentmesh.io/schema/protocol/v1.json"

// payloadDef ties a definition of protocol.schema.json to its Go type.
type payloadDef struct {
	def string       // the name under $defs
	typ reflect.Type // the Go type
	// check decodes data as agentkit does (encoding/json) and validates it.
	check func(data []byte) error
}

// decodeAndValidate returns check for a payload type T.
func decodeAndValidate[T interface{ Validate() error }]() func([]byte) error {
	return func(data []byte) error {
		var v T
		if err := json.Unmarshal(data, &v); err != nil {
			return err
		}
		return v.Validate()
	}
}

func def[T interface{ Validate() error }](name string) payloadDef {
	return payloadDef{name, reflect.TypeFor[T](), decodeAndValidate[T]()}
}

// payloadDefs lists every standard payload.
var payloadDefs = []payloadDef{
	def[protocol.TaskAssignment]("taskAssignment"),
	def[protocol.TaskHandoffRequest]("taskHandoffRequest"),
	def[protocol.TaskHandoffResponse]("taskHandoffResponse"),
	def[protocol.TaskUpdate]("taskUpdate"),
	def[protocol.TaskComplete]("taskComplete"),
	def[protocol.TaskFailure]("taskFailure"),
	def[protocol.HelpRequest]("helpRequest"),
	def[protocol.HelpResponse]("helpResponse"),
	def[protocol.StatusUpdate]("statusUpdate"),
	def[protocol.ErrorReport]("errorReport"),
	def[protocol.Escalation]("escalation"),
}

// compiler returns a compiler holding every embedded schema, asserting
// formats as a strict validator would.
func compiler(tb testing.TB) *jsonschema.Compiler {
	tb.Helper()
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.AssertFormat()
	for id, b := range map[string][]byte{schemaID: schema.ACL, protocolID: schema.Protocol, registryID: schema.Registry, alertID: schema.Alert} {
		doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
		if err != nil {
			tb.Fatalf("%s: %v", id, err)
		}
		if err := c.AddResource(id, doc); err != nil {
			tb.Fatalf("%s: %v", id, err)
		}
	}
	return c
}

var (
	compiledMu sync.Mutex
	compiledBy = map[string]*jsonschema.Schema{}
)

// compiledSchema returns the schema at url (an $id, with a fragment for a
// definition), compiled once.
func compiledSchema(tb testing.TB, url string) *jsonschema.Schema {
	tb.Helper()
	compiledMu.Lock()
	defer compiledMu.Unlock()
	if s, ok := compiledBy[url]; ok {
		return s
	}
	s, err := compiler(tb).Compile(url)
	if err != nil {
		tb.Fatalf("compile %s: %v", url, err)
	}
	compiledBy[url] = s
	return s
}

// validateAt checks data against the schema at url.
func validateAt(tb testing.TB, url string, data []byte) error {
	tb.Helper()
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(data))
	if err != nil {
		return err
	}
	return compiledSchema(tb, url).Validate(inst)
}

// rawDoc returns an embedded schema as a generic JSON value.
func rawDoc(tb testing.TB, b []byte) map[string]any {
	tb.Helper()
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		tb.Fatal(err)
	}
	return m
}

// resolve follows $ref (within doc) and the non-null branch of an anyOf
// until it reaches the schema that declares properties or items.
func resolve(tb testing.TB, doc, node map[string]any) map[string]any {
	tb.Helper()
	for range 8 {
		if ref, ok := node["$ref"].(string); ok {
			name, ok := strings.CutPrefix(ref, "#/$defs/")
			if !ok {
				tb.Fatalf("unexpected $ref %q", ref)
			}
			node = doc["$defs"].(map[string]any)[name].(map[string]any)
			continue
		}
		if alts, ok := node["anyOf"].([]any); ok {
			var next map[string]any
			for _, a := range alts {
				if am := a.(map[string]any); am["type"] != "null" {
					next = am
					break
				}
			}
			node = next
			continue
		}
		return node
	}
	tb.Fatal("$ref chain too long")
	return nil
}

// structFields returns t's JSON members: name → field type, embedded
// structs flattened as encoding/json does.
func structFields(t reflect.Type) map[string]reflect.Type {
	out := make(map[string]reflect.Type)
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if f.Anonymous && tag == "" && f.Type.Kind() == reflect.Struct {
			maps.Copy(out, structFields(f.Type))
			continue
		}
		if !f.IsExported() || tag == "-" {
			continue
		}
		name, _, _ := strings.Cut(tag, ",")
		if name == "" {
			name = f.Name
		}
		out[name] = f.Type
	}
	return out
}

var (
	timeType = reflect.TypeFor[time.Time]()
	rawType  = reflect.TypeFor[json.RawMessage]()
)

// checkFields fails where the Go type t and the schema node differ in
// member names, at any depth: nested structs, pointers to them and slices
// of them.
func checkFields(t *testing.T, path string, typ reflect.Type, doc, node map[string]any) {
	t.Helper()
	for typ.Kind() == reflect.Pointer {
		typ = typ.Elem()
	}
	switch {
	case typ == timeType || typ == rawType:
		return
	case typ.Kind() == reflect.Slice:
		if typ.Elem().Kind() == reflect.Struct && typ.Elem() != timeType {
			items, ok := resolve(t, doc, node)["items"].(map[string]any)
			if !ok {
				t.Errorf("%s: Go has a slice of %s, the schema no items", path, typ.Elem())
				return
			}
			checkFields(t, path+"[]", typ.Elem(), doc, items)
		}
		return
	case typ.Kind() != reflect.Struct:
		return
	}
	n := resolve(t, doc, node)
	props, _ := n["properties"].(map[string]any)
	fields := structFields(typ)
	if got, want := slices.Sorted(maps.Keys(props)), slices.Sorted(maps.Keys(fields)); !slices.Equal(got, want) {
		t.Errorf("%s (%s): schema properties %v, Go JSON fields %v", path, typ, got, want)
	}
	for name, ft := range fields {
		if p, ok := props[name].(map[string]any); ok {
			checkFields(t, path+"."+name, ft, doc, p)
		}
	}
}

// TestPayloads_FieldsMatchStructs fails when a field is added to, renamed
// in or removed from a payload type, at any depth, without the schema.
func TestPayloads_FieldsMatchStructs(t *testing.T) {
	t.Parallel()
	doc := rawDoc(t, schema.Protocol)
	defs := doc["$defs"].(map[string]any)
	for _, d := range payloadDefs {
		node, ok := defs[d.def].(map[string]any)
		if !ok {
			t.Errorf("no $defs/%s for %s", d.def, d.typ)
			continue
		}
		checkFields(t, d.def, d.typ, doc, node)
	}
}

// TestPayloads_EnumsMatchGo fails when a closed set of package protocol
// and the schema's enum differ.
func TestPayloads_EnumsMatchGo(t *testing.T) {
	t.Parallel()
	defs := rawDoc(t, schema.Protocol)["$defs"].(map[string]any)
	enum := func(def, prop string) []string {
		p := defs[def].(map[string]any)["properties"].(map[string]any)[prop].(map[string]any)
		if alts, ok := p["anyOf"].([]any); ok {
			p = alts[0].(map[string]any)
		}
		return stringList(p["enum"])
	}
	strs := func(vs ...string) []string { return vs }
	var priorities []string
	for _, p := range wire.Priorities {
		priorities = append(priorities, string(p))
	}
	for _, c := range []struct {
		def, prop string
		want      []string
	}{
		{"taskHandoffRequest", "reason", names(protocol.HandoffReasons)},
		{"helpRequest", "help_type", names(protocol.HelpTypes)},
		{"helpRequest", "urgency", names(protocol.Urgencies)},
		{"helpResponse", "response_type", names(protocol.HelpResponseTypes)},
		{"resourceReference", "type", names(protocol.ReferenceTypes)},
		{"agentStatusInfo", "state", names(protocol.AgentStates)},
		{"errorReport", "error_type", names(protocol.ErrorTypes)},
		{"errorReport", "severity", names(protocol.Severities)},
		{"taskUpdate", "status", names(protocol.TaskStatuses)},
		{"recoveryAttempt", "outcome", strs(protocol.RecoverySuccess, protocol.RecoveryFailure, protocol.RecoveryPartial)},
		{"taskContext", "priority", append(priorities, "medium")},
		{"escalation", "reason", strs("max_deliveries", "terminated")},
	} {
		if got := enum(c.def, c.prop); !slices.Equal(got, c.want) {
			t.Errorf("%s.%s enum %v, Go %v", c.def, c.prop, got, c.want)
		}
	}
}

// names returns the strings of a closed set.
func names[S ~string](vs []S) []string {
	out := make([]string, len(vs))
	for i, v := range vs {
		out[i] = string(v)
	}
	return out
}

// TestPayloads_Descriptions checks that every definition and property has
// a description; properties inside "if" are conditions.
func TestPayloads_Descriptions(t *testing.T) {
	t.Parallel()
	for name, b := range map[string][]byte{"protocol": schema.Protocol, "registry": schema.Registry, "alert": schema.Alert} {
		count := describedProperties(t, name, rawDoc(t, b))
		if count < 10 {
			t.Errorf("%s: %d properties, want at least 10", name, count)
		}
	}
}

// describedProperties fails on a property without a description and
// returns how many it saw.
func describedProperties(t *testing.T, name string, doc map[string]any) int {
	t.Helper()
	count := 0
	var walk func(path string, v any)
	walk = func(path string, v any) {
		switch v := v.(type) {
		case map[string]any:
			if props, ok := v["properties"].(map[string]any); ok {
				for pn, p := range props {
					count++
					if d, _ := p.(map[string]any)["description"].(string); d == "" {
						t.Errorf("%s: %s.properties.%s has no description", name, path, pn)
					}
				}
			}
			for k, c := range v {
				if k != "if" {
					walk(path+"."+k, c)
				}
			}
		case []any:
			for _, c := range v {
				walk(path+"[]", c)
			}
		}
	}
	walk("$", doc)
	return count
}

// diffMsg describes a disagreement.
func diffMsg(data []byte, schemaErr, goErr error) string {
	return fmt.Sprintf("%s\nschema: %v\nGo: %v", data, schemaErr, goErr)
}

// reflectTypeOf is reflect.TypeOf, named for the table above.
func reflectTypeOf(v any) reflect.Type { return reflect.TypeOf(v) }
