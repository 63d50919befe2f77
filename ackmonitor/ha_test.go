package ackmonitor_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentmesh-io/agentmesh/ackmonitor"
	"github.com/agentmesh-io/agentmesh/ackmonitor/store"
	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// Two instances share the pinned consumers: one is active; killing it
// under load hands over to the other after the pin TTL and no event is lost.
func TestHA_FailoverUnderLoad(t *testing.T) {
	t.Parallel()
	for _, kind := range []storeKind{sqliteStore, postgresStore} {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			testFailover(t, kind)
		})
	}
}

func testFailover(t *testing.T, kind storeKind) {
	const n = 600
	m := newMesh(t)
	st := openStore(t, kind)
	ctx := testCtx(t)
	m.agent("worker", map[string]agentkit.HandlerFunc{
		"work": func(_ context.Context, msg *agentkit.Message) error {
			if msg.Delivery == 1 && len(msg.Payload) > 0 && msg.Payload[len(msg.Payload)-2] == '7' {
				return agentkit.Busy(time.Millisecond) // every tenth message is NAKed once
			}
			return nil
		},
	})
	client := m.agent("client", nil)
	cfg := haConfig(st)
	a, b := startMonitor(t, m.s, cfg), startMonitor(t, m.s, cfg)

	var naked atomic.Int64
	half, killed := make(chan struct{}), make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := range n {
			if i == n/2 {
				close(half)
				select { // the second half flows while the standby takes over
				case <-killed:
				case <-ctx.Done():
					return
				}
			}
			if i%10 == 7 {
				naked.Add(1)
			}
			if _, err := client.Send(ctx, "worker", "work", map[string]int{"i": i}); err != nil {
				t.Error(err)
				return
			}
		}
	})
	// Never two active instances at once.
	stopWatch := make(chan struct{})
	var both atomic.Bool
	var watch sync.WaitGroup
	defer watch.Wait()
	defer close(stopWatch)
	watch.Go(func() {
		for {
			select {
			case <-stopWatch:
				return
			case <-time.After(10 * time.Millisecond):
				if a.Active() && b.Active() {
					both.Store(true)
				}
			}
		}
	})
	<-half
	eventually(t, 20*time.Second, "an active instance", func() bool { return a.Active() || b.Active() })
	eventually(t, 20*time.Second, "load under way", func() bool { return rateOf(t, st, "worker", "normal").Acked > 50 })
	active, standby := a, b
	if b.Active() {
		active, standby = b, a
	}
	active.kill()
	close(killed)
	eventually(t, 20*time.Second, "the standby takes over", standby.Active)
	wg.Wait() // the sender is done
	var r store.Rate
	defer func() {
		if t.Failed() {
			t.Logf("ledger at the end: %+v (naks want %d)", r, naked.Load())
		}
	}()
	eventually(t, 60*time.Second, "every message in the ledger", func() bool {
		r = rateOf(t, st, "worker", "normal")
		return r.Sent == n && r.Acked == n && r.Naks == naked.Load()
	})
	r = rateOf(t, st, "worker", "normal")
	if r.Sent != n || r.Acked != n || r.Naks != naked.Load() || r.Pending != 0 || r.Nacked != 0 || r.TimedOut != 0 {
		t.Fatalf("after failover: %+v (naks want %d)", r, naked.Load())
	}
	if both.Load() {
		t.Fatal("both instances were active at the same time")
	}
}

// An instance that takes over from one that died holding fetched, unacked
// events waits AckWait before following up, so a message exhausted
// meanwhile is escalated with the history the dead instance never wrote.
// Here that is the NAK of the first delivery: without the wait the
// escalation would count one NAK of two. The wait must not depend on the
// new instance having seen the dead one's pin: a standby started late, or
// the same monitor restarted, may see it only after the pin expired.
func TestHA_TakeoverWaitsForHeldEvents(t *testing.T) {
	t.Parallel()
	t.Run("standby", func(t *testing.T) {
		t.Parallel()
		testTakeoverWaits(t, false)
	})
	t.Run("restart after the pin expired", func(t *testing.T) {
		t.Parallel()
		testTakeoverWaits(t, true)
	})
}

