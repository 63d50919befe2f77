package agentkit

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
	"go.opentelemetry.io/otel"

	"github.com/agentmesh-io/agentmesh/agentkit/bucket"
	"github.com/agentmesh-io/agentmesh/agentkit/registry"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/internal/bound"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// Agent is one agent's connection to the mesh: it sends envelopes, and once
// started it consumes its own durable consumers and runs the registered
// handlers. Create it with [New], register handlers with [Agent.Handle],
// then call [Agent.Start]; end with [Agent.Drain] or [Agent.Stop].
//
// All methods are safe for concurrent use. Several Agent values (in one
// process or many) may share one id: they are instances of the same agent
// and share its consumers. By default they take turns: the eldest live
// instance consumes and the others stand by (see [Agent.Consuming],
// [WithConcurrentInstances]).
type Agent struct {
	id   string
	nc   *nats.Conn
	js   jetstream.JetStream
	opts options

	mu     sync.Mutex
	state  lifecycle
	topics []string
	closed chan struct{}

	// The connection watch (see watchConn): lost is why the agent stopped
	// on its own.
	watcher   sync.WaitGroup
	watchDone chan struct{}
	lost      atomic.Pointer[error]

	instance string             // this instance's registry key suffix
	turns    *turns             // set by Start when the instances take turns
	probes   *nats.Subscription // answers the probes of this instance's successors (see turns)
	unfollow func()             // stops the registry's signals for turns
	// announced is the status the instance last announced, which a
	// group's host record repeats for a hosted member (see hosting).
	announced atomic.Pointer[AgentStatus]
	registry  *registry.View // set by Start when registration is on: shared by the agents on nc
	// releaseRegistry gives the registry back (see [registry.Acquire]).
	releaseRegistry func()
	heartbeat       sync.WaitGroup
	hbDone          chan struct{}
	// announceMu orders a heartbeat's status against shutdown's STOPPING,
	// so a READY decided before the stop cannot land after it.
	announceMu sync.Mutex
	objects    payloadStore // large envelopes
	shared     sharedState  // task state
	tracker    taskTracker  // task records, written after the ack
	// drainCtx is Drain's ctx, which bounds the writing of the task
	// records still queued; nil for Stop. Set by shutdown's begin.
	drainCtx context.Context

	tracing tracing
	stats   counters

	send sender   // publishing, breakers, and the calls waiting for replies
	recv receiver // consuming, handling and settling
}

type lifecycle int

const (
	stateNew lifecycle = iota
	stateStarted
	stateStopping // a Stop or Drain is waiting for the agent's goroutines
	stateStopped
)

// queueSpec says what one of the runtime's queues carries: a priority's
// direct consumer, or a fan-out class's consumer.
type queueSpec struct {
	priority wire.Priority // the direct priority; a fan-out class's highest, whose policy it uses
	class    string        // the fan-out class; "" for direct
}

// queueOrder is the order workers look at the queues in: critical first,
// each fan-out class after the direct queue of its highest priority.
var queueOrder = [...]queueSpec{
	{priority: wire.PriorityCritical},
	{priority: wire.PriorityCritical, class: "urgent"},
	{priority: wire.PriorityHigh},
	{priority: wire.PriorityNormal},
	{priority: wire.PriorityNormal, class: "bulk"},
	{priority: wire.PriorityLow},
	{priority: wire.PriorityBatch},
}

// New returns an agent with id (a subject token: [A-Za-z0-9_-]{1,64}) that
// sends and receives over nc. It never dials and starts no goroutine; the
// caller keeps ownership of nc and closes it after the agent has stopped.
func New(nc *nats.Conn, id string, opts ...Option) (*Agent, error) {
	if nc == nil {
		return nil, fmt.Errorf("%w: nil *nats.Conn", ErrInvalidOption)
	}
	if err := subjects.ValidateToken("agent id", id); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidID, err)
	}
	o := defaultOptions()
	for _, opt := range opts {
		if err := opt.apply(&o); err != nil {
			return nil, err
		}
	}
	o.attemptTimeout = min(2*time.Second, o.publishTimeout/4)
	if o.errorHandler == nil {
		o.errorHandler = func(err error) { o.logger.Warn("agentkit background error", "agent", id, "err", err) }
	}
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(o.attemptTimeout))
	if err != nil {
		return nil, fmt.Errorf("agentkit: jetstream: %w", err)
	}
	a := &Agent{
		instance: nuid.Next(),
		id:       id,
		nc:       nc,
		js:       js,
		opts:     o,
		topics:   slices.Clone(o.topics),
		closed:   make(chan struct{}),
	}
	a.objects = newPayloadStore(js, &a.opts)
	a.send = sender{id: id, nc: nc, js: js, opts: &a.opts, stats: &a.stats, tracing: &a.tracing, objects: &a.objects,
		waiters: map[string]*waiter{}}
	a.recv = receiver{id: id, nc: nc, opts: &a.opts, stats: &a.stats, tracing: &a.tracing, objects: &a.objects,
		send: &a.send, host: a, handlers: map[string]Handler{}, invalidLog: newSampledLog(),
		policies: make(map[wire.Priority]*DeliveryPolicy, len(o.policies))}
	for p, pol := range o.policies {
		a.recv.policies[p] = &pol
	}
	a.send.breakers.settings, a.send.breakers.onChange = o.breaker, a.breakerChanged
	a.opts.hooks.request = append([]RequestHook{healthMarks{a}}, o.hooks.request...)
	a.recv.handled.init(o.dedupWindow)
	tp := o.tracerProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	a.tracing.tracer = tp.Tracer(tracerName)
	a.tracing.propagator = o.propagator
	if a.tracing.propagator == nil {
		a.tracing.propagator = otel.GetTextMapPropagator()
	}
	for _, h := range o.hooks.newAgent {
		h.OnNewAgent(a)
	}
	return a, nil
}

