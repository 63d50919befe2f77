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
//
// Its jobs own their state: the lease (whether this instance is the
// active one), the intake (sends and events into the ledger) and the
// follow-ups (dead letters and escalations); the Monitor wires them
// together and runs the loops that read across them (status check,
// alerts, reconciliation, rollups).
type Monitor struct {
	cfg     Config
	nc      *nats.Conn
	js      jetstream.JetStream
	metrics *metrics
	ready   chan struct{}

	lease     *lease
	intake    *intake
	followUps *followUps
	unknown   *unknownReceivers
	groups    *groupMembers

	evaluatedAt atomic.Int64 // UnixNano when an alert evaluation last completed

	mu      sync.Mutex
	running bool
	// Set by provision before Run starts the loops that read them.
	mesh   jetstream.Stream
	events jetstream.Consumer
	sends  jetstream.Consumer
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
	copier, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(copyTimeout),
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
	m := &Monitor{cfg: cfg, nc: nc, js: js, metrics: newMetrics(), ready: make(chan struct{}),
		lease: newLease(cfg.PinnedTTL, cfg.StatusInterval)}
	m.followUps = &followUps{cfg: &m.cfg, nc: nc, js: js, dlq: copier, sender: sender, metrics: m.metrics, lease: m.lease,
		kick: make(chan struct{}, 1)}
	m.groups = newGroupMembers(js, cfg.Scheme, cfg.Logger)
	m.unknown = newUnknownReceivers(&m.cfg, js, m.metrics)
	m.unknown.groups = m.groups
	m.intake = &intake{cfg: &m.cfg, nc: nc, metrics: m.metrics, lease: m.lease, followUps: m.followUps,
		unknown: m.unknown, direct: newDirectEvents(directRemembered), groups: m.groups, seqs: newSeqReceivers(seqRemembered)}
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
func (m *Monitor) Active() bool { return m.lease.Active() }

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
	defer m.followUps.stop()

	if err := m.provision(ctx); err != nil {
		return err
	}
	m.intake.mesh = m.mesh // before the intake starts
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() { m.intake.pullEvents(ctx, m.events) })
	wg.Go(func() { m.intake.pullSends(ctx, m.sends, m.mesh) })
	wg.Go(func() { m.intake.directIntake(ctx) })
	wg.Go(func() { m.statusLoop(ctx) })
	wg.Go(func() { m.alertLoop(ctx) })
	wg.Go(func() { m.followUps.run(ctx, m.mesh) })
	wg.Go(func() { m.rollupLoop(ctx) })
	wg.Go(func() { m.reconcileLoop(ctx) })
	wg.Go(func() { m.unknown.run(ctx) })
	close(m.ready)
	m.cfg.Logger.Info("ack monitor running", "id", m.cfg.MonitorID, "stream", m.cfg.Scheme.Stream())
	<-ctx.Done()
	wg.Wait()
	m.lease.resign()
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
