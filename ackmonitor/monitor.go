package ackmonitor

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/agentkit"
)

// ErrAlreadyRunning is returned by a second call of [Monitor.Run].
var ErrAlreadyRunning = errors.New("ackmonitor: Run called twice")

// Monitor is the ack monitor: it turns the mesh's sends and consumer events
// into the ledger, rates, alerts, dead letters and escalations, and serves
// them over HTTP ([Monitor.Handler]). Create it with [New] and run it with
// [Monitor.Run]. Its methods are safe for concurrent use.
type Monitor struct {
	cfg     Config
	nc      *nats.Conn
	js      jetstream.JetStream
	dlq     jetstream.JetStream // stores dead-letter copies (followUpBatch)
	sender  *agentkit.Agent
	metrics *metrics
	started time.Time

	mu       sync.Mutex
	running  bool
	mesh     jetstream.Stream
	events   jetstream.Consumer
	sends    jetstream.Consumer
	eventPin atomic.Value // string: the last Nats-Pin-Id seen on the events consumer
	active   atomic.Bool
	// followUpAt (UnixNano) holds follow-ups back after a takeover; see
	// followUpLoop.
	followUpAt atomic.Int64
	eventsHeld atomic.Int64 // events this instance fetched and has not yet acked
	// eventsThrough (UnixNano) is when the events intake sent the pull
	// of its last batch written in full: every event delivered to this
	// instance before then is in the ledger.
	eventsThrough atomic.Int64
	// othersHeld is the fewest events held by others (fetched, not acked,
	// not by this instance) that refreshStatus saw since this instance was
	// pinned; statusLoop only.
	othersHeld int64
	lastPull   atomic.Int64 // UnixNano when the events intake sent its last pull served as the pin holder
	pinnedAt   time.Time    // when refreshStatus first saw this instance pinned; statusLoop only
	ready      chan struct{}
	kick       chan struct{} // wakes the follow-up loop
	applied    atomic.Uint64 // stream messages committed to the ledger
	direct     *directEvents // events directIntake wrote
	activeAt   atomic.Int64  // UnixNano when refreshStatus last found this instance active
	lastLag    atomic.Int64  // ns
}

// Events consumer and sends consumer names are derived from MonitorID.
func (m *Monitor) eventsConsumerName() string { return m.cfg.MonitorID + "_events" }
func (m *Monitor) sendsConsumerName() string  { return m.cfg.MonitorID + "_sends" }

// New returns a monitor using nc, which the caller dialled and closes after
// Run returns. It validates cfg and starts nothing.
func New(nc *nats.Conn, cfg Config) (*Monitor, error) {
	if nc == nil {
		return nil, fmt.Errorf("%w: nil *nats.Conn", ErrInvalidConfig)
	}
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("ackmonitor: jetstream: %w", err)
	}
	// Copies are published asynchronously, a page at a time, each acked
	// or failed within copyTimeout.
	dlq, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(copyTimeout),
		jetstream.WithPublishAsyncMaxPending(2*followUpPage))
	if err != nil {
		return nil, fmt.Errorf("ackmonitor: jetstream: %w", err)
	}
	sender, err := agentkit.New(nc, cfg.MonitorID, agentkit.WithScheme(cfg.Scheme), agentkit.WithLogger(cfg.Logger),
		agentkit.WithReplicas(cfg.Replicas))
	if err != nil {
		return nil, fmt.Errorf("ackmonitor: %w", err)
	}
	if cfg.Directors == nil {
		cfg.Directors = &RegistryDirectors{JS: js, Bucket: cfg.Scheme.RegistryBucket(), Default: cfg.DefaultDirector}
	}
	m := &Monitor{cfg: cfg, nc: nc, js: js, dlq: dlq, sender: sender, metrics: newMetrics(), ready: make(chan struct{}),
		kick: make(chan struct{}, 1), started: time.Now(), direct: newDirectEvents(directRemembered)}
	m.eventPin.Store("")
	return m, nil
}

// Ready is closed once Run has provisioned the streams and consumers and
// started consuming.
func (m *Monitor) Ready() <-chan struct{} { return m.ready }

// Active reports whether this instance holds the pin of the events
// consumer, so it is the one evaluating alerts and escalating. It is a
// lease: the last status check saw this instance pinned, and less than
// PinnedTTL/2 ago its events intake sent a pull that the server then
// served as the pin holder's. The server moves
// the pin only after PinnedTTL without pulls, so an instance that stalls
// steps down before another can be pinned, and a newly pinned instance
// waits two status intervals before acting.
func (m *Monitor) Active() bool {
	return m.active.Load() && time.Since(time.Unix(0, m.lastPull.Load())) < m.cfg.PinnedTTL/2
}