// ID returns the agent's id.
func (a *Agent) ID() string { return a.id }

// Handle registers h, wrapped in the middleware of [WithMiddleware], for
// messages whose action is action. It must be called before Start;
// registering an action twice replaces the handler.
func (a *Agent) Handle(action string, h Handler) error {
	if action == "" || h == nil {
		return fmt.Errorf("%w: Handle needs an action and a handler", ErrInvalidOption)
	}
	if err := wire.ValidateAction(action); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidOption, err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.state != stateNew {
		return fmt.Errorf("%w: Handle(%q) after Start", ErrAlreadyStarted, action)
	}
	if h = chain(h, a.opts.middleware); h == nil {
		return fmt.Errorf("%w: middleware made a nil handler for %q", ErrInvalidOption, action)
	}
	a.recv.handlers[action] = h
	return nil
}

// HandleFunc registers f for action; see [Agent.Handle].
func (a *Agent) HandleFunc(action string, f func(ctx context.Context, m *Message) error) error {
	if f == nil {
		return fmt.Errorf("%w: HandleFunc(%s) needs a function", ErrInvalidOption, bound.Quote(action))
	}
	return a.Handle(action, HandlerFunc(f))
}

// Start provisions the message stream (unless it exists) and the agent's
// durable consumers (one per priority, and the fan-out ones unless the
// agent takes no fan-out action), then starts consuming: one reader
// goroutine per consumer and the handler workers. It is idempotent on the
// server: instances starting concurrently converge on the same consumers.
// Start returns once consuming has begun; ctx bounds only the provisioning.
func (a *Agent) Start(ctx context.Context) error {
	if err := a.start(ctx); err != nil {
		if denied := a.send.denied(""); denied != nil {
			return fmt.Errorf("%w (%w)", err, denied)
		}
		return err
	}
	return nil
}

func (a *Agent) start(ctx context.Context) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.state != stateNew {
		return fmt.Errorf("%w: Start called twice", ErrAlreadyStarted)
	}
	if a.nc.IsClosed() {
		return fmt.Errorf("agentkit: start %s: %w", a.id, ErrConnClosed)
	}
	if a.opts.provision {
		if err := EnsureStream(ctx, a.js, StreamConfig(a.opts.scheme, a.opts.replicas)); err != nil {
			return err
		}
	}
	if a.opts.register {
		reg, release, err := registry.Acquire(ctx, a.nc, a.js, a.opts.scheme, a.opts.replicas, a.opts.provision)
		if err != nil {
			return err
		}
		a.registry, a.releaseRegistry = reg, release
		if g := a.opts.group; g != nil {
			// A hosted member: its host's record carries its liveness.
			a.instance = g.host.instance
			if err := g.hostMember(ctx, a.nc, a.id, &a.opts, a.memberState); err != nil {
				g.unhostMember(a.id)
				release()
				return err
			}
		}
		if !a.opts.concurrentInstances && a.opts.group == nil {
			a.turns = newTurns(reg, a.id, a.instance, a.opts.heartbeat, a.renewTimeout(), a.opts.logger)
			a.turns.standBy = a.recv.standDown
			a.turns.probe = a.probeGone
			a.probes = a.answerProbes()
		}
		begun := time.Now()
		if err := a.announce(ctx, StatusInitializing); err != nil {
			a.endTurns()
			if g := a.opts.group; g != nil {
				g.unhostMember(a.id)
			}
			release()
			return err
		}
		if a.turns != nil {
			var follow <-chan struct{}
			follow, a.unfollow = reg.Follow(a.id)
			a.turns.follow = follow
			a.turns.renewed(begun)
			a.turns.awaitCurrent(a.opts.attemptTimeout)
		}
		if rec, ok := reg.Get(a.id); ok && rec.Degraded {
			// A (re)started agent starts with a clean slate.
			if err := reg.MarkDegraded(ctx, a.id, a.id, "", false); err != nil {
				a.asyncError(err)
			}
		}
	}
	a.recv.fanout = a.recv.fanoutActions()
	sources := make([]*source, 0, len(queueOrder))
	stopAll := func() {
		for _, s := range sources {
			s.stop(false)
		}
		if a.registry != nil {
			a.endTurns()
			if a.opts.group != nil {
				a.opts.group.unhostMember(a.id)
			}
			a.releaseRegistry()
		}
	}
	group := a.opts.group
	inboxes := map[wire.Priority]*inbox{}
	for q, spec := range queueOrder {
		if spec.class != "" && len(a.recv.fanout) == 0 {
			continue // nothing to handle: no fan-out consumer, nothing fetched
		}
		if spec.class == "" && group != nil {
			src := inboxSource(spec, q, a.opts.policies[spec.priority], a.opts.concurrency, &a.recv.idleScan)
			inboxes[spec.priority] = src.inbox
			sources = append(sources, src)
			continue
		}
		cons, err := a.bindConsumer(ctx, spec, a.topics)
		if err != nil {
			stopAll()
			return err
		}
		src, err := a.openSource(cons, spec, q)
		if err != nil {
			stopAll()
			return err
		}
		sources = append(sources, src)
	}
	var catchUps []*source
	if group != nil {
		srcs, err := a.joinGroup(ctx, group, inboxes)
		if err != nil {
			stopAll()
			return err
		}
		sources, catchUps = append(sources, srcs...), srcs
	}
	a.recv.open(sources)
	for _, src := range catchUps {
		a.recv.watchCatchUp(src, group)
	}
	a.startTracker()
	a.recv.startWorkers()
	if a.registry != nil {
		if err := a.announce(ctx, StatusReady); err != nil {
			a.asyncError(err)
		}
	}
	if a.registry != nil {
		a.hbDone = make(chan struct{})
		a.heartbeat.Go(a.heartbeatLoop)
	}
	a.watchDone = make(chan struct{})
	status := a.nc.StatusChanged(nats.CLOSED)
	a.watcher.Go(func() { a.watchConn(status) })
	a.state = stateStarted
	a.opts.logger.Info("agent started", "agent", a.id, "stream", a.opts.scheme.Stream(), "topics", a.topics, "fanout", len(a.recv.fanout) > 0)
	return nil
}

