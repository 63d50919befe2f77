package agentkit

import (
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// Option configures an [Agent]; pass options to [New].
type Option interface{ apply(*options) error }

type optionFunc func(*options) error

func (f optionFunc) apply(o *options) error { return f(o) }

type options struct {
	scheme         subjects.Scheme
	agentType      string
	policies       map[wire.Priority]DeliveryPolicy
	concurrency    int
	logger         *slog.Logger
	errorHandler   func(error)
	maxEnvelope    int
	replicas       int
	provision      bool
	topics         []string
	fanoutActions  []string // nil: every handled action
	doubleAck      bool
	publishTimeout time.Duration
	attemptTimeout time.Duration // derived from publishTimeout in New
	requestTimeout time.Duration
	stopGrace      time.Duration
	register       bool
	// concurrentInstances: every instance consumes at once, rather than
	// taking turns (see turns).
	concurrentInstances bool
	heartbeat           time.Duration
	capabilities        []Capability
	director            string
	version             string
	breaker             BreakerSettings
	tracerProvider      trace.TracerProvider
	propagator          propagation.TextMapPropagator
	logPayloads         bool
	dedupWindow         time.Duration
	sampleFreq          string
	middleware          []Middleware
	hooks               hooks
	noTaskTracking      bool
	group               *Group
}

func defaultOptions() options {
	return options{
		scheme:         subjects.Default,
		policies:       DefaultPolicies(),
		concurrency:    8,
		logger:         slog.New(slog.DiscardHandler),
		maxEnvelope:    wire.DefaultMaxEnvelopeBytes,
		replicas:       1,
		provision:      true,
		publishTimeout: 10 * time.Second,
		requestTimeout: 30 * time.Second,
		stopGrace:      5 * time.Second,
		register:       true,
		heartbeat:      5 * time.Second,
		breaker:        DefaultBreakerSettings(),
		dedupWindow:    2 * time.Minute,
		sampleFreq:     "100",
	}
}

// WithScheme sets the naming scheme (subject prefix, stream and bucket
// names). Default: [subjects.Default], prefix "mesh".
func WithScheme(s subjects.Scheme) Option {
	return optionFunc(func(o *options) error {
		if s.Prefix() == "" {
			return fmt.Errorf("%w: zero subjects.Scheme", ErrInvalidOption)
		}
		o.scheme = s
		return nil
	})
}

// WithType sets the agent type written as sender_type (planner, executor,
// ...). Default: empty.
func WithType(agentType string) Option {
	return optionFunc(func(o *options) error { o.agentType = agentType; return nil })
}

// WithPolicy replaces the delivery policy of one priority. Default:
// [DefaultPolicies]. A field of policy left zero takes that priority's
// default (see each field for what its zero means). Policies apply when
// Start creates or updates the agent's consumers.
func WithPolicy(p wire.Priority, policy DeliveryPolicy) Option {
	return optionFunc(func(o *options) error {
		if !p.Valid() {
			return fmt.Errorf("%w: unknown priority %q", ErrInvalidOption, p)
		}
		policy = policy.withDefaults(p)
		if err := policy.validate(p); err != nil {
			return err
		}
		o.policies[p] = policy
		return nil
	})
}

// WithConcurrency sets how many handlers run at once for priorities high to
// batch. Critical messages always have one more worker of their own.
// Default: 8.
func WithConcurrency(n int) Option {
	return optionFunc(func(o *options) error {
		if n < 1 {
			return fmt.Errorf("%w: concurrency %d must be at least 1", ErrInvalidOption, n)
		}
		o.concurrency = n
		return nil
	})
}

// WithLogger sets the structured logger. Default: discard. Payloads are
// never logged.
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(o *options) error {
		if l == nil {
			return fmt.Errorf("%w: nil logger", ErrInvalidOption)
		}
		o.logger = l
		return nil
	})
}

