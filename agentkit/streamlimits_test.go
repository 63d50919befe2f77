package agentkit_test

import (
	"context"
	"errors"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
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

// An account that caps consumers per stream below the stream's own limit
// still gets its stream, under the account's cap, and the agent past the
// cap fails to start saying so.
func TestStart_AccountConsumerLimit(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	if err := m.s.GlobalAccount().UpdateJetStreamLimits(map[string]server.JetStreamAccountLimits{
		"": {MaxConsumers: 10, MaxMemory: -1, MaxStore: -1, MaxStreams: -1, MaxAckPending: -1},
	}); err != nil {
		t.Fatal(err)
	}
	m.started("first", map[string]agentkit.HandlerFunc{"work": func(context.Context, *agentkit.Message) error { return nil }})
	err := m.agent("second").Start(ctx(t))
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) || apiErr.ErrorCode != jetstream.JSErrCodeMaximumConsumersLimit {
		t.Fatalf("the agent past the account's cap: %v, want the server's consumer limit error", err)
	}
}