// openSource starts reading cons, the consumer of spec, for queue q.
func (a *Agent) openSource(cons jetstream.Consumer, spec queueSpec, q int) (*source, error) {
	name := cons.CachedInfo().Name
	bind := func(ctx context.Context) (jetstream.Consumer, error) {
		return a.js.Consumer(ctx, a.opts.scheme.Stream(), name)
	}
	src, err := openSource(cons, bind, spec, q, a.opts.policies[spec.priority], a.opts.concurrency, a.turns, &a.recv.idleScan)
	if err != nil {
		return nil, fmt.Errorf("agentkit: consume %s: %w", src.label(), err)
	}
	return src, nil
}

// joinGroup joins g, whose feeds fill inboxes, and returns the sources of
// the catch-ups the agent must read (see Group).
func (a *Agent) joinGroup(ctx context.Context, g *Group, inboxes map[wire.Priority]*inbox) ([]*source, error) {
	if g.scheme != a.opts.scheme {
		return nil, fmt.Errorf("%w: agent %s's scheme differs from group %s's", ErrInvalidOption, a.id, g.name)
	}
	catchUps, err := g.join(ctx, a.id, inboxes, a.opts.policies, a.opts.sampleFreq)
	if err != nil {
		return nil, err
	}
	var out []*source
	for _, cu := range catchUps {
		q := slices.Index(queueOrder[:], queueSpec{priority: cu.priority})
		src, err := a.openSource(cu.cons, queueOrder[q], q)
		if err != nil {
			for _, s := range out {
				s.stop(false)
			}
			g.leave(a.id)
			return nil, err
		}
		src.until = cu.until
		out = append(out, src)
	}
	return out, nil
}

// consumerConfig returns the durable consumer of priority p with the
// agent's policy.
func (a *Agent) consumerConfig(p wire.Priority) (jetstream.ConsumerConfig, error) {
	cfg, err := ConsumerConfig(a.opts.scheme, a.id, p, a.opts.policies[p])
	cfg.SampleFrequency = a.opts.sampleFreq
	return cfg, err
}

// fanoutConfig returns the agent's fan-out consumer of class with topics.
func (a *Agent) fanoutConfig(class string, topics []string) (jetstream.ConsumerConfig, error) {
	cfg, err := FanoutConsumerConfig(a.opts.scheme, a.id, class, a.opts.policies[fanoutPolicy(class)], topics)
	cfg.SampleFrequency = a.opts.sampleFreq
	return cfg, err
}

// fanoutPolicy is the priority whose delivery policy a fan-out class
// uses: its highest.
func fanoutPolicy(class string) wire.Priority {
	return wire.Priority(subjects.FanoutPriorities(class)[0])
}

