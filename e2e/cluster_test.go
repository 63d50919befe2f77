// Package e2e holds end-to-end tests across packages on embedded NATS
// servers: the demo workflows, a stream-leader failover under load, and
// leader step-downs of the message stream, a consumer, and the monitor's
// events and dead-letter streams under load, on a 3-node JetStream cluster
// with R3 streams.
package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/ackmonitor"
	"github.com/agentmesh-io/agentmesh/ackmonitor/store"
	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/dlq"
	"github.com/agentmesh-io/agentmesh/internal/demo"
	"github.com/agentmesh-io/agentmesh/internal/metricstest"
	"github.com/agentmesh-io/agentmesh/internal/natstest"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// ensureStream creates the R3 message stream, retrying while the cluster's
// JetStream is still settling (10008).
func ensureStream(t *testing.T, js jetstream.JetStream, scheme subjects.Scheme) {
	t.Helper()
	natstest.WaitFor(t, 20*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return agentkit.EnsureStream(ctx, js, agentkit.StreamConfig(scheme, 3))
	})
}

// TestCluster_DemoWorkflows runs both demo workflows on a 3-node cluster
// with R3 streams, every agent on its own connection to all three nodes,
// and the ack monitor escalating the hung executor's message to the
// director.
func TestCluster_DemoWorkflows(t *testing.T) {
	c := natstest.RunCluster(t, 3)
	admin := c.Connect(t)
	js, _ := jetstream.New(admin)
	ensureStream(t, js, subjects.Default)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	st, err := store.OpenSQLite(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() }) // after the monitor stops (cleanups run last in, first out)
	runMonitor(t, ctx, c.Connect(t), ackmonitor.Config{Store: st, Replicas: 3, DefaultDirector: demo.Director})

	m, err := demo.Start(ctx, demo.Config{
		ExpectEscalation: true,
		Connect: func(ctx context.Context, name string) (*nats.Conn, error) {
			return nats.Connect(c.ClientURLs(), nats.Name(name), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
		},
		Options: []agentkit.Option{agentkit.WithReplicas(3)},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Stop(context.Background())
	w, err := m.RunCreditLimit(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !w.OK {
		t.Fatalf("credit limit workflow did not end as expected: %+v", w.Steps)
	}
	f, err := m.RunFailure(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !f.OK {
		t.Fatalf("failure workflow did not end as expected: %+v", f.Steps)
	}
	info, err := m.Agent(demo.Planner).ConsumerInfo(ctx, wire.PriorityHigh)
	if err != nil {
		t.Fatal(err)
	}
	if info.Config.Replicas != 0 && info.Config.Replicas != 3 || info.Cluster == nil || len(info.Cluster.Replicas) != 2 {
		t.Fatalf("planner consumer is not R3: %+v %+v", info.Config.Replicas, info.Cluster)
	}
}

// ledger records how often each message id reached a handler.
type ledger struct {
	mu              sync.Mutex
	seen            map[string]int
	unique          atomic.Int64
	dups            atomic.Int64
	redeliveredSeen atomic.Int64 // handled with Delivery > 1
}

func (l *ledger) record(m *agentkit.Message) {
	l.mu.Lock()
	l.seen[m.MessageID]++
	n := l.seen[m.MessageID]
	l.mu.Unlock()
	if n == 1 {
		l.unique.Add(1)
	} else {
		l.dups.Add(1)
	}
	if m.Delivery > 1 {
		l.redeliveredSeen.Add(1)
	}
}

// waitSettled waits until the agents' normal-priority consumers have
// nothing pending or unacknowledged, so nothing is left to redeliver.
func waitSettled(t *testing.T, ctx context.Context, agents ...*agentkit.Agent) {
	t.Helper()
	natstest.WaitFor(t, 60*time.Second, func() error {
		for _, a := range agents {
			info, err := a.ConsumerInfo(ctx, wire.PriorityNormal)
			if err != nil {
				return err
			}
			if info.NumAckPending != 0 || info.NumPending != 0 {
				return fmt.Errorf("%s: %d ack pending, %d pending", a.ID(), info.NumAckPending, info.NumPending)
			}
		}
		return nil
	})
}

// stepDown asks the JetStream API (api: a stream or consumer leader
// step-down subject) to move a leader, and says why it did not.
func stepDown(nc *nats.Conn, api string) error {
	reply, err := nc.Request(api, nil, time.Second)
	if err != nil {
		return err
	}
	var resp struct {
		Success bool
		Error   *jetstream.APIError
	}
	if err := json.Unmarshal(reply.Data, &resp); err != nil {
		return err
	}
	if !resp.Success {
		return fmt.Errorf("step-down refused: %v", resp.Error)
	}
	return nil
}

// runMonitor runs an ack monitor on nc until the test ends and returns it
// once it is ready.
func runMonitor(t *testing.T, ctx context.Context, nc *nats.Conn, cfg ackmonitor.Config) *ackmonitor.Monitor {
	t.Helper()
	if cfg.Logger == nil { // shown when the test fails
		cfg.Logger = slog.New(slog.NewTextHandler(t.Output(), nil))
	}
	mon, err := ackmonitor.New(nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- mon.Run(ctx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("monitor: %v", err)
		}
	})
	select {
	case <-mon.Ready():
	case err := <-done:
		t.Fatalf("monitor: %v", err)
	case <-ctx.Done():
		t.Fatal("monitor not ready")
	}
	return mon
}

// TestCluster_LeaderFailoverUnderLoad sends 20,000 messages from 4
// senders to 4 receivers while the MESH stream leader is shut down and
// later restarted: every message is stored once and handled, no message id
// reaches a handler twice, and the restarted node catches up. The senders
// send the second half of their messages from the moment the leader is
// shut down, so their sends meet a stream without a leader.
func TestCluster_LeaderFailoverUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping the 20,000-message failover test in -short mode (CI runs it without -short)")
	}
	const (
		senders   = 4
		receivers = 4
		total     = 20000
		batch     = 500
	)
	c := natstest.RunCluster(t, 3)
	admin := c.Connect(t)
	js, _ := jetstream.New(admin)
	scheme, _ := subjects.New("load")
	ensureStream(t, js, scheme)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Second)
	defer cancel()

	// Short ack timeouts so a delivery lost with the old leader comes back
	// within the test, and enough attempts that none is exhausted.
	policy := agentkit.DeliveryPolicy{BackOff: []time.Duration{2 * time.Second, 4 * time.Second, 8 * time.Second},
		MaxDeliver: 10, ProcessingLimit: 30 * time.Second, Prefetch: 64, MaxAckPending: 5000}
	var asyncErrs atomic.Int64
	opts := func() []agentkit.Option {
		return []agentkit.Option{agentkit.WithScheme(scheme), agentkit.WithReplicas(3),
			agentkit.WithPolicy(wire.PriorityNormal, policy), agentkit.WithPublishTimeout(30 * time.Second),
			agentkit.WithErrorHandler(func(error) { asyncErrs.Add(1) })}
	}
	l := &ledger{seen: make(map[string]int, total)}
	var recv []*agentkit.Agent
	for i := range receivers {
		a, err := agentkit.New(c.Connect(t), fmt.Sprintf("worker_%d", i), opts()...)
		if err != nil {
			t.Fatal(err)
		}
		a.HandleFunc("work", func(ctx context.Context, m *agentkit.Message) error { l.record(m); return nil })
		natstest.WaitFor(t, 20*time.Second, func() error { return a.Start(ctx) })
		recv = append(recv, a)
		defer a.Stop()
	}
	payload := []byte(`{"data":"` + fmt.Sprintf("%0500d", 0) + `"}`)

	var sent []*agentkit.Agent
	var sendWG, halfSent sync.WaitGroup
	resume := make(chan struct{}) // closed when the leader is shut down
	sendErrs := make(chan error, senders)
	for s := range senders {
		a, err := agentkit.New(c.Connect(t), fmt.Sprintf("sender_%d", s), opts()...)
		if err != nil {
			t.Fatal(err)
		}
		defer a.Stop()
		sent = append(sent, a)
		halfSent.Add(1)
		sendWG.Go(func() {
			envs := make([]*wire.Envelope, 0, batch)
			for i := range total / senders {
				if i == total/senders/2 {
					halfSent.Done()
					<-resume
				}
				e, err := a.NewRequest(ctx, fmt.Sprintf("worker_%d", (s+i)%receivers), "work", payload)
				if err != nil {
					sendErrs <- err
					return
				}
				envs = append(envs, e)
				if len(envs) == batch {
					if err := a.SendBatch(ctx, envs); err != nil {
						sendErrs <- err
						return
					}
					envs = envs[:0]
				}
			}
		})
	}

	// Once half is sent and a quarter handled, shut the stream leader down.
	halfSent.Wait()
	natstest.WaitFor(t, 60*time.Second, func() error {
		if n := l.unique.Load(); n < total/4 {
			return fmt.Errorf("%d handled", n)
		}
		return nil
	})
	leader := -1
	natstest.WaitFor(t, 10*time.Second, func() error {
		var err error
		leader, err = c.StreamLeader(ctx, js, scheme.Stream())
		return err
	})
	atKill := l.unique.Load()
	t.Logf("shutting down stream leader %s with %d of %d handled", c.Opts[leader].ServerName, atKill, total)
	c.Shutdown(leader)
	close(resume)
	// Keep the node down until the mesh has made progress without it.
	natstest.WaitFor(t, 60*time.Second, func() error {
		if n := l.unique.Load(); n < atKill+total/4 && n < total {
			return fmt.Errorf("%d handled since the shutdown", n-atKill)
		}
		return nil
	})
	t.Logf("restarting %s with %d handled", c.Opts[leader].ServerName, l.unique.Load())
	c.Restart(t, leader)

	sendWG.Wait()
	close(sendErrs)
	for err := range sendErrs {
		t.Fatalf("send: %v", err)
	}
	waitHandled(t, l, total)
	// Nothing may be left to redeliver before duplicates are counted.
	waitSettled(t, ctx, recv...)
	c.WaitStreamCurrent(t, js, scheme.Stream(), 60*time.Second)

	if n := streamMsgs(t, ctx, js, scheme.Stream()); n != total {
		t.Errorf("stream holds %d messages, want %d (none lost, none stored twice)", n, total)
	}
	var sendStats agentkit.Stats
	for _, a := range sent {
		st := a.Stats()
		sendStats.PublishRetries += st.PublishRetries
		sendStats.FastBatched += st.FastBatched
		sendStats.FastBatchFallbacks += st.FastBatchFallbacks
	}
	t.Logf("handled %d distinct, %d duplicate handler calls, %d handled on a redelivery; %d background errors",
		l.unique.Load(), l.dups.Load(), l.redeliveredSeen.Load(), asyncErrs.Load())
	t.Logf("senders: %d messages stored in fast batches, %d fell back to one-by-one publishing, %d publish retries",
		sendStats.FastBatched, sendStats.FastBatchFallbacks, sendStats.PublishRetries)
	if sendStats.FastBatched == 0 {
		t.Errorf("no message was stored with fast batch publish: the R3 stream should take them")
	}
	if d := l.dups.Load(); d != 0 {
		l.mu.Lock()
		var ex []string
		for id, n := range l.seen {
			if n > 1 && len(ex) < 5 {
				ex = append(ex, fmt.Sprintf("%s×%d", id, n))
			}
		}
		l.mu.Unlock()
		t.Errorf("%d handler calls saw a message id already handled (at-least-once redelivery after the failover; %d handled on a redelivery); e.g. %v",
			d, l.redeliveredSeen.Load(), ex)
	}
}

