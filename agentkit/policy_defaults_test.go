package agentkit_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// A policy that sets only its ack timeouts starts an agent whose consumer
// has the priority's default attempts and MaxAckPending, not a rejection.
func TestWithPolicy_PartialPolicyStartsWithDefaults(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	backoff := []time.Duration{3 * time.Second, 6 * time.Second}
	m.started("partial", nil, agentkit.WithPolicy(wire.PriorityNormal, agentkit.DeliveryPolicy{BackOff: backoff}))

	js, err := jetstream.New(m.conn())
	if err != nil {
		t.Fatal(err)
	}
	name, err := subjects.Default.Consumer("partial", string(wire.PriorityNormal))
	if err != nil {
		t.Fatal(err)
	}
	cons, err := js.Consumer(ctx(t), subjects.Default.Stream(), name)
	if err != nil {
		t.Fatal(err)
	}
	cfg := cons.CachedInfo().Config
	def := agentkit.DefaultPolicies()[wire.PriorityNormal]
	if cfg.MaxAckPending != def.MaxAckPending || cfg.MaxDeliver != def.MaxDeliver || cfg.AckWait != backoff[0] {
		t.Fatalf("consumer MaxAckPending %d, MaxDeliver %d, AckWait %v; want %d, %d, %v",
			cfg.MaxAckPending, cfg.MaxDeliver, cfg.AckWait, def.MaxAckPending, def.MaxDeliver, backoff[0])
	}
}