// ConsumerConfig returns the durable consumer of agent id at priority p:
// named "<id>_<priority>", filtering the agent's direct subject at p, with
// explicit acks, policy's BackOff and MaxDeliver, and every ack sampled
// for the monitor; policy's zero fields take p's defaults, as with
// [WithPolicy]. It delivers every stored message, so a message sent
// before the agent first started is handled. An administrator who
// provisions consumers for agents without that right
// ([WithProvisioning](false)) creates exactly these, and the fan-out
// ones of [FanoutConsumerConfig].
func ConsumerConfig(s subjects.Scheme, id string, p wire.Priority, policy DeliveryPolicy) (jetstream.ConsumerConfig, error) {
	policy = policy.withDefaults(p)
	if err := policy.validate(p); err != nil {
		return jetstream.ConsumerConfig{}, err
	}
	name, err := s.Consumer(id, string(p))
	if err != nil {
		return jetstream.ConsumerConfig{}, fmt.Errorf("%w: %w", ErrInvalidID, err)
	}
	cfg := agentConsumer(name, policy)
	cfg.Description = fmt.Sprintf("agentmesh agent %s, %s priority", id, p)
	cfg.FilterSubject, _ = s.DirectFilter(id, string(p)) // tokens validated above
	cfg.DeliverPolicy = jetstream.DeliverAllPolicy
	return cfg, nil
}

// agentConsumer is what an agent's consumers share: explicit acks,
// policy's ack timeouts, attempts and ack pending, every ack sampled.
func agentConsumer(name string, policy DeliveryPolicy) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:         name,
		AckPolicy:       jetstream.AckExplicitPolicy,
		AckWait:         policy.BackOff[0],
		BackOff:         slices.Clone(policy.BackOff),
		MaxDeliver:      policy.MaxDeliver,
		MaxAckPending:   policy.MaxAckPending,
		SampleFrequency: "100",
	}
}

// FanoutConsumerConfig returns the durable fan-out consumer of agent id
// for class (see [subjects.FanoutClasses]): named "<id>_fanout-<class>",
// filtering the broadcasts and the given topics at the class's
// priorities, with policy (the delivery policy of the class's highest
// priority). Created, it delivers only messages published from then on:
// a new agent gets no history of broadcasts and topics, while an agent
// that restarts continues where its consumer left off.
func FanoutConsumerConfig(s subjects.Scheme, id, class string, policy DeliveryPolicy, topics []string) (jetstream.ConsumerConfig, error) {
	name, err := s.FanoutConsumer(id, class)
	if err != nil {
		return jetstream.ConsumerConfig{}, fmt.Errorf("%w: %w", ErrInvalidID, err)
	}
	p := fanoutPolicy(class)
	policy = policy.withDefaults(p)
	if err := policy.validate(p); err != nil {
		return jetstream.ConsumerConfig{}, err
	}
	filters, err := s.FanoutFilters(class, topics)
	if err != nil {
		return jetstream.ConsumerConfig{}, fmt.Errorf("%w: %w", ErrInvalidID, err)
	}
	cfg := agentConsumer(name, policy)
	cfg.Description = fmt.Sprintf("agentmesh agent %s, %s broadcasts and topics", id, class)
	cfg.FilterSubjects = filters
	cfg.DeliverPolicy = jetstream.DeliverNewPolicy
	return cfg, nil
}

// bindConsumer creates or updates (when provisioning) or looks up the
// consumer of spec.
func (a *Agent) bindConsumer(ctx context.Context, spec queueSpec, topics []string) (jetstream.Consumer, error) {
	var cfg jetstream.ConsumerConfig
	var err error
	if spec.class != "" {
		cfg, err = a.fanoutConfig(spec.class, topics)
	} else {
		cfg, err = a.consumerConfig(spec.priority)
	}
	if err != nil {
		return nil, err
	}
	stream := a.opts.scheme.Stream()
	var cons jetstream.Consumer
	if a.opts.provision {
		cons, err = a.js.CreateOrUpdateConsumer(ctx, stream, cfg)
		var apiErr *jetstream.APIError
		if spec.class != "" && errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeConsumerCreate && keepStart(ctx, a.js, stream, &cfg) {
			cons, err = a.js.CreateOrUpdateConsumer(ctx, stream, cfg)
		}
	} else {
		cons, err = a.js.Consumer(ctx, stream, cfg.Durable)
	}
	if err != nil {
		return nil, fmt.Errorf("agentkit: consumer %s on %s: %w", cfg.Durable, stream, err)
	}
	return cons, nil
}

// keepStart gives cfg the start position of the existing consumer it
// updates and reports whether that differs: the server never changes a
// consumer's deliver policy, and a fan-out consumer that agentmesh
// migrate or an administrator created may start at a sequence rather
// than at the stream's end. Only a refused update asks, so a Start costs
// no extra round trip.
func keepStart(ctx context.Context, js jetstream.JetStream, stream string, cfg *jetstream.ConsumerConfig) bool {
	cons, err := js.Consumer(ctx, stream, cfg.Durable)
	if err != nil {
		return false // the update's own error stands
	}
	old := cons.CachedInfo().Config
	sameTime := old.OptStartTime == nil && cfg.OptStartTime == nil ||
		old.OptStartTime != nil && cfg.OptStartTime != nil && old.OptStartTime.Equal(*cfg.OptStartTime)
	if old.DeliverPolicy == cfg.DeliverPolicy && old.OptStartSeq == cfg.OptStartSeq && sameTime {
		return false
	}
	cfg.DeliverPolicy, cfg.OptStartSeq, cfg.OptStartTime = old.DeliverPolicy, old.OptStartSeq, old.OptStartTime
	return true
}

