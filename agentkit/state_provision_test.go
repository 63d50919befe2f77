package agentkit_test

import (
	"errors"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/state"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// An agent without provisioning rights binds its shared state to the
// bucket an administrator created and never creates it: a missing bucket
// is an error, and State binds once the bucket exists.
func TestAgentState_WithoutProvisioningOnlyBinds(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	js, err := jetstream.New(m.conn())
	if err != nil {
		t.Fatal(err)
	}
	a := m.agent("worker", agentkit.WithProvisioning(false), agentkit.WithRegistration(false))
	if _, err := a.State(ctx(t)); !errors.Is(err, jetstream.ErrBucketNotFound) {
		t.Fatalf("State without a bucket: %v, want ErrBucketNotFound", err)
	}
	if _, err := js.KeyValue(ctx(t), subjects.Default.StateBucket()); !errors.Is(err, jetstream.ErrBucketNotFound) {
		t.Fatalf("the state bucket after State without provisioning: %v, want none", err)
	}

	admin, err := state.Open(ctx(t), js, subjects.Default, 1, true)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Create(ctx(t), state.EntityPolicy, "p1", map[string]int{"limit": 3}); err != nil {
		t.Fatal(err)
	}
	shared, err := a.State(ctx(t))
	if err != nil {
		t.Fatalf("State once the bucket exists: %v", err)
	}
	if _, err := shared.Get(ctx(t), state.EntityPolicy, "p1"); err != nil {
		t.Fatalf("Get through the bound state: %v", err)
	}
}
