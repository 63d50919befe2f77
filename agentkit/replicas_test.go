package agentkit_test

import (
	"errors"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/bucket"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// An agent asking for more replicas than the stream or registry has fails
// to start, saying so, instead of running on fewer unawares.
func TestStart_TooFewReplicas(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	m.started("first", nil) // creates the stream and registry, R1
	a := m.agent("second", agentkit.WithReplicas(3))
	err := a.Start(ctx(t))
	if !errors.Is(err, agentkit.ErrTooFewReplicas) {
		t.Fatalf("Start with R3 on an R1 stream: %v, want ErrTooFewReplicas", err)
	}
	t.Log(err)

	js, err := jetstream.New(m.conn())
	if err != nil {
		t.Fatal(err)
	}
	_, err = bucket.KeyValue(ctx(t), js, jetstream.KeyValueConfig{Bucket: subjects.Default.RegistryBucket(), Replicas: 3}, true)
	if !errors.Is(err, bucket.ErrTooFewReplicas) {
		t.Errorf("KeyValue with R3 on an R1 bucket: %v, want ErrTooFewReplicas", err)
	}
	if _, err := bucket.KeyValue(ctx(t), js, jetstream.KeyValueConfig{Bucket: subjects.Default.RegistryBucket(), Replicas: 1}, true); err != nil {
		t.Errorf("KeyValue with R1 on an R1 bucket: %v", err)
	}
}