// WithErrorHandler sets a callback for failures that happen in the
// background (a reply that could not be published, an ack that failed, a
// consumer error). It must be fast and safe for concurrent use.
// Default: the error is logged at warn level.
func WithErrorHandler(f func(error)) Option {
	return optionFunc(func(o *options) error { o.errorHandler = f; return nil })
}

// WithMaxEnvelopeBytes sets the largest envelope accepted on receipt;
// larger ones are terminated before decoding. Default:
// [wire.DefaultMaxEnvelopeBytes].
func WithMaxEnvelopeBytes(n int) Option {
	return optionFunc(func(o *options) error {
		if n < 256 {
			return fmt.Errorf("%w: max envelope bytes %d is below 256", ErrInvalidOption, n)
		}
		o.maxEnvelope = n
		return nil
	})
}

// WithReplicas sets the replica count used when Start creates the stream
// (1 on a single server, 3 on a cluster). Default: 1. An existing stream is
// never changed.
func WithReplicas(n int) Option {
	return optionFunc(func(o *options) error {
		if n < 1 || n > 5 {
			return fmt.Errorf("%w: replicas %d not in 1..5", ErrInvalidOption, n)
		}
		o.replicas = n
		return nil
	})
}

// WithProvisioning says whether Start creates the stream and the agent's
// consumers (true, the default) or expects an administrator to have
// created them and only binds to them (false, for agents whose credentials
// may not create JetStream resources).
func WithProvisioning(on bool) Option {
	return optionFunc(func(o *options) error { o.provision = on; return nil })
}

// WithGroup has the agent's direct messages delivered through g, the
// consumers its process's agents share, instead of five consumers of its
// own (see [Group]). The agent's scheme must be g's, and its delivery
// policies those of g's other agents. Broadcasts and topic messages are
// unchanged.
func WithGroup(g *Group) Option {
	return optionFunc(func(o *options) error {
		if g == nil {
			return fmt.Errorf("%w: nil group", ErrInvalidOption)
		}
		o.group = g
		return nil
	})
}

// WithTopics subscribes the agent to topics from the start; see also
// [Agent.Subscribe].
func WithTopics(topics ...string) Option {
	return optionFunc(func(o *options) error {
		for _, t := range topics {
			if err := subjects.ValidateToken("topic", t); err != nil {
				return fmt.Errorf("%w: %w", ErrInvalidID, err)
			}
		}
		o.topics = append(o.topics, topics...)
		return nil
	})
}

// WithFanoutActions declares which actions the agent handles when they
// come as a broadcast or a topic message; a fan-out message with any other
// action is acked unhandled and counted as [OutcomeIgnored], never
// terminated, dead-lettered or counted against the agent (a broadcast
// reaches every agent, and most have no business with most of them).
// Without this option every action with a handler is handled from
// fan-out too. Declaring none (WithFanoutActions()) gives the agent no
// fan-out consumers at all, so the broker sends it no broadcast or topic
// message: the cheapest setting for agents that only take direct work.
func WithFanoutActions(actions ...string) Option {
	return optionFunc(func(o *options) error {
		for _, a := range actions {
			if err := wire.ValidateAction(a); err != nil {
				return fmt.Errorf("%w: %w", ErrInvalidOption, err)
			}
		}
		o.fanoutActions = append([]string{}, actions...)
		return nil
	})
}

// WithDoubleAck makes successful handling wait for the server to confirm
// the ack (jetstream DoubleAck) instead of firing it and moving on.
// Default: false.
func WithDoubleAck(on bool) Option {
	return optionFunc(func(o *options) error { o.doubleAck = on; return nil })
}

// WithPublishTimeout bounds how long a send keeps retrying a publish the
// stream has not acknowledged, when the caller's context has no deadline.
// Each attempt waits a quarter of it for the stream's ack, at most 2s.
// Default: 10s.
func WithPublishTimeout(d time.Duration) Option {
	return optionFunc(func(o *options) error {
		if d <= 0 {
			return fmt.Errorf("%w: publish timeout must be positive", ErrInvalidOption)
		}
		o.publishTimeout = d
		return nil
	})
}