// EnsureStream creates the stream described by cfg unless a stream of that
// name exists; an existing stream is left as its administrator configured
// it, but one with fewer replicas than cfg asks for is an error matching
// [ErrTooFewReplicas], so an agent or monitor asking for R3 never runs on
// an R1 stream unawares.
func EnsureStream(ctx context.Context, js jetstream.JetStream, cfg jetstream.StreamConfig) error {
	st, err := js.Stream(ctx, cfg.Name)
	if err == nil {
		if err := bucket.EnoughReplicas(cfg.Name, st.CachedInfo().Config.Replicas, cfg.Replicas); err != nil {
			return fmt.Errorf("agentkit: %w", err)
		}
		return nil
	}
	if !errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("agentkit: stream %s: %w", cfg.Name, err)
	}
	_, err = js.CreateStream(ctx, cfg)
	var apiErr *jetstream.APIError
	if cfg.MaxConsumers > 0 && errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeMaximumConsumersLimit {
		// The account caps consumers per stream below cfg's limit: the
		// stream takes the account's, and Start says when it is reached.
		cfg.MaxConsumers = 0
		_, err = js.CreateStream(ctx, cfg)
	}
	if err != nil && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		return fmt.Errorf("agentkit: create stream %s: %w", cfg.Name, err)
	}
	return nil
}

// Subscribe adds topic to the agent's subscriptions. On a started agent it
// updates the fan-out consumers at once; messages published on the topic
// from then on are delivered to the agent's handlers by action (those of
// [WithFanoutActions]; others are acked as [OutcomeIgnored]). The
// consumers change in place, so a message published during the switch
// is delivered once or, before it, not at all. All instances of an agent
// share its subscriptions. An agent that handles no fan-out action has no
// fan-out consumer: its topics take effect when it starts with one.
func (a *Agent) Subscribe(ctx context.Context, topic string) error {
	return a.changeTopics(ctx, topic, true)
}

// Unsubscribe removes topic from the agent's subscriptions.
func (a *Agent) Unsubscribe(ctx context.Context, topic string) error {
	return a.changeTopics(ctx, topic, false)
}

func (a *Agent) changeTopics(ctx context.Context, topic string, add bool) error {
	if err := subjects.ValidateToken("topic", topic); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidID, err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.state >= stateStopping {
		return ErrClosed
	}
	topics := slices.DeleteFunc(slices.Clone(a.topics), func(t string) bool { return t == topic })
	if add {
		topics = append(topics, topic)
	}
	if a.state == stateStarted {
		if !a.opts.provision {
			return fmt.Errorf("%w: topics cannot change without provisioning rights", ErrInvalidOption)
		}
		for _, spec := range queueOrder {
			if spec.class == "" || len(a.recv.fanout) == 0 {
				continue
			}
			if _, err := a.bindConsumer(ctx, spec, topics); err != nil {
				return err
			}
		}
	}
	a.topics = topics
	return nil
}

// Topics returns the topics the agent is subscribed to.
func (a *Agent) Topics() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.topics)
}

// Stop stops consuming at once: running handlers see their context
// cancelled and their messages, like those waiting for a worker, are NAKed
// for immediate redelivery to another instance; messages still in the
// client's buffer are left to the broker's redelivery. It waits for the
// handlers at most the stop grace ([WithStopGrace], 5s by default); a
// handler still running then, ignoring its context, is abandoned: its
// message is NAKed for redelivery, so another instance may handle it
// while this handler still runs (delivery is at least once: handlers with
// side effects must be idempotent); what it returns is dropped, neither
// settled nor answered; the error handler hears [ErrHandlersAbandoned]
// once, with how many; and its goroutine ends when the handler returns.
// Every other goroutine the agent started has ended when Stop returns.
// Stop releases the publisher's reply subscription (call Stop on agents
// that only sent, too) and is idempotent. Task records still queued (see
// [WithTaskTracking]) are written within the publish timeout; the rest
// are dropped and counted.
func (a *Agent) Stop() { a.shutdown(a.recv.stopNow) }

