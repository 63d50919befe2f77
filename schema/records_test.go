package schema_test

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/agentmesh-io/agentmesh/ackmonitor"
	"github.com/agentmesh-io/agentmesh/ackmonitor/store"
	"github.com/agentmesh-io/agentmesh/agentkit/registry"
	"github.com/agentmesh-io/agentmesh/schema"
)

const (
	registryID = "https://agentmesh.io/schema/registry/v1.json"
	alertID    = "https://agentmesh.io/schema/alert/v1.json"
)

// TestRecords_FieldsMatchStructs fails when a field of the registry record
// or the alert is added, renamed or removed without its schema.
func TestRecords_FieldsMatchStructs(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		doc []byte
		typ reflect.Type
	}{
		{schema.Registry, reflect.TypeFor[registry.Instance]()},
		{schema.Alert, reflect.TypeFor[ackmonitor.AlertEvent]()},
	} {
		doc := rawDoc(t, c.doc)
		checkFields(t, c.typ.String(), c.typ, doc, doc)
	}
}

// TestRecords_Required checks that the schemas require exactly the members
// Go always writes (neither omitempty nor omitzero).
func TestRecords_Required(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		doc []byte
		v   any
	}{
		{schema.Registry, registry.Instance{}},
		{schema.Alert, ackmonitor.AlertEvent{}},
	} {
		var zero map[string]any
		if err := json.Unmarshal(must(json.Marshal(c.v)), &zero); err != nil {
			t.Fatal(err)
		}
		got := stringList(rawDoc(t, c.doc)["required"])
		if len(got) != len(zero) {
			t.Errorf("%T: required %v, Go always writes %v", c.v, got, keys(zero))
		}
		for _, k := range got {
			if _, ok := zero[k]; !ok {
				t.Errorf("%T: %s is required but omitted when zero", c.v, k)
			}
		}
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// TestRegistry_Records checks what agentkit writes against the schema, and
// that the values a writer must not use fail it. Go's readers have no
// Validate: they take any record that decodes.
func TestRegistry_Records(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 1, 10, 14, 30, 0, 123456789, time.UTC)
	full := registry.Instance{ID: "planner_1", Instance: "i-1", Type: "planner", Version: "1.2.0",
		Capabilities: []registry.Capability{{Name: "plan", Version: "1", Actions: []string{"plan_workflow"}}, {Name: "bare"}},
		Director:     "supervisor", Status: registry.StatusBusy, Load: 0.5, InFlight: 2, Concurrency: 4, LastHeartbeat: at, TTLSeconds: 15}
	for name, c := range map[string]struct {
		v    registry.Instance
		want bool
	}{
		"full":            {full, true},
		"minimal":         {registry.Instance{ID: "a", Instance: "i", Status: registry.StatusReady, LastHeartbeat: at}, true},
		"every status":    {full, true},
		"status lower":    {with(full, func(in *registry.Instance) { in.Status = "ready" }), false},
		"status empty":    {with(full, func(in *registry.Instance) { in.Status = "" }), false},
		"id with dot":     {with(full, func(in *registry.Instance) { in.ID = "a.b" }), false},
		"no instance":     {with(full, func(in *registry.Instance) { in.Instance = "" }), false},
		"negative load":   {with(full, func(in *registry.Instance) { in.Load = -0.1 }), false},
		"capability name": {with(full, func(in *registry.Instance) { in.Capabilities = []registry.Capability{{}} }), false},
		"negative ttl":    {with(full, func(in *registry.Instance) { in.TTLSeconds = -1 }), false},
	} {
		data := must(json.Marshal(c.v))
		if err := validateAt(t, registryID, data); (err == nil) != c.want {
			t.Errorf("%s: %s: schema error %v, want valid %v", name, data, err, c.want)
		}
	}
	for _, s := range []registry.Status{registry.StatusInitializing, registry.StatusReady, registry.StatusBusy,
		registry.StatusStopping, registry.StatusStopped, registry.StatusUnavailable} {
		data := must(json.Marshal(with(full, func(in *registry.Instance) { in.Status = s })))
		if err := validateAt(t, registryID, data); err != nil {
			t.Errorf("status %s: %v", s, err)
		}
	}
}

