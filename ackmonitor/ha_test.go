package ackmonitor_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentmesh-io/agentmesh/agentkit"
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
	cfg := fastConfig(st)
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
	eventually(t, 60*time.Second, "every message in the ledger", func() bool {
		r := rateOf(t, st, "worker", "normal")
		return r.Sent == n && r.Acked == n && r.Naks == naked.Load()
	})
	r := rateOf(t, st, "worker", "normal")
	if r.Sent != n || r.Acked != n || r.Naks != naked.Load() || r.Pending != 0 || r.Nacked != 0 || r.TimedOut != 0 {
		t.Fatalf("after failover: %+v (naks want %d)", r, naked.Load())
	}
	if both.Load() {
		t.Fatal("both instances were active at the same time")
	}
}
