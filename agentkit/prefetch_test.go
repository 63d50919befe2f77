package agentkit_test

import (
	"context"
	"encoding/json"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// sendN sends n requests for action to "recv" in one batch.
func sendN(t *testing.T, sender *agentkit.Agent, action string, n int) {
	t.Helper()
	envs := make([]*wire.Envelope, n)
	for i := range envs {
		e, err := sender.NewRequest(ctx(t), "recv", action, nil)
		if err != nil {
			t.Fatal(err)
		}
		envs[i] = e
	}
	if err := sender.SendBatch(ctx(t), envs); err != nil {
		t.Fatal(err)
	}
}

// startRecv starts agent "recv" on a new mesh with pol at normal priority
// and workers workers. Its "work" handler calls before (when set), then
// records the message.
func startRecv(t *testing.T, pol agentkit.DeliveryPolicy, workers int, before func()) (*mesh, *agentkit.Agent, *recorder) {
	t.Helper()
	m := newMesh(t)
	rec := &recorder{}
	handler := func(ctx context.Context, msg *agentkit.Message) error {
		if before != nil {
			before()
		}
		return rec.handle(nil)(ctx, msg)
	}
	recv := m.started("recv", map[string]agentkit.HandlerFunc{"work": handler},
		agentkit.WithPolicy(wire.PriorityNormal, pol), agentkit.WithConcurrency(workers))
	return m, recv, rec
}

// deliveredOnce waits until the broker has every ack of recv's normal
// consumer and checks it delivered each of its n messages exactly once:
// the consumer sequence counts every delivery, redeliveries included.
func deliveredOnce(t *testing.T, recv *agentkit.Agent, n uint64) {
	t.Helper()
	eventually(t, 5*time.Second, "every ack at the broker", func() bool {
		info, err := recv.ConsumerInfo(ctx(t), wire.PriorityNormal)
		return err == nil && info.NumAckPending == 0
	})
	info, err := recv.ConsumerInfo(ctx(t), wire.PriorityNormal)
	if err != nil {
		t.Fatal(err)
	}
	if info.Delivered.Consumer != n || info.Delivered.Stream != n {
		t.Fatalf("broker: %d deliveries of %d messages; want %d of %d", info.Delivered.Consumer, info.Delivered.Stream, n, n)
	}
}

// While handlers are fast the buffer grows past Prefetch, and moving from
// one iterator to the next loses nothing, even with the client full when
// the first one ends: every message is handled once, well within its ack
// timeout, and none is redelivered.
func TestPrefetch_GrowsForFastHandlers(t *testing.T) {
	t.Parallel()
	pol := fastPolicy(30*time.Second, 30*time.Second)
	pol.Prefetch, pol.MaxPrefetch = 4, 256
	release := make(chan struct{})
	const workers = 2
	m, recv, rec := startRecv(t, pol, workers, func() { <-release })
	unblock := sync.OnceFunc(func() { close(release) })
	t.Cleanup(unblock) // before Stop, which waits for the handlers
	const n = 500
	sendN(t, m.agent("sender"), "work", n)
	// Fill the client: running handlers, and more in the queue than one
	// message per worker.
	eventually(t, 5*time.Second, "the client to fill up", func() bool {
		info, err := recv.ConsumerInfo(ctx(t), wire.PriorityNormal)
		return err == nil && info.NumAckPending > 2*workers+1
	})
	unblock()
	// Well within the ack timeout: a message lost in the switch would only
	// come back after it.
	eventually(t, 15*time.Second, "all messages handled", func() bool { return rec.count() >= n })
	if ids := rec.ids(); len(ids) != n {
		t.Fatalf("handled %d distinct messages of %d", len(ids), n)
	}
	if got := recv.Stats().Prefetch[wire.PriorityNormal]; got <= pol.Prefetch || got > pol.MaxPrefetch {
		t.Fatalf("prefetch = %d, want it grown past %d, up to %d", got, pol.Prefetch, pol.MaxPrefetch)
	}
	deliveredOnce(t, recv, n)
}

// Slow handlers get a buffer no deeper than they can finish within half
// the ack timeout, however large MaxPrefetch is: the rest of a backlog
// waits at the server, where its ack clock has not started.
func TestPrefetch_SlowHandlersGetAShallowBuffer(t *testing.T) {
	t.Parallel()
	pol := fastPolicy(2*time.Second, 2*time.Second)
	pol.Prefetch, pol.MaxPrefetch = 2, 64
	m, recv, rec := startRecv(t, pol, 1, func() { time.Sleep(100 * time.Millisecond) })
	const n = 40
	sendN(t, m.agent("sender"), "work", n)

	// One worker finishes at most 1s/100ms = 10 messages in half the ack
	// timeout; one of them waits in the runtime's queue.
	const fit = 9
	eventually(t, 10*time.Second, "a few handled", func() bool { return rec.count() >= 6 })
	if got := recv.Stats().Prefetch[wire.PriorityNormal]; got > fit {
		t.Fatalf("prefetch = %d, want at most %d", got, fit)
	}
	info, err := recv.ConsumerInfo(ctx(t), wire.PriorityNormal)
	if err != nil {
		t.Fatal(err)
	}
	// Delivered and not yet acked: the queue, which the reader fills to the
	// buffer plus one message per worker, and the running handler.
	if info.NumAckPending > fit+2 || info.NumPending == 0 {
		t.Fatalf("broker: %d ack pending, %d still at the server; want at most %d in the client and the rest held back",
			info.NumAckPending, info.NumPending, fit+2)
	}
	eventually(t, 15*time.Second, "all messages handled", func() bool { return rec.count() >= n })
	if ids := rec.ids(); len(ids) != n {
		t.Fatalf("handled %d distinct messages of %d", len(ids), n)
	}
}

// Messages waiting for a busy worker do not time out: the runtime keeps
// every message it holds alive (InProgress), not only the running ones,
// and with the default policy it buffers no more than one message before
// the handlers' pace is known. Here each handler outlasts the ack timeout,
// so any message left waiting without InProgress would be redelivered.
func TestSlowHandlers_WaitingMessagesDoNotTimeOut(t *testing.T) {
	t.Parallel()
	const ackWait, handling = 2 * time.Second, 2500 * time.Millisecond
	pol := fastPolicy(ackWait, ackWait)
	def := agentkit.DefaultPolicies()[wire.PriorityNormal]
	pol.Prefetch, pol.MaxPrefetch = def.Prefetch, def.MaxPrefetch
	m, recv, rec := startRecv(t, pol, 1, func() { time.Sleep(handling) })
	// One running, one in the runtime's queue, one held by the reader and
	// one that would sit in the client's buffer.
	const n = 4
	sendN(t, m.agent("sender"), "work", n)
	eventually(t, n*handling+10*time.Second, "all messages handled", func() bool { return rec.count() >= n })
	rec.mu.Lock()
	for _, msg := range rec.msgs {
		if msg.Delivery != 1 {
			t.Errorf("message %s handled on delivery %d, want 1", msg.MessageID, msg.Delivery)
		}
	}
	rec.mu.Unlock()
	deliveredOnce(t, recv, n)
}

// When handlers turn slow while a deep buffer is open, the messages
// already received do not time out: the runtime takes each one off the
// client's buffer as it arrives and keeps it alive until a worker is free,
// so nothing is redelivered even though the buffer cannot shrink until its
// generation ends.
func TestPrefetch_HandlersTurningSlowStrandNothing(t *testing.T) {
	t.Parallel()
	const ackWait = 2 * time.Second
	pol := fastPolicy(ackWait, ackWait)
	pol.Prefetch, pol.MaxPrefetch = 1, 64
	var slow atomic.Bool
	m, recv, rec := startRecv(t, pol, 1, func() {
		if slow.Load() {
			time.Sleep(300 * time.Millisecond)
		}
	})
	sender := m.agent("sender")
	const fast = 200
	sendN(t, sender, "work", fast)
	eventually(t, 10*time.Second, "the fast messages handled", func() bool { return rec.count() >= fast })
	if got := recv.Stats().Prefetch[wire.PriorityNormal]; got < 16 {
		t.Fatalf("prefetch = %d after fast handlers, want it grown to at least 16", got)
	}
	// 12 slow messages take 3.6s, well past the ack timeout, and all fit
	// in the open generation.
	slow.Store(true)
	const slowN = 12
	sendN(t, sender, "work", slowN)
	eventually(t, 15*time.Second, "the slow messages handled", func() bool { return rec.count() >= fast+slowN })
	deliveredOnce(t, recv, fast+slowN)
}

// TestPullExpiry_FollowsAckTimeout reads each priority's pull requests as
// the server receives them: each lives twice the priority's first ack
// timeout, between 2s and 10s, with heartbeats at half that. The expiry
// bounds how long a priority stalls when its consumer's leader changes
// while a pull request is on its way.
func TestPullExpiry_FollowsAckTimeout(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	want := map[wire.Priority]time.Duration{
		wire.PriorityCritical: 4 * time.Second,  // default 2s ack timeout
		wire.PriorityHigh:     2 * time.Second,  // 300ms: the floor
		wire.PriorityNormal:   10 * time.Second, // default 10s: the ceiling
		wire.PriorityLow:      6 * time.Second,  // 3s
		wire.PriorityBatch:    10 * time.Second, // default 60s: the ceiling
	}
	type pullRequest struct {
		Expires   time.Duration `json:"expires"`
		Heartbeat time.Duration `json:"idle_heartbeat"`
	}
	type pull struct {
		prio wire.Priority
		req  pullRequest
	}
	pulls := make(chan pull, 256)
	nc := m.conn()
	for p := range want {
		consumer, err := subjects.Default.Consumer("recv", string(p))
		if err != nil {
			t.Fatal(err)
		}
		_, err = nc.Subscribe(subjects.API("CONSUMER", "MSG", "NEXT", subjects.Default.Stream(), consumer), func(msg *nats.Msg) {
			var req pullRequest
			if err := json.Unmarshal(msg.Data, &req); err != nil {
				t.Errorf("pull request %q: %v", msg.Data, err)
			}
			select {
			case pulls <- pull{p, req}:
			default:
			}
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	m.started("recv", map[string]agentkit.HandlerFunc{"work": (&recorder{}).handle(nil)},
		agentkit.WithPolicy(wire.PriorityHigh, fastPolicy(300*time.Millisecond)),
		agentkit.WithPolicy(wire.PriorityLow, fastPolicy(3*time.Second, 3*time.Second)))
	seen := map[wire.Priority]bool{}
	timeout := time.After(5 * time.Second)
	for len(seen) < len(want) {
		select {
		case p := <-pulls:
			seen[p.prio] = true
			if p.req.Expires != want[p.prio] || p.req.Heartbeat != want[p.prio]/2 {
				t.Errorf("%s pull request: expires %v, heartbeat %v; want %v and %v",
					p.prio, p.req.Expires, p.req.Heartbeat, want[p.prio], want[p.prio]/2)
			}
		case <-timeout:
			t.Fatalf("pull requests seen for %v of %d priorities", seen, len(want))
		}
	}
}
