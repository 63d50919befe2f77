package auth

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/bucket"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// ProvisionOptions tune [Provision]. The zero value is usable.
type ProvisionOptions struct {
	// Replicas of the stream and buckets created. Default 1; use 3 on a
	// cluster. An existing message stream is never changed.
	Replicas int
	// Policies replaces the delivery policy of the priorities it lists, as
	// agentkit.WithPolicy would. Default: agentkit.DefaultPolicies.
	Policies map[wire.Priority]agentkit.DeliveryPolicy
	// SampleFrequency is the consumers' ack sampling for the ack monitor,
	// as agentkit.WithSampleFrequency would set it. Default: "100".
	SampleFrequency string
	// Registry also creates the registry bucket (needed when agents run
	// with registration on, see [Options.Registration]).
	Registry bool
	// Payloads also creates the object store of large envelopes (see
	// [Options.Payloads]).
	Payloads bool
}

// Provision creates, with administrator credentials, what isolated agents
// may not create themselves: the message stream (unless it exists, as
// agentkit's EnsureStream does) and, for every agent, its five durable
// consumers with the configuration agentkit would give them
// ([ConsumerConfig]), created or updated, so re-running Provision after
// changing an agent's topics updates its filters. Agents then run with
// agentkit.WithProvisioning(false) and bind to these consumers.
func Provision(ctx context.Context, js jetstream.JetStream, scheme subjects.Scheme, agents []AgentSpec, opts ProvisionOptions) error {
	replicas := max(opts.Replicas, 1)
	policies := agentkit.DefaultPolicies()
	for p, pol := range opts.Policies {
		policies[p] = pol
	}
	if err := agentkit.EnsureStream(ctx, js, agentkit.StreamConfig(scheme, replicas)); err != nil {
		return fmt.Errorf("auth: provision: %w", err)
	}
	stream := scheme.Stream()
	for _, a := range agents {
		for _, p := range wire.Priorities {
			cfg, err := ConsumerConfig(scheme, a, p, policies[p])
			if err != nil {
				return err
			}
			if opts.SampleFrequency != "" {
				cfg.SampleFrequency = opts.SampleFrequency
			}
			if _, err := js.CreateOrUpdateConsumer(ctx, stream, cfg); err != nil {
				return fmt.Errorf("auth: provision consumer %s on %s: %w", cfg.Durable, stream, err)
			}
		}
	}
	if opts.Registry {
		reg, err := agentkit.OpenRegistry(ctx, js, scheme, replicas, true)
		if err != nil {
			return fmt.Errorf("auth: provision: %w", err)
		}
		reg.Close()
	}
	if opts.Payloads {
		_, err := bucket.ObjectStore(ctx, js, bucket.Payloads(scheme, replicas), true)
		if err != nil {
			return fmt.Errorf("auth: provision payload store: %w", err)
		}
	}
	return nil
}

// ConsumerConfig returns the durable consumer of agent a at priority p
// exactly as agentkit's Start creates it: named "<id>_<priority>",
// filtering the agent's direct subject, broadcasts and a's topics at p,
// explicit acks, every delivery attempt's ack timeout from pol.BackOff,
// and every ack sampled for the monitor.
//
// It is [agentkit.ConsumerConfig] for a spec, so provisioned consumers are
// exactly those agentkit would create.
func ConsumerConfig(s subjects.Scheme, a AgentSpec, p wire.Priority, pol agentkit.DeliveryPolicy) (jetstream.ConsumerConfig, error) {
	cfg, err := agentkit.ConsumerConfig(s, a.ID, p, pol, a.Topics)
	if err != nil {
		return jetstream.ConsumerConfig{}, fmt.Errorf("%w: agent %q: %w", ErrInvalidSpec, a.ID, err)
	}
	return cfg, nil
}