// Drain stops fetching, finishes the messages already received, then
// stops. If ctx ends first, Drain turns into [Agent.Stop]: running
// handlers see their context cancelled, their messages and those not yet
// started go back for redelivery, handlers still running the stop grace
// later are abandoned as Stop abandons them, and Drain returns ctx's
// error. Handlers still running may
// send, but [Agent.Request] and [Agent.SendAndWait] fail at once with
// [ErrClosed]: the agent no longer reads its replies. Drain writes the task
// records of the messages it acked (see [WithTaskTracking]) before it
// returns, while ctx lasts; a record being written when ctx ends finishes
// first, within the publish timeout. Stop and Drain wait
// for running handlers, so a handler must not call them on its own agent.
func (a *Agent) Drain(ctx context.Context) error {
	var expired atomic.Bool
	var stop func() bool
	a.shutdown(func() {
		// From here on, ctx ending turns the drain into a stop, whether
		// the readers are still emptying the client's buffer or the
		// workers finishing.
		a.drainCtx = ctx
		stop = context.AfterFunc(ctx, func() {
			if a.lifecycle() == stateStopping {
				expired.Store(true)
				a.recv.stopNow()
			}
		})
		a.recv.drain()
	})
	if stop != nil {
		stop()
	}
	if expired.Load() {
		return fmt.Errorf("agentkit: drain %s: %w", a.id, ctx.Err())
	}
	return nil
}

// ErrConnClosed: the agent's connection is closed, by its owner or by the
// server (which closes a connection for a protocol violation or when its
// credentials expire); nats.go never reopens a closed connection. An agent
// whose connection closes stops, and [Agent.Err] returns this error.
var ErrConnClosed = errors.New("agentkit: connection closed")

// watchConn stops the agent when its connection closes. While the
// connection is only reconnecting, nats.go resumes the agent's pulls and
// publishes and the agent carries on; a closed connection never comes
// back, so the agent stops, fires Closed and reports why through the error
// handler and Err. Getting going again is the owner's call: a new
// connection and a new Agent (agentkit never dials).
func (a *Agent) watchConn(status chan nats.Status) {
	defer a.nc.RemoveStatusListener(status)
	select {
	case <-status:
	case <-a.watchDone:
		return
	}
	err := fmt.Errorf("agentkit: agent %s stopped: %w", a.id, ErrConnClosed)
	if last := a.nc.LastError(); last != nil {
		err = fmt.Errorf("agentkit: agent %s stopped: %w: %w", a.id, ErrConnClosed, last)
	}
	a.lost.Store(&err)
	a.asyncError(err)
	a.opts.logger.Error("connection closed: agent stopped", "agent", a.id, "err", err)
	a.shutdownFrom(true, a.recv.stopNow)
}

// Err reports what keeps the agent from consuming: once its connection has
// closed, an error matching [ErrConnClosed] (the agent has stopped); while
// the server turns away a priority's reader (its consumer deleted, pulls
// refused), that reader's latest error, until it reads again. It is nil
// while the agent consumes normally.
func (a *Agent) Err() error {
	if err := a.lost.Load(); err != nil {
		return *err
	}
	for i := range a.recv.failing {
		if err := a.recv.failing[i].Load(); err != nil {
			return *err
		}
	}
	return nil
}

// shutdown runs begin once on a started agent, then waits for readers and
// workers (see awaitWorkers: not for a handler it abandoned) and marks the
// agent closed. Later and concurrent calls wait
// until it is. It does not hold a.mu while it waits: running handlers may
// need it (Request, Reroute, Registry).
func (a *Agent) shutdown(begin func()) { a.shutdownFrom(false, begin) }

// shutdownFrom is shutdown; watcher says the connection watch calls it, which
// returns at once if a shutdown is under way (that one waits for the watch).
func (a *Agent) shutdownFrom(watcher bool, begin func()) {
	a.mu.Lock()
	switch a.state {
	case stateStopping, stateStopped:
		a.mu.Unlock()
		if !watcher {
			<-a.closed
		}
		return
	case stateNew:
		a.state = stateStopped
		a.js.CleanupPublisher()
		a.send.fast.close()
		close(a.closed)
		a.mu.Unlock()
		a.stoppedHooks()
		return
	}
	a.state = stateStopping
	a.mu.Unlock()
	if !watcher {
		close(a.watchDone)
	}
	if a.registry != nil {
		a.announceMu.Lock()
		a.announceBestEffort(StatusStopping, a.opts.attemptTimeout)
		a.announceMu.Unlock()
	}
	begin()
	a.recv.readers.Wait()
	// Replies reach waiters through the readers, which have stopped: a
	// handler's Request still waiting fails now, not at its timeout.
	a.send.failWaiters()
	if n := a.recv.awaitWorkers(); n > 0 {
		a.asyncError(fmt.Errorf("%w: %d of %s, still running %v after their context was cancelled; their messages went back for redelivery",
			ErrHandlersAbandoned, n, a.id, a.opts.stopGrace))
	}
	a.flushTasks()
	a.recv.stopScanner()
	// Heartbeats (STOPPING now) go on while handlers finish, so a long
	// drain does not read as a dead agent.
	if a.hbDone != nil {
		close(a.hbDone)
		a.heartbeat.Wait()
	}
	a.endTurns()
	a.recv.handBackStranded()
	a.recv.cancel()
	if a.opts.group != nil {
		a.opts.group.leave(a.id)
	}
	if a.registry != nil {
		a.announceBestEffort(StatusStopped, a.opts.attemptTimeout)
		ctx, cancel := context.WithTimeout(context.Background(), a.opts.attemptTimeout)
		if err := a.registry.Deregister(ctx, a.id, a.instance); err != nil {
			a.asyncError(err)
		}
		cancel()
		a.releaseRegistry()
	}
	a.mu.Lock()
	a.state = stateStopped
	a.mu.Unlock()
	a.js.CleanupPublisher() // the async publish reply subscription and its goroutines
	a.send.fast.close()
	if !watcher {
		a.watcher.Wait()
	}
	a.stoppedHooks()
	close(a.closed)
	a.opts.logger.Info("agent stopped", "agent", a.id)
}