// leaderChanges is a 3-node cluster with an R3 message stream for the
// leader-change tests, and the agent options they share: short ack
// timeouts and enough attempts that a delivery lost in a change comes back
// within the test, never exhausted.
type leaderChanges struct {
	c      *natstest.Cluster
	admin  *nats.Conn
	js     jetstream.JetStream
	scheme subjects.Scheme
	opts   []agentkit.Option
}

func newLeaderChanges(t *testing.T, prefix string) *leaderChanges {
	t.Helper()
	if testing.Short() {
		t.Skip("skipping a leader-change test in -short mode (CI runs it without -short)")
	}
	r := &leaderChanges{c: natstest.RunCluster(t, 3)}
	r.admin = r.c.Connect(t)
	r.js, _ = jetstream.New(r.admin)
	r.scheme, _ = subjects.New(prefix)
	ensureStream(t, r.js, r.scheme)
	policy := agentkit.DeliveryPolicy{BackOff: []time.Duration{2 * time.Second, 4 * time.Second},
		MaxDeliver: 10, ProcessingLimit: 30 * time.Second, Prefetch: 64, MaxAckPending: 5000}
	r.opts = []agentkit.Option{agentkit.WithScheme(r.scheme), agentkit.WithReplicas(3),
		agentkit.WithPolicy(wire.PriorityNormal, policy), agentkit.WithPublishTimeout(30 * time.Second)}
	return r
}