func testTakeoverWaits(t *testing.T, restart bool) {
	m, st, dir, twoDeliveries := takeoverMesh(t)
	ctx := testCtx(t)
	second := make(chan struct{}) // opens the second (last) delivery
	m.agent("worker", map[string]agentkit.HandlerFunc{
		"never": func(ctx context.Context, msg *agentkit.Message) error {
			if msg.Delivery == 2 {
				select {
				case <-second:
				case <-ctx.Done():
				}
			}
			return agentkit.Busy(20 * time.Millisecond)
		},
	}, twoDeliveries)
	client := m.agent("client", nil)

	// AckWait well above the takeover time (PinnedTTL plus two status
	// checks), so the held events come back long after the new instance
	// is active and the message is exhausted.
	cfg := haConfig(st)
	cfg.AckWait = 6 * time.Second
	holder := &holdingStore{Store: st, holding: make(chan struct{}), release: make(chan struct{})}
	cfgA := cfg
	cfgA.Store = holder
	a := startMonitor(t, m.s, cfgA)
	eventually(t, 20*time.Second, "the first instance active", a.Active)
	var b *running
	if !restart {
		b = startMonitor(t, m.s, cfg)
	}

	env, err := client.Send(ctx, "worker", "never", map[string]int{"i": 1})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-holder.holding:
	case <-ctx.Done():
		t.Fatal("the first NAK never reached the first instance")
	}
	// The NAK may first arrive on core NATS (the direct intake); the
	// crash must come once the events consumer has delivered its stream
	// copy too, which the holding store keeps unacked.
	events, err := m.jetstream().Consumer(ctx, subjects.Default.EventsStream(), "ackmonitor_events")
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "the first instance holding the NAK's stream copy", func() bool {
		info, err := events.Info(ctx)
		return err == nil && info.NumAckPending > 0
	})
	a.nc.Close() // a crash as the server sees it, with the NAK fetched and never acked
	close(holder.release)
	a.stop()
	if restart {
		eventually(t, 20*time.Second, "the dead instance's pin expired", func() bool {
			info, err := events.Info(ctx)
			return err == nil && len(info.PriorityGroups) == 1 && info.PriorityGroups[0].PinnedClientID == "" && info.NumAckPending > 0
		})
		b = startMonitor(t, m.s, cfg)
	}
	eventually(t, 20*time.Second, "the new instance takes over", b.Active)
	close(second)

	eventually(t, 30*time.Second, "the escalation", func() bool { return len(dir.list()) > 0 })
	esc := dir.list()[0]
	if esc.MessageID != env.MessageID || esc.Attempts != 2 || esc.Naks != 2 || esc.Timeouts != 0 || len(esc.Reasons) != 3 {
		t.Fatalf("escalation of %s: %d attempts, %d NAKs, %d timeouts, reasons %q; want 2 attempts, 2 NAKs, no timeout and 3 reasons",
			esc.MessageID, esc.Attempts, esc.Naks, esc.Timeouts, esc.Reasons)
	}
}

// A standby takes over and follows up in a quiet mesh: the instance that
// stored a message's exhaustion died before following it up, and no event
// comes after. The standby learns it holds the pin from its own wake-up.
func TestHA_QuietTakeoverFollowsUp(t *testing.T) {
	t.Parallel()
	m, st, dir, twoDeliveries := takeoverMesh(t)
	ctx := testCtx(t)
	busyWorker(m, twoDeliveries)
	client := m.agent("client", nil)

	cfg := haConfig(st)
	cfgA := cfg
	cfgA.Store = noFollowUps{st}
	a := startMonitor(t, m.s, cfgA)
	eventually(t, 20*time.Second, "the first instance active", a.Active)
	b := startMonitor(t, m.s, cfg)
	env, err := client.Send(ctx, "worker", "never", nil)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the exhaustion in the ledger", func() bool { return rateOf(t, st, "worker", "normal").TimedOut == 1 })
	if b.Active() || len(dir.list()) > 0 {
		t.Fatal("the standby was active, or an escalation was sent, before the takeover")
	}
	a.kill()

	eventually(t, 30*time.Second, "the standby's escalation", func() bool { return len(dir.list()) > 0 })
	if esc := dir.list()[0]; esc.MessageID != env.MessageID || esc.Attempts != 2 {
		t.Fatalf("escalation of %s after %d attempts, want %s after 2", esc.MessageID, esc.Attempts, env.MessageID)
	}
}

// busyWorker starts agent "worker", whose action "never" always answers
// busy: each delivery is NAKed until the message is exhausted.
func busyWorker(m *mesh, opts ...agentkit.Option) {
	m.agent("worker", map[string]agentkit.HandlerFunc{
		"never": func(context.Context, *agentkit.Message) error { return agentkit.Busy(20 * time.Millisecond) },
	}, opts...)
}

// noFollowUps fails every PendingFollowUps: an instance that dies before
// following up.
type noFollowUps struct{ store.Store }

func (noFollowUps) PendingFollowUps(context.Context, store.Key, int) ([]store.Record, error) {
	return nil, errors.New("instance dying")
}

// takeoverMesh is the takeover tests' mesh and ledger: a director that
// records escalations, and the policy option that exhausts a normal
// message after two deliveries (ack timeouts too long to fire).
func takeoverMesh(t *testing.T) (*mesh, store.Store, *escalations, agentkit.Option) {
	m := newMesh(t)
	dir := &escalations{}
	m.agent("director", map[string]agentkit.HandlerFunc{ackmonitor.ActionEscalation: dir.handler})
	pol := agentkit.DeliveryPolicy{BackOff: []time.Duration{5 * time.Second, 5 * time.Second}, MaxDeliver: 2,
		ProcessingLimit: 10 * time.Second, Prefetch: 1, MaxAckPending: 100}
	return m, openStore(t, sqliteStore), dir, agentkit.WithPolicy(wire.PriorityNormal, pol)
}

// holdingStore holds the first batch with a NAK event, then fails it: an
// instance that fetched events and died before acking them.
type holdingStore struct {
	store.Store
	holding chan struct{} // closed when the batch is held
	release chan struct{} // closed by the test: Apply fails
	once    sync.Once
}

func (s *holdingStore) Apply(ctx context.Context, b store.Batch) (store.Applied, error) {
	for _, e := range b.Events {
		if e.Kind == store.EventNak {
			s.once.Do(func() { close(s.holding) })
			select {
			case <-s.release:
			case <-ctx.Done(): // the test failed before releasing it
			}
			return store.Applied{}, errors.New("instance died")
		}
	}
	return s.Store.Apply(ctx, b)
}