// flushTasks writes the task records still queued (see stopTracker):
// within Drain's ctx, or on Stop within the publish timeout, the bound
// each record had when the workers wrote them.
func (a *Agent) flushTasks() {
	ctx := a.drainCtx
	if ctx == nil {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.Background(), a.opts.publishTimeout)
		defer cancel()
	}
	a.stopTracker(ctx)
}

// stoppedHooks tells the hooks the agent has stopped.
func (a *Agent) stoppedHooks() {
	for _, h := range a.opts.hooks.stopped {
		h.OnAgentStopped(a)
	}
}

// Closed returns a channel closed once the agent has stopped.
func (a *Agent) Closed() <-chan struct{} { return a.closed }

// lifecycle returns the agent's state.
func (a *Agent) lifecycle() lifecycle {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.state
}

func (a *Agent) asyncError(err error) {
	a.opts.errorHandler(err)
}

// ConsumerInfo returns the server's view of the agent's consumer at
// priority p (pending, ack-pending and redelivered counts): for an agent
// in a group, the group's consumer, shared by its agents.
func (a *Agent) ConsumerInfo(ctx context.Context, p wire.Priority) (*jetstream.ConsumerInfo, error) {
	name, err := a.opts.scheme.Consumer(a.id, string(p))
	if g := a.opts.group; g != nil {
		name, err = g.scheme.GroupConsumer(g.name, string(p))
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidID, err)
	}
	cons, err := a.js.Consumer(ctx, a.opts.scheme.Stream(), name)
	if err != nil {
		return nil, fmt.Errorf("agentkit: consumer %s: %w", name, err)
	}
	return cons.Info(ctx)
}

// Registry returns the registry view the agent keeps while started (nil
// before Start or with registration off). The agents on one connection
// share one view, so it is theirs to close: do not Close it.
func (a *Agent) Registry() *registry.View {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.registry
}

// capabilities returns the declared capabilities, or the default one.
func (a *Agent) capabilities() []Capability {
	if len(a.opts.capabilities) > 0 {
		return a.opts.capabilities
	}
	name := cmp.Or(a.opts.agentType, a.id)
	actions := slices.Sorted(maps.Keys(a.recv.handlers))
	return []Capability{{Name: name, Version: a.opts.version, Actions: actions}}
}

// announce writes this instance's registry record with status.
func (a *Agent) announce(ctx context.Context, status AgentStatus) error {
	a.announced.Store(&status)
	state := a.memberState()
	rec := registry.Instance{
		ID: a.id, Instance: a.instance, Type: a.opts.agentType, Version: a.opts.version,
		Capabilities: a.capabilities(), Director: a.opts.director, Status: state.Status,
		Load: state.Load, InFlight: state.InFlight, Concurrency: a.opts.concurrency + 1,
		LastHeartbeat: time.Now().UTC(),
	}
	if a.turns != nil {
		rec.Since, rec.Probe = a.turns.start(), a.probes != nil
	}
	if a.opts.group != nil {
		rec.Host = a.opts.group.name
	}
	return a.registry.Register(ctx, rec, 3*a.renewEvery())
}

// memberState is the status the instance last announced (BUSY for READY
// while every worker is taken) and its load. It takes no lock: a group's
// host record reads it for a hosted member.
func (a *Agent) memberState() registry.MemberState {
	status := StatusInitializing
	if p := a.announced.Load(); p != nil {
		status = *p
	}
	inFlight := int(a.recv.inFlight.Load())
	if status == StatusReady && inFlight >= a.opts.concurrency {
		status = StatusBusy
	}
	return registry.MemberState{Status: status, Load: float64(inFlight) / float64(a.opts.concurrency+1), InFlight: inFlight}
}

// renewEvery is how often the instance renews its own record: each
// heartbeat, or, for a member whose group's host record carries its
// liveness, every hostedRenewals heartbeats.
func (a *Agent) renewEvery() time.Duration {
	if a.opts.group != nil {
		return hostedRenewals * a.opts.heartbeat
	}
	return a.opts.heartbeat
}

// renewTimeout bounds a heartbeat's renewal when the instances take turns:
// a renewal that hangs through a registry election is given up within a
// second and tried again, so the record is renewed soon after the
// election (see turns).
func (a *Agent) renewTimeout() time.Duration { return min(a.opts.attemptTimeout, time.Second) }

// announceBestEffort announces status within timeout, reporting a failure
// to the error handler; it returns whether the record was written.
func (a *Agent) announceBestEffort(status AgentStatus, timeout time.Duration) bool {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := a.announce(ctx, status); err != nil {
		a.asyncError(err)
		return false
	}
	return true
}