// WithRequestTimeout sets how long Request and SendAndWait wait when the
// caller's context has no deadline. Default: 30s.
func WithRequestTimeout(d time.Duration) Option {
	return optionFunc(func(o *options) error {
		if d <= 0 {
			return fmt.Errorf("%w: request timeout must be positive", ErrInvalidOption)
		}
		o.requestTimeout = d
		return nil
	})
}

// WithStopGrace sets how long [Agent.Stop], and [Agent.Drain] once its ctx
// has ended, wait for handlers whose context they cancelled. A handler
// still running then is abandoned: its message goes back for redelivery
// (another instance may handle it while the abandoned handler still runs),
// what the handler returns later is dropped, and the error handler hears
// [ErrHandlersAbandoned]. Default: 5s.
func WithStopGrace(d time.Duration) Option {
	return optionFunc(func(o *options) error {
		if d <= 0 {
			return fmt.Errorf("%w: stop grace must be positive", ErrInvalidOption)
		}
		o.stopGrace = d
		return nil
	})
}

// StreamConfig returns the configuration of the message stream for scheme:
// its exact subjects, Limits retention (terminated and exhausted messages
// stay readable for escalation and replay), 7 days MaxAge, a 2 minute
// duplicate window, fast batch publish (for [Agent.SendBatch]), room for
// [MaxStreamConsumers] consumers and the given replica count.
func StreamConfig(scheme subjects.Scheme, replicas int) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:         scheme.Stream(),
		Description:  "agentmesh messages",
		Subjects:     scheme.StreamSubjects(),
		Retention:    jetstream.LimitsPolicy,
		Storage:      jetstream.FileStorage,
		MaxAge:       7 * 24 * time.Hour,
		Duplicates:   2 * time.Minute,
		MaxConsumers: MaxStreamConsumers,
		Replicas:     replicas,
		// SendBatch's fast path (batchpub.go); servers before 2.14 ignore it.
		AllowBatchPublish: true,
	}
}

// MaxStreamConsumers is the message stream's own consumer limit. Every
// agent has up to seven consumers on it (five direct, two fan-out), and a
// server applies its default limit, 1,000 per stream, only to streams
// that set none: that default would stop a mesh at about 140 agents.
const MaxStreamConsumers = 100_000

// WithRegistration says whether Start registers the agent in the registry
// and heartbeats (true, the default). Agents that only send may turn it off.
func WithRegistration(on bool) Option {
	return optionFunc(func(o *options) error { o.register = on; return nil })
}

// WithConcurrentInstances lets every instance of the agent consume at
// once, splitting its messages between them, instead of taking turns (the
// default, see [Agent.Consuming]). It trades guarantees for throughput
// across instances: handled once and per-task order then hold within each
// instance only, so after a leader change lost an ack, a redelivery may
// run the handler again on another instance, and a task's messages may
// run on two instances at once. Instances without registration
// ([WithRegistration] false) always consume at once: turns are kept in
// the registry.
func WithConcurrentInstances() Option {
	return optionFunc(func(o *options) error { o.concurrentInstances = true; return nil })
}

// WithHeartbeat sets the heartbeat interval. The registry key lives for
// three intervals, so an agent that stops heartbeating is UNAVAILABLE after
// three missed beats. Above 1s/3 (the server's 1s minimum key TTL): at
// least 334.34ms.
// Default: 5s.
func WithHeartbeat(interval time.Duration) Option {
	return optionFunc(func(o *options) error {
		if interval < registryTTLFloor/3+time.Millisecond {
			return fmt.Errorf("%w: heartbeat %v below %v", ErrInvalidOption, interval, registryTTLFloor/3+time.Millisecond)
		}
		o.heartbeat = interval
		return nil
	})
}