// TestRegistry_HostRecords checks a host record as agentkit writes it
// against the schema's host definition, and values a writer must not use.
func TestRegistry_HostRecords(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 1, 10, 14, 30, 0, 0, time.UTC)
	full := registry.Host{Group: "proc1", Instance: "i-1", LastHeartbeat: at, TTLSeconds: 15,
		Members: map[string]registry.MemberState{"planner_1": {Status: registry.StatusReady, Load: 0.25, InFlight: 1}}}
	for name, c := range map[string]struct {
		v    registry.Host
		want bool
	}{
		"full":           {full, true},
		"no members":     {registry.Host{Group: "g", Instance: "i", Members: map[string]registry.MemberState{}, LastHeartbeat: at}, true},
		"group with dot": {with(full, func(h *registry.Host) { h.Group = "a.b" }), false},
		"member id": {with(full, func(h *registry.Host) {
			h.Members = map[string]registry.MemberState{"a.b": {Status: registry.StatusReady}}
		}), false},
		"member status": {with(full, func(h *registry.Host) { h.Members = map[string]registry.MemberState{"a": {Status: "ready"}} }), false},
	} {
		data := must(json.Marshal(c.v))
		if err := validateAt(t, registryID+"#/$defs/host", data); (err == nil) != c.want {
			t.Errorf("%s: %s: schema error %v, want valid %v", name, data, err, c.want)
		}
	}
}

// TestAlert_Events checks alerts as the monitor publishes them against the
// schema, and that values the monitor never writes fail it.
func TestAlert_Events(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 1, 10, 14, 30, 0, 0, time.UTC)
	raised := ackmonitor.AlertEvent{Alert: store.Alert{ID: "a1", Agent: "planner_1", Kind: ackmonitor.AlertAckRate,
		Severity: "warning", Value: 0.8, Threshold: 0.9, Samples: 120, RaisedAt: at},
		State: ackmonitor.AlertRaised, WindowSeconds: 300, Monitor: "mon-1"}
	for name, c := range map[string]struct {
		v    ackmonitor.AlertEvent
		want bool
	}{
		"raised":        {raised, true},
		"escalated":     {with(raised, func(e *ackmonitor.AlertEvent) { e.Severity, e.Previous = "critical", "warning" }), true},
		"resolved":      {with(raised, func(e *ackmonitor.AlertEvent) { e.State, e.ResolvedAt = ackmonitor.AlertResolved, at.Add(time.Minute) }), true},
		"timeout rate":  {with(raised, func(e *ackmonitor.AlertEvent) { e.Kind, e.Value, e.Threshold = ackmonitor.AlertTimeoutRate, 0.3, 0.1 }), true},
		"invalid rate":  {with(raised, func(e *ackmonitor.AlertEvent) { e.Kind = ackmonitor.AlertInvalidRate }), true},
		"mesh-wide":     {with(raised, func(e *ackmonitor.AlertEvent) { e.Agent = ackmonitor.MeshAgent }), true},
		"severity info": {with(raised, func(e *ackmonitor.AlertEvent) { e.Severity = "info" }), false},
		"unknown kind":  {with(raised, func(e *ackmonitor.AlertEvent) { e.Kind = "nak_rate" }), false},
		"no state":      {with(raised, func(e *ackmonitor.AlertEvent) { e.State = "" }), false},
		"rate above 1":  {with(raised, func(e *ackmonitor.AlertEvent) { e.Value = 1.5 }), false},
		"no window":     {with(raised, func(e *ackmonitor.AlertEvent) { e.WindowSeconds = 0 }), false},
	} {
		data := must(json.Marshal(c.v))
		if err := validateAt(t, alertID, data); (err == nil) != c.want {
			t.Errorf("%s: %s: schema error %v, want valid %v", name, data, err, c.want)
		}
	}
}

// with returns v changed by f.
func with[T any](v T, f func(*T)) T {
	f(&v)
	return v
}