// endTurns ends this instance's part in its agent's turns, if it took one.
func (a *Agent) endTurns() {
	if a.turns == nil {
		return
	}
	a.turns.close()
	if a.unfollow != nil {
		a.unfollow()
	}
	if a.probes != nil {
		_ = a.probes.Unsubscribe() // fails only on a closed connection, which ended it
	}
}

// answerProbes subscribes this instance to its probe subject and returns
// the subscription once a probe of its own finds it answering; nil, and a
// warning, if not (the credentials may not grant the subject): the record
// then says it answers no probe, and a successor waits for its TTL.
func (a *Agent) answerProbes() *nats.Subscription {
	subj, err := a.opts.scheme.Probe(a.id, a.instance) // both validated in New
	if err == nil {
		var sub *nats.Subscription
		if sub, err = a.nc.Subscribe(subj, func(m *nats.Msg) { _ = m.Respond(nil) }); err == nil {
			if _, err = a.nc.Request(subj, nil, a.opts.attemptTimeout); err == nil {
				return sub
			}
			_ = sub.Unsubscribe()
		}
	}
	a.opts.logger.Warn("instance answers no liveness probe: a successor takes over only once its record expires",
		"agent", a.id, "instance", a.instance, "error", err)
	return nil
}

// probeGone reports whether a probe of instance, another instance of this
// agent, finds no subscriber: its connection is gone. A probe that times
// out or fails otherwise tells nothing.
func (a *Agent) probeGone(ctx context.Context, instance string) bool {
	subj, err := a.opts.scheme.Probe(a.id, instance)
	if err != nil {
		return false
	}
	_, err = a.nc.RequestWithContext(ctx, subj, nil)
	return errors.Is(err, nats.ErrNoResponders)
}

// Consuming reports whether this instance reads the agent's consumers:
// true once started, unless another instance of the agent consumes now.
// Instances take turns by default (see [WithConcurrentInstances]): the
// eldest live instance in the registry consumes, and the others stand by
// until it stops (its record is deleted) or crashes: a heartbeat interval
// after its connection went, which the standby finds by probing it (the
// standby then also hands back the messages it held), or, for an elder
// that answers no probe, once its record expires, three intervals after
// its last renewal. An instance whose record goes unrenewed for two
// intervals stops fetching by itself, so two instances never fetch at
// once while the registry works.
func (a *Agent) Consuming() bool {
	if a.lifecycle() != stateStarted {
		return false
	}
	return a.turns == nil || a.turns.consuming()
}

// heartbeatLoop renews the registry record every heartbeat interval (READY,
// or BUSY when every worker is taken) and publishes a core NATS heartbeat
// on mesh.hb.<agent> for anyone watching liveness without the registry. It
// reports, once, a registry whose watch has ended by itself ([registry.View.Err]).
func (a *Agent) heartbeatLoop() {
	t := time.NewTicker(a.renewEvery())
	defer t.Stop()
	hb, _ := a.opts.scheme.Heartbeat(a.id) // id validated in New
	reported := false                      // the registry's watch ending, once
	var follow <-chan struct{}             // changes of this agent's records, when the instances take turns
	var renew <-chan struct{}              // the turns ask for a renewal now
	var probe <-chan time.Time             // time to probe the elder, when the instances take turns
	if a.turns != nil {
		follow, renew = a.turns.follow, a.turns.renew
		pt := time.NewTicker(a.turns.probeEvery())
		defer pt.Stop()
		probe = pt.C
	}
	for {
		select {
		case <-a.hbDone:
			return
		case <-follow:
			a.turns.check()
			continue
		case <-probe:
			a.turns.probeElder()
			continue
		case <-renew:
		case <-t.C:
		}
		if err := a.registry.Err(); err != nil && !reported {
			reported = true
			a.asyncError(fmt.Errorf("agentkit: %s: discovery answers from a cache that no longer changes: %w", a.id, err))
		}
		a.announceMu.Lock()
		status := StatusReady
		if a.lifecycle() == stateStopping {
			status = StatusStopping
		}
		begun := time.Now()
		timeout := a.opts.attemptTimeout
		if a.turns != nil {
			timeout = a.renewTimeout()
		}
		ok := a.announceBestEffort(status, timeout)
		a.announceMu.Unlock()
		if a.turns != nil {
			if ok {
				a.turns.renewed(begun)
			}
			// A failed renewal is retried within a second rather than a
			// heartbeat: two missed intervals fence the instance.
			next := a.opts.heartbeat
			if !ok {
				next = min(next, time.Second)
			}
			t.Reset(next)
		}
		b, _ := json.Marshal(map[string]any{"id": a.id, "instance": a.instance, "in_flight": a.recv.inFlight.Load(), "at": time.Now().UTC()})
		if err := a.nc.Publish(hb, b); err != nil {
			a.asyncError(fmt.Errorf("agentkit: heartbeat: %w", err))
		}
	}
}
