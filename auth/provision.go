package auth

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/bucket"
	"github.com/agentmesh-io/agentmesh/agentkit/registry"
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
// agentkit's EnsureStream does) and, for every agent, its seven durable
// consumers with the configuration agentkit would give them
// ([ConsumerConfigs]), created or updated, so re-running Provision after
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
		cfgs, err := ConsumerConfigs(scheme, a, policies)
		if err != nil {
			return err
		}
		for _, cfg := range cfgs {
			if opts.SampleFrequency != "" {
				cfg.SampleFrequency = opts.SampleFrequency
			}
			if _, err := js.CreateOrUpdateConsumer(ctx, stream, cfg); err != nil {
				return fmt.Errorf("auth: provision consumer %s on %s: %w", cfg.Durable, stream, err)
			}
		}
	}
	if opts.Registry {
		reg, err := registry.Open(ctx, js, scheme, replicas, true)
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

// ConsumerConfigs returns the durable consumers of agent a exactly as
// agentkit's Start creates them: one per priority ("<id>_<priority>",
// [agentkit.ConsumerConfig]) filtering its direct messages, and one per
// fan-out class ("<id>_fanout-<class>", [agentkit.FanoutConsumerConfig])
// filtering broadcasts and a's topics, with the policies given (a
// priority missing takes its default). An agent started with
// agentkit.WithFanoutActions() and no action binds none of the fan-out
// ones; the others bind both.
func ConsumerConfigs(s subjects.Scheme, a AgentSpec, policies map[wire.Priority]agentkit.DeliveryPolicy) ([]jetstream.ConsumerConfig, error) {
	var out []jetstream.ConsumerConfig
	for _, p := range wire.Priorities {
		cfg, err := agentkit.ConsumerConfig(s, a.ID, p, policies[p])
		if err != nil {
			return nil, fmt.Errorf("%w: agent %q: %w", ErrInvalidSpec, a.ID, err)
		}
		out = append(out, cfg)
	}
	for _, class := range subjects.FanoutClasses {
		cfg, err := agentkit.FanoutConsumerConfig(s, a.ID, class, policies[wire.Priority(subjects.FanoutPriorities(class)[0])], a.Topics)
		if err != nil {
			return nil, fmt.Errorf("%w: agent %q: %w", ErrInvalidSpec, a.ID, err)
		}
		out = append(out, cfg)
	}
	return out, nil
}
