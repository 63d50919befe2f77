package ackmonitor_test

import (
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/ackmonitor"
)

func TestRegistryDirectors(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	ctx := testCtx(t)
	js := m.jetstream()
	r := &ackmonitor.RegistryDirectors{JS: js, Bucket: "mesh_registry", Default: "director"}
	if d, err := r.Director(ctx, "planner"); err != nil || d != "director" {
		t.Fatalf("without a bucket: %q, %v", d, err)
	}
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "mesh_registry"})
	if err != nil {
		t.Fatal(err)
	}
	for key, val := range map[string]string{
		"planner":                   `{"director":"ops_director"}`,
		"agent.executor.inst1":      `{"id":"executor","director":"tech_director"}`,
		"agent.validator.inst1":     `{"id":"validator"}`,
		"agent.validator_old.inst1": `{"director":"someone_else"}`,
	} {
		if _, err := kv.PutString(ctx, key, val); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct{ give, want string }{
		{"planner", "ops_director"},   // key <agent>
		{"executor", "tech_director"}, // agentkit's agent.<id>.<instance> layout
		{"validator", "director"},     // no director field
		{"unknown", "director"},       // no key
	}
	for _, tt := range tests {
		if d, err := r.Director(ctx, tt.give); err != nil || d != tt.want {
			t.Errorf("Director(%q) = %q, %v; want %q", tt.give, d, err, tt.want)
		}
	}
}