// Run provisions streams and consumers, then consumes until ctx is done;
// it returns nil after a clean shutdown, having stopped every goroutine it
// started. Run may be called once.
func (m *Monitor) Run(ctx context.Context) error {
	m.mu.Lock()
	if m.running {
		m.mu.Unlock()
		return ErrAlreadyRunning
	}
	m.running = true
	m.mu.Unlock()
	defer m.sender.Stop()

	if err := m.provision(ctx); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() { m.intake(ctx, m.events, m.eventsBatch) })
	wg.Go(func() { m.intake(ctx, m.sends, m.sendsBatch) })
	wg.Go(func() { m.directIntake(ctx) })
	wg.Go(func() { m.statusLoop(ctx) })
	wg.Go(func() { m.alertLoop(ctx) })
	wg.Go(func() { m.followUpLoop(ctx) })
	wg.Go(func() { m.rollupLoop(ctx) })
	wg.Go(func() { m.reconcileLoop(ctx) })
	close(m.ready)
	m.cfg.Logger.Info("ack monitor running", "id", m.cfg.MonitorID, "stream", m.cfg.Scheme.Stream())
	<-ctx.Done()
	wg.Wait()
	m.active.Store(false)
	m.metrics.active.Set(0)
	m.cfg.Logger.Info("ack monitor stopped", "id", m.cfg.MonitorID)
	return nil
}

// provision creates the streams and the monitor's consumers unless they exist.
func (m *Monitor) provision(ctx context.Context) error {
	s := m.cfg.Scheme
	if err := agentkit.EnsureStream(ctx, m.js, agentkit.StreamConfig(s, m.cfg.Replicas)); err != nil {
		return fmt.Errorf("ackmonitor: %w", err)
	}
	for _, cfg := range []jetstream.StreamConfig{
		{Name: s.EventsStream(), Description: "agentmesh consumer advisories and ack metrics of " + s.Stream(),
			Subjects: s.EventsSubjects(), Retention: jetstream.LimitsPolicy, Storage: jetstream.FileStorage,
			MaxAge: m.cfg.EventsMaxAge, Replicas: m.cfg.Replicas},
		{Name: s.DLQStream(), Description: "agentmesh dead letters", Subjects: s.DLQSubjects(),
			Retention: jetstream.LimitsPolicy, Storage: jetstream.FileStorage, MaxAge: m.cfg.DLQMaxAge,
			Duplicates: 2 * time.Minute, Replicas: m.cfg.Replicas},
	} {
		if err := agentkit.EnsureStream(ctx, m.js, cfg); err != nil {
			return fmt.Errorf("ackmonitor: %w", err)
		}
	}
	if err := m.addEventsSubjects(ctx); err != nil {
		return err
	}
	mesh, err := m.js.Stream(ctx, s.Stream())
	if err != nil {
		return fmt.Errorf("ackmonitor: stream %s: %w", s.Stream(), err)
	}
	common := func(name, desc string) jetstream.ConsumerConfig {
		return jetstream.ConsumerConfig{
			Durable: name, Description: desc, DeliverPolicy: jetstream.DeliverAllPolicy,
			AckPolicy: jetstream.AckExplicitPolicy, AckWait: m.cfg.AckWait, MaxDeliver: -1,
			MaxAckPending: 4 * m.cfg.BatchSize, PriorityPolicy: jetstream.PriorityPolicyPinned,
			PriorityGroups: []string{m.cfg.PriorityGroup}, PinnedTTL: m.cfg.PinnedTTL,
		}
	}
	events, err := m.js.CreateOrUpdateConsumer(ctx, s.EventsStream(), common(m.eventsConsumerName(), "ack monitor: consumer events"))
	if err != nil {
		return fmt.Errorf("ackmonitor: consumer on %s: %w", s.EventsStream(), err)
	}
	sc := common(m.sendsConsumerName(), "ack monitor: every send (headers only)")
	sc.HeadersOnly = true
	sends, err := m.js.CreateOrUpdateConsumer(ctx, s.Stream(), sc)
	if err != nil {
		return fmt.Errorf("ackmonitor: consumer on %s: %w", s.Stream(), err)
	}
	m.mu.Lock()
	m.mesh, m.events, m.sends = mesh, events, sends
	m.mu.Unlock()
	return nil
}

// addEventsSubjects adds the subjects an events stream created by an
// earlier version lacks (the wake-up).
func (m *Monitor) addEventsSubjects(ctx context.Context) error {
	name := m.cfg.Scheme.EventsStream()
	st, err := m.js.Stream(ctx, name)
	if err != nil {
		return fmt.Errorf("ackmonitor: stream %s: %w", name, err)
	}
	cfg := st.CachedInfo().Config
	n := len(cfg.Subjects)
	for _, subj := range m.cfg.Scheme.EventsSubjects() {
		if !slices.Contains(cfg.Subjects, subj) {
			cfg.Subjects = append(cfg.Subjects, subj)
		}
	}
	if len(cfg.Subjects) == n {
		return nil
	}
	if _, err := m.js.UpdateStream(ctx, cfg); err != nil {
		return fmt.Errorf("ackmonitor: add subjects %q to %s: %w", cfg.Subjects[n:], name, err)
	}
	return nil
}