// agent returns agent id on a connection of its own, stopped when the test
// ends.
func (r *leaderChanges) agent(t *testing.T, id string, opts ...agentkit.Option) *agentkit.Agent {
	t.Helper()
	a, err := agentkit.New(r.c.Connect(t), id, append(slices.Clone(r.opts), opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Stop)
	return a
}

// worker starts agent "worker", whose "work" handler records each message
// in the returned ledger.
func (r *leaderChanges) worker(t *testing.T, ctx context.Context, opts ...agentkit.Option) (*agentkit.Agent, *ledger) {
	t.Helper()
	l := &ledger{seen: map[string]int{}}
	a := r.agent(t, "worker", opts...)
	a.HandleFunc("work", func(ctx context.Context, m *agentkit.Message) error { l.record(m); return nil })
	natstest.WaitFor(t, 20*time.Second, func() error { return a.Start(ctx) })
	return a, l
}

// stepDownRepeatedly asks api (a stream or consumer leader step-down
// subject) to move a leader at once and then every 250ms, up to times
// times, until the returned stop is called. After each step-down it
// records progress() (0 when progress is nil), what the test had done by
// then; stop returns those records, one per step-down. Call stop before
// the test ends.
func (r *leaderChanges) stepDownRepeatedly(ctx context.Context, api string, times int, progress func() int64) (stop func() []int64) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan []int64, 1)
	go func() {
		var at []int64
		defer func() { done <- at }()
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for len(at) < times {
			if stepDown(r.admin, api) == nil {
				var n int64
				if progress != nil {
					n = progress()
				}
				at = append(at, n)
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	var at []int64
	var once sync.Once
	return func() []int64 {
		once.Do(func() { cancel(); at = <-done })
		return at
	}
}

// monitor runs an ack monitor for the cluster's scheme with R3 streams
// (cfg's other fields as given) on a SQLite ledger in a temporary
// directory until the test ends, and returns both once the monitor is
// active.
func (r *leaderChanges) monitor(t *testing.T, ctx context.Context, cfg ackmonitor.Config) (*ackmonitor.Monitor, store.Store) {
	t.Helper()
	st, err := store.OpenSQLite(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() }) // after the monitor stops (cleanups run last in, first out)
	cfg.Store, cfg.Scheme, cfg.Replicas = st, r.scheme, 3
	mon := runMonitor(t, ctx, r.c.Connect(t), cfg)
	natstest.WaitFor(t, 30*time.Second, func() error {
		if !mon.Active() {
			return errors.New("monitor not active")
		}
		return nil
	})
	return mon, st
}

// sendWork sends n "work" requests carrying payload to the worker with one
// SendBatch.
func sendWork(t *testing.T, ctx context.Context, sender *agentkit.Agent, n int, payload any) {
	t.Helper()
	envs := make([]*wire.Envelope, n)
	for i := range envs {
		var err error
		if envs[i], err = sender.NewRequest(ctx, "worker", "work", payload); err != nil {
			t.Fatal(err)
		}
	}
	if err := sender.SendBatch(ctx, envs); err != nil {
		t.Fatal(err)
	}
}

// TestCluster_FastBatchAcrossLeaderChanges sends batches of 1,000 with
// SendBatch while the MESH stream's leader steps down every 250ms, so
// leadership changes in the middle of fast batches: the batches they
// interrupt fall back to one-by-one publishing under the same message ids,
// and every message is stored once and handled once.
func TestCluster_FastBatchAcrossLeaderChanges(t *testing.T) {
	const (
		batch        = 1000
		minBatches   = 10
		maxBatches   = 40
		maxStepDowns = 6
	)
	r := newLeaderChanges(t, "stepdown")
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
	defer cancel()
	recv, l := r.worker(t, ctx)
	sender := r.agent(t, "sender")

	// Step the leader down every 250ms while the sender sends, at most
	// maxStepDowns times.
	stopStepping := r.stepDownRepeatedly(ctx, subjects.API("STREAM", "LEADER", "STEPDOWN", r.scheme.Stream()), maxStepDowns, nil)
	defer stopStepping()
	payload := json.RawMessage(`{"data":"` + fmt.Sprintf("%02000d", 0) + `"}`)
	sent := 0
	for sent < minBatches*batch || (sender.Stats().FastBatchFallbacks == 0 && sent < maxBatches*batch) {
		sendWork(t, ctx, sender, batch, payload)
		sent += batch
	}
	stepDowns := len(stopStepping())
	st := sender.Stats()
	t.Logf("sent %d messages across %d leader step-downs: %d in fast batches, %d fell back to one-by-one publishing, %d publish retries",
		sent, stepDowns, st.FastBatched, st.FastBatchFallbacks, st.PublishRetries)
	if st.FastBatchFallbacks == 0 {
		t.Fatalf("no fast batch was interrupted in %d batches", sent/batch)
	}
	waitHandled(t, l, sent)
	waitSettled(t, ctx, recv)
	if n := streamMsgs(t, ctx, r.js, r.scheme.Stream()); n != uint64(sent) || l.dups.Load() != 0 {
		t.Errorf("stream holds %d messages (want %d) and %d handler calls saw a message id again (want none)",
			n, sent, l.dups.Load())
	}
}

// streamMsgs returns how many messages stream holds.
func streamMsgs(t *testing.T, ctx context.Context, js jetstream.JetStream, stream string) uint64 {
	t.Helper()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

// waitHandled waits until the receivers recording in l have handled n
// distinct messages.
func waitHandled(t *testing.T, l *ledger, n int) {
	t.Helper()
	natstest.WaitFor(t, 60*time.Second, func() error {
		if got := l.unique.Load(); got < int64(n) {
			return fmt.Errorf("%d of %d distinct messages handled", got, n)
		}
		return nil
	})
}

// TestCluster_ConsumerLeaderChanges moves the leader of a receiver's
// consumer five times while it works through 20,000 messages: every
// message is handled once (redeliveries of messages already handled are
// absorbed), and the receiver keeps consuming after each change.
func TestCluster_ConsumerLeaderChanges(t *testing.T) {
	const (
		total        = 20000
		maxStepDowns = 5
	)
	r := newLeaderChanges(t, "consumerstep")
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
	defer cancel()
	sender := r.agent(t, "sender")
	for range total / 1000 {
		sendWork(t, ctx, sender, 1000, map[string]int{"n": 1})
	}
	var missedHeartbeats atomic.Int64
	recv, l := r.worker(t, ctx, agentkit.WithErrorHandler(func(err error) {
		if errors.Is(err, jetstream.ErrNoHeartbeat) {
			missedHeartbeats.Add(1)
		} else {
			t.Errorf("receiver: %v", err)
		}
	}))
	consumer, _ := r.scheme.Consumer("worker", string(wire.PriorityNormal))

	// Once the receiver has handled a message, step the consumer's leader
	// down while it works, noting how many messages were handled at each
	// step-down.
	waitHandled(t, l, 1)
	stop := r.stepDownRepeatedly(ctx, subjects.API("CONSUMER", "LEADER", "STEPDOWN", r.scheme.Stream(), consumer), maxStepDowns,
		l.unique.Load)
	defer stop()
	waitHandled(t, l, total)
	handledAt := stop()
	waitSettled(t, ctx, recv)
	t.Logf("handled at each step-down: %v of %d; %d handled on a redelivery, %d redeliveries of handled messages absorbed, %d missed-heartbeat re-pulls",
		handledAt, total, l.redeliveredSeen.Load(), recv.Stats().Outcomes[agentkit.OutcomeDuplicate], missedHeartbeats.Load())
	if !slices.ContainsFunc(handledAt, func(n int64) bool { return n > 0 && n < total }) {
		t.Errorf("handled at each step-down: %v of %d; the test moved no leader under load", handledAt, total)
	}
	if d := l.dups.Load(); d != 0 {
		t.Errorf("%d handler calls saw a message id already handled", d)
	}
}

// TestCluster_MonitorAcrossEventsStreamLeaderChanges moves the leader of
// the monitor's events stream five times while a receiver acks 5,000
// messages, a batch of 500 sent before each step-down: an ack metric
// published while the stream has no leader is not captured, and the
// monitor's core NATS intake must record it, so every message ends ACK in
// the ledger, from its event (none inferred), and none stays pending.
func TestCluster_MonitorAcrossEventsStreamLeaderChanges(t *testing.T) {
	const (
		batch     = 500
		stepDowns = 5
		total     = 2 * stepDowns * batch
	)
	r := newLeaderChanges(t, "eventstep")
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
	defer cancel()
	mon, st := r.monitor(t, ctx, ackmonitor.Config{})
	metrics := httptest.NewServer(mon.Handler())
	t.Cleanup(metrics.Close)

	sender := r.agent(t, "sender")
	for range stepDowns {
		sendWork(t, ctx, sender, batch, map[string]int{"n": 1})
	}
	recv, l := r.worker(t, ctx)
	// While the receiver acks, send a batch and step the events stream's
	// leader down, five times, noting how many messages were handled at
	// each step-down.
	var handledAt []int64
	for range stepDowns {
		sendWork(t, ctx, sender, batch, map[string]int{"n": 1})
		natstest.WaitFor(t, 20*time.Second, func() error {
			return stepDown(r.admin, subjects.API("STREAM", "LEADER", "STEPDOWN", r.scheme.EventsStream()))
		})
		handledAt = append(handledAt, l.unique.Load())
	}
	if !slices.ContainsFunc(handledAt, func(n int64) bool { return n > 0 && n < total }) {
		t.Fatalf("handled at each step-down: %v of %d; the test moved no leader under load", handledAt, total)
	}
	waitHandled(t, l, total)
	waitSettled(t, ctx, recv)
	var acked, pending int64
	natstest.WaitFor(t, 60*time.Second, func() error {
		rates, err := st.Rates(ctx, time.Time{})
		if err != nil {
			return err
		}
		acked, pending = 0, 0
		for _, r := range rates {
			if r.Agent == "worker" {
				acked, pending = acked+r.Acked, pending+r.Pending
			}
		}
		if acked != total || pending != 0 {
			return fmt.Errorf("ledger: %d ACK, %d pending; want %d and none", acked, pending, total)
		}
		return nil
	})
	// Every ACK came with its ack metric: none was inferred from the
	// consumer's ack floor (which would hide events lost on both paths).
	inferred, err := metricstest.Value(metrics.URL+"/metrics", `ackmonitor_inferred_acks_total{agent="worker",priority="normal"}`)
	if err != nil || inferred != 0 {
		t.Errorf("%v ACKs inferred (%v); want every ACK recorded from its event", inferred, err)
	}
	t.Logf("handled at each step-down: %v of %d; ledger: %d ACK, %d pending", handledAt, total, acked, pending)
}

// TestCluster_DeadLettersAcrossDLQStreamLeaderChanges has a receiver
// terminate 2,000 messages, then steps the leader of the dead-letter stream
// down every 250ms while the monitor copies them there: a copy that meets
// the stream without a leader fails, its row stays pending and it is
// copied again under the same message id, so the DLQ ends with each
// terminated message exactly once and every ledger row records its dead
// letter. (nats.go retries a publish that finds no stream leader, so few
// copies fail; TestFollowUp_RetriesUntilTheDLQTakesIt in ackmonitor makes
// them fail for sure.) The receiver terminates on the broker alone, with
// no reply to wait for, so the monitor's pace is what the test measures:
// an agentkit receiver rejecting under load took longer than the test
// waits.
func TestCluster_DeadLettersAcrossDLQStreamLeaderChanges(t *testing.T) {
	const (
		total     = 2000
		stepDowns = 12
		series    = `ackmonitor_dead_letters_total{agent="worker",priority="normal"}`
	)
	r := newLeaderChanges(t, "dlqstep")
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
	defer cancel()
	mon, st := r.monitor(t, ctx, ackmonitor.Config{EvaluateInterval: time.Second})
	metrics := httptest.NewServer(mon.Handler())
	t.Cleanup(metrics.Close)

	// The receiver: worker's normal consumer, as agentkit configures it,
	// terminating every message it is delivered.
	consumer, _ := r.scheme.Consumer("worker", string(wire.PriorityNormal))
	filter, _ := r.scheme.DirectFilter("worker", string(wire.PriorityNormal))
	var cons jetstream.Consumer
	natstest.WaitFor(t, 20*time.Second, func() error {
		var err error
		cons, err = r.js.CreateOrUpdateConsumer(ctx, r.scheme.Stream(), jetstream.ConsumerConfig{Durable: consumer,
			FilterSubject: filter, AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: total})
		return err
	})
	var mu sync.Mutex
	terminated := map[string]int{} // message id → deliveries terminated
	cc, err := cons.Consume(func(m jetstream.Msg) {
		if err := m.TermWithReason("REJECTED: dead-letter test"); err != nil {
			return // delivered again
		}
		mu.Lock()
		terminated[m.Headers().Get(wire.HeaderMsgID)]++
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Stop()
	sender := r.agent(t, "sender")
	sendWork(t, ctx, sender, total, map[string]int{"n": 1})

	// Once the first message is dead-lettered, move the DLQ stream's leader
	// while the monitor dead-letters the rest, noting how many were
	// dead-lettered at each step-down.
	natstest.WaitFor(t, 30*time.Second, func() error {
		n, err := metricstest.Value(metrics.URL+"/metrics", series)
		if err == nil && n == 0 {
			err = errors.New("nothing dead-lettered yet")
		}
		return err
	})
	started := time.Now()
	stop := r.stepDownRepeatedly(ctx, subjects.API("STREAM", "LEADER", "STEPDOWN", r.scheme.DLQStream()), stepDowns, func() int64 {
		n, err := metricstest.Value(metrics.URL+"/metrics", series)
		if err != nil {
			t.Error(err)
		}
		return int64(n)
	})
	defer stop()
	natstest.WaitForProgress(t, 30*time.Second, total, "ledger rows recording their dead letter", func() (int, error) {
		recs, err := st.Messages(ctx, store.Query{DeadLetter: true, Receiver: "worker", Limit: total + 1})
		return len(recs), err
	})
	took := time.Since(started)
	at := stop()
	if !slices.ContainsFunc(at, func(n int64) bool { return n > 0 && n < total }) {
		t.Fatalf("dead-lettered messages at each step-down: %v of %d; the test moved no leader while the monitor dead-lettered", at, total)
	}

	// The DLQ holds each terminated message once, under its original id.
	if n := streamMsgs(t, ctx, r.js, r.scheme.DLQStream()); n != total {
		t.Fatalf("the DLQ holds %d messages; want %d", n, total)
	}
	letters, err := r.js.OrderedConsumer(ctx, r.scheme.DLQStream(), jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	copies := map[string]int{}
	// The stream holds total messages (above), so reading stops there; a
	// fetch that comes back empty on a busy machine is tried again.
	for received := 0; received < total && ctx.Err() == nil; {
		msgs, err := letters.Fetch(total-received, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for m := range msgs.Messages() {
			copies[m.Headers().Get(dlq.HeaderOriginalID)]++
			received++
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for id, n := range copies {
		if n != 1 || terminated[id] == 0 {
			t.Errorf("dead letter %q: %d copies of a message the receiver terminated %d times; want 1 of a terminated one", id, n, terminated[id])
		}
	}
	if len(copies) != total || len(terminated) != total {
		t.Errorf("the DLQ holds %d distinct messages and the receiver terminated %d; want %d each", len(copies), len(terminated), total)
	}
	failures, err := metricstest.Value(metrics.URL+"/metrics", "ackmonitor_follow_up_failures_total")
	if err != nil {
		t.Error(err)
	}
	t.Logf("dead-lettered messages at each step-down of the DLQ stream's leader: %v of %d, all %v after the first; %v copies failed and were made again",
		at, total, took.Round(time.Millisecond), failures)
}
