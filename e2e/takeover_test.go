package e2e

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/internal/natstest"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// TestInstances_TakeoverAfterElderCrash runs two instances of one agent,
// with the default heartbeat and delivery policies, on a 3-node cluster
// with an R3 stream and registry. The consuming instance holds one
// message of each priority in handlers that never return, then its
// connection closes, which is what the server sees of a SIGKILLed
// process. The test checks that the standby takes the turn and runs each
// held message once, and reports how long after the close it took the
// turn and ran each one. AGENTMESH_TAKEOVER_RUNS sets how many runs (1).
func TestInstances_TakeoverAfterElderCrash(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping the instance takeover measurement in -short mode (CI runs it without -short)")
	}
	runs := 1
	if v, err := strconv.Atoi(os.Getenv("AGENTMESH_TAKEOVER_RUNS")); err == nil && v > 0 {
		runs = v
	}
	c := natstest.RunCluster(t, 3)
	js, err := jetstream.New(c.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	scheme, err := subjects.New("takeover")
	if err != nil {
		t.Fatal(err)
	}
	ensureStream(t, js, scheme)
	for run := range runs {
		takeOverOnce(t, c, scheme, fmt.Sprintf("worker_%d", run))
	}
}

// takeOverOnce is one run of TestInstances_TakeoverAfterElderCrash with
// agent id.
func takeOverOnce(t *testing.T, c *natstest.Cluster, scheme subjects.Scheme, id string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	opts := []agentkit.Option{agentkit.WithScheme(scheme), agentkit.WithReplicas(3)}
	priorities := []wire.Priority{wire.PriorityCritical, wire.PriorityHigh, wire.PriorityNormal, wire.PriorityLow, wire.PriorityBatch}

	var mu sync.Mutex
	held := map[string]bool{}           // message id → the elder runs it
	ran := map[string][]time.Duration{} // message id → when the standby ran it, after the close
	var closed time.Time

	connA := c.Connect(t)
	a, err := agentkit.New(connA, id, opts...)
	if err != nil {
		t.Fatal(err)
	}
	a.HandleFunc("work", func(ctx context.Context, m *agentkit.Message) error {
		mu.Lock()
		held[m.MessageID] = true
		mu.Unlock()
		<-ctx.Done() // the elder never finishes: it dies first
		return ctx.Err()
	})
	natstest.WaitFor(t, 20*time.Second, func() error { return a.Start(ctx) })
	defer a.Stop()
	b, err := agentkit.New(c.Connect(t), id, opts...)
	if err != nil {
		t.Fatal(err)
	}
	b.HandleFunc("work", func(_ context.Context, m *agentkit.Message) error {
		mu.Lock()
		ran[m.MessageID] = append(ran[m.MessageID], time.Since(closed))
		mu.Unlock()
		return nil
	})
	natstest.WaitFor(t, 20*time.Second, func() error { return b.Start(ctx) })
	defer b.Stop()
	natstest.Eventually(t, 20*time.Second, "the elder consumes, the standby stands by", func() bool { return a.Consuming() && !b.Consuming() })

	sender, err := agentkit.New(c.Connect(t), "sender_"+id, append(opts, agentkit.WithRegistration(false))...)
	if err != nil {
		t.Fatal(err)
	}
	natstest.WaitFor(t, 20*time.Second, func() error { return sender.Start(ctx) })
	defer sender.Stop()
	byID := map[string]wire.Priority{}
	for _, p := range priorities {
		env, err := sender.Send(ctx, id, "work", nil, agentkit.WithPriority(p))
		if err != nil {
			t.Fatal(err)
		}
		byID[env.MessageID] = p
	}
	natstest.Eventually(t, 30*time.Second, "the elder runs a message of each priority", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(held) == len(priorities)
	})

	mu.Lock()
	closed = time.Now()
	mu.Unlock()
	connA.Close() // the elder can neither deregister, renew nor answer
	var turn time.Duration
	natstest.Eventually(t, 2*time.Minute, "the standby consumes", func() bool {
		if b.Consuming() {
			turn = time.Since(closed)
			return true
		}
		return false
	})
	natstest.Eventually(t, 2*time.Minute, "the standby runs every held message", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(ran) == len(priorities)
	})

	mu.Lock()
	defer mu.Unlock()
	report := []string{fmt.Sprintf("took the turn +%.2fs", turn.Seconds())}
	for mid, times := range ran {
		if len(times) != 1 || !held[mid] {
			t.Errorf("message %s (%s): the standby ran it %d times, the elder held it: %v", mid, byID[mid], len(times), held[mid])
		}
	}
	for _, p := range priorities {
		for mid, q := range byID {
			if q == p && len(ran[mid]) > 0 {
				report = append(report, fmt.Sprintf("%s +%.2fs", p, ran[mid][0].Seconds()))
			}
		}
	}
	t.Logf("%s: after the elder's connection closed, the standby %s", id, strings.Join(report, ", "))
}