// WithCapabilities declares what the agent can do, for discovery and
// fallback routing. Default: one capability named after the agent type (or
// id) listing every handled action.
func WithCapabilities(caps ...Capability) Option {
	return optionFunc(func(o *options) error {
		for _, c := range caps {
			if c.Name == "" {
				return fmt.Errorf("%w: capability without a name", ErrInvalidOption)
			}
		}
		o.capabilities = append(o.capabilities, caps...)
		return nil
	})
}

// WithDirector names the agent's director: the monitor escalates this
// agent's undeliverable messages to it.
func WithDirector(id string) Option {
	return optionFunc(func(o *options) error {
		if err := subjects.ValidateToken("director id", id); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidID, err)
		}
		o.director = id
		return nil
	})
}

// WithVersion sets the version the agent registers. Default: empty.
func WithVersion(v string) Option {
	return optionFunc(func(o *options) error { o.version = v; return nil })
}

// WithBreaker sets the circuit breaker kept per destination agent.
// Default: [DefaultBreakerSettings].
func WithBreaker(s BreakerSettings) Option {
	return optionFunc(func(o *options) error {
		if s.FailureThreshold < 1 || s.OpenTimeout <= 0 || s.HalfOpenRequests < 1 || s.NackThreshold < 1 || s.TimeoutThreshold < 1 {
			return fmt.Errorf("%w: breaker settings %+v", ErrInvalidOption, s)
		}
		o.breaker = s
		return nil
	})
}

// WithTracerProvider sets where send, request and handle spans go.
// Default: OpenTelemetry's global provider (a no-op until the application
// installs one).
func WithTracerProvider(tp trace.TracerProvider) Option {
	return optionFunc(func(o *options) error {
		if tp == nil {
			return fmt.Errorf("%w: nil TracerProvider", ErrInvalidOption)
		}
		o.tracerProvider = tp
		return nil
	})
}

// WithPropagator sets how trace context travels in NATS headers.
// Default: OpenTelemetry's global propagator (set it to
// propagation.TraceContext{} for W3C traceparent/tracestate).
func WithPropagator(p propagation.TextMapPropagator) Option {
	return optionFunc(func(o *options) error {
		if p == nil {
			return fmt.Errorf("%w: nil TextMapPropagator", ErrInvalidOption)
		}
		o.propagator = p
		return nil
	})
}

// WithPayloadLogging includes payloads in the debug log of handled
// messages. Default: off — payloads are never logged unless asked for.
func WithPayloadLogging(on bool) Option {
	return optionFunc(func(o *options) error { o.logPayloads = on; return nil })
}

// WithDedupWindow sets how long the agent remembers the messages it
// finished, so that a redelivery of one (after a consumer leader failed
// before replicating the ack) is acked without running the handler again:
// entries live between one and two windows, about 40 bytes each. 0 turns
// it off. Default: 2 minutes, the stream's duplicate window.
func WithDedupWindow(d time.Duration) Option {
	return optionFunc(func(o *options) error {
		if d < 0 {
			return fmt.Errorf("%w: negative dedup window", ErrInvalidOption)
		}
		o.dedupWindow = d
		return nil
	})
}

// WithSampleFrequency sets the consumers' ack sampling for the ack monitor:
// "100" (every ack, the default: exact ack times) down to "0" or "0%".
// NAK, TERM and MAX_DELIVERIES advisories are exact at any sampling; the
// monitor infers the ACKs of direct messages it is not told of from the
// consumers' ack floors, without ack times and up to a minute late, while
// unsampled ACKs of topic and broadcast messages go uncounted.
func WithSampleFrequency(freq string) Option {
	return optionFunc(func(o *options) error {
		v := strings.TrimSuffix(freq, "%")
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > 100 {
			return fmt.Errorf("%w: sample frequency %q is not 0..100 or 0%%..100%%", ErrInvalidOption, freq)
		}
		o.sampleFreq = freq
		return nil
	})
}
