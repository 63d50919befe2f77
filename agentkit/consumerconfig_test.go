package agentkit_test

import (
	"slices"
	"testing"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// ConsumerConfig, which administrators use to provision agents' consumers,
// fills a policy's zero fields from the priority's defaults as WithPolicy
// does; it refused a policy without MaxAckPending.
func TestConsumerConfig_ZeroFieldsTakeDefaults(t *testing.T) {
	t.Parallel()
	for _, p := range wire.Priorities {
		def := agentkit.DefaultPolicies()[p]
		cfg, err := agentkit.ConsumerConfig(subjects.Default, "a", p, agentkit.DeliveryPolicy{})
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		if !slices.Equal(cfg.BackOff, def.BackOff) || cfg.MaxDeliver != def.MaxDeliver || cfg.MaxAckPending != def.MaxAckPending {
			t.Errorf("%s: backoff %v max deliver %d max ack pending %d, want %v %d %d", p, cfg.BackOff, cfg.MaxDeliver,
				cfg.MaxAckPending, def.BackOff, def.MaxDeliver, def.MaxAckPending)
		}
	}
}