// statusLoop checks whether this instance holds the events pin and
// refreshes the lag gauges.
func (m *Monitor) statusLoop(ctx context.Context) {
	t := time.NewTicker(m.cfg.StatusInterval)
	defer t.Stop()
	for {
		m.refreshStatus(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (m *Monitor) refreshStatus(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	active := false
	var eventsPending int64 // fetched from the events consumer by others, not yet acked
	for _, c := range []jetstream.Consumer{m.events, m.sends} {
		heldBefore := m.eventsHeld.Load()
		info, err := c.Info(ctx)
		if err != nil {
			// An instance that cannot reach the server cannot know it is
			// still pinned: it steps down.
			if ctx.Err() == nil {
				m.cfg.Logger.Warn("consumer info", "err", err)
			}
			continue
		}
		m.metrics.pending.WithLabelValues(info.Name).Set(float64(info.NumPending + uint64(info.NumAckPending)))
		if c != m.events {
			continue
		}
		// The info may or may not count a batch fetched or acked while it
		// was on its way: subtracting the smaller count errs on the side
		// of waiting.
		eventsPending = int64(info.NumAckPending) - min(heldBefore, m.eventsHeld.Load())
		pin, pinned := m.eventPin.Load().(string), ""
		for _, g := range info.PriorityGroups {
			if g.Group == m.cfg.PriorityGroup {
				pinned = g.PinnedClientID
			}
		}
		switch {
		case pin != "" && pinned == pin:
			active = true
		case pinned == "" && info.NumPending == 0:
			// Nobody is pinned and no event is on its way to pin anyone:
			// a quiet mesh after a takeover or a restart, where follow-ups
			// would wait for the next event.
			m.wakeEvents(ctx)
		}
	}
	// Step down at once; step up only after holding the pin for two status
	// intervals, by which time a previous holder has seen the new pin in
	// its own status check and stepped down.
	switch {
	case !active:
		m.pinnedAt = time.Time{}
	case m.pinnedAt.IsZero():
		m.pinnedAt, m.othersHeld = time.Now(), eventsPending
		active = false
	default:
		m.othersHeld = min(m.othersHeld, eventsPending)
		active = time.Since(m.pinnedAt) >= 2*m.cfg.StatusInterval
	}
	if active {
		m.activeAt.Store(time.Now().UnixNano())
	}
	if was := m.active.Swap(active); was != active {
		m.cfg.Logger.Info("ack monitor role changed", "id", m.cfg.MonitorID, "active", active)
		if active {
			from := time.Now()
			if m.othersHeld > 0 {
				// Events fetched by an instance that held the pin before
				// (another one, or this process's previous run) and
				// never acked come back after AckWait; until then rows
				// may lack them. Only the pinned instance is sent events,
				// so a count that stayed above zero at every check since
				// this one was pinned is not its own.
				from = from.Add(m.cfg.AckWait)
				m.cfg.Logger.Info("follow-ups wait for a previous instance's events", "in_flight", m.othersHeld, "until", from)
			}
			m.followUpAt.Store(from.UnixNano())
			m.wake()
		}
	}
	if m.Active() {
		m.metrics.active.Set(1)
	} else {
		m.metrics.active.Set(0)
		m.reportAlerts(nil) // a standby reports no alerts and no stale rows
		m.reportStalePending(-1)
	}
}

// wakeEvents publishes a wake-up to the events stream. The server pins the
// instance it delivers it to, which learns its pin from the message.
func (m *Monitor) wakeEvents(ctx context.Context) {
	if _, err := m.js.Publish(ctx, m.cfg.Scheme.MonitorWake(), nil); err != nil && ctx.Err() == nil {
		m.cfg.Logger.Warn("events wake-up", "subject", m.cfg.Scheme.MonitorWake(), "err", err)
	}
}

func (m *Monitor) wake() {
	select {
	case m.kick <- struct{}{}:
	default:
	}
}

// everyTick calls f every interval until ctx is done.
func everyTick(ctx context.Context, every time.Duration, f func()) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			f()
		}
	}
}

func (m *Monitor) rollupLoop(ctx context.Context) {
	everyTick(ctx, m.cfg.RollupInterval, func() {
		if err := m.cfg.Store.Rollup(ctx); err != nil && ctx.Err() == nil {
			m.cfg.Logger.Warn("rollup", "err", err)
		}
	})
	// A last rollup so the hourly table is current at shutdown.
	c, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := m.cfg.Store.Rollup(c); err != nil {
		m.cfg.Logger.Warn("final rollup", "err", err)
	}
}
