package agentkit_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/internal/natstest"
)

// slowLink dials connections that receive at most rate bytes a second
// from the server: a slow network link. Sending is not slowed.
type slowLink struct{ rate int }

func (l slowLink) Dial(network, address string) (net.Conn, error) {
	c, err := net.Dial(network, address)
	if err != nil {
		return nil, err
	}
	return &slowConn{Conn: c, rate: l.rate}, nil
}

type slowConn struct {
	net.Conn
	rate int
}

// Read reads at most 16 KiB and then takes as long as the link needs for it.
func (c *slowConn) Read(p []byte) (int, error) {
	p = p[:min(len(p), 16<<10)]
	n, err := c.Conn.Read(p)
	time.Sleep(time.Duration(n) * time.Second / time.Duration(c.rate))
	return n, err
}

// Claim-check timing, derived from the ack timeout.
const (
	// claimAckTimeout is claimPolicy's ack timeout. The runtime sends
	// InProgress at most 3/4 of an ack timeout apart (every half, checked
	// every quarter), so a process that stalls for more than a quarter of
	// it loses the message to a redelivery; a loaded machine stalls this
	// race-instrumented process, embedded server included, for hundreds
	// of milliseconds at a time.
	claimAckTimeout = 2 * time.Second
	// bigEnvelope is well above the server's max payload (1 MiB).
	bigEnvelope = 3 << 20
	// claimRate makes fetching a bigEnvelope over slowLink take 1.5 ack
	// timeouts, on any machine (load only makes it slower): the broker
	// redelivers unless the runtime keeps the message alive. Not slower:
	// nats.go's object store reads through an ordered consumer, which
	// starts over when the link holds its data back for longer than its
	// heartbeat (5s).
	claimRate = bigEnvelope * int(time.Second) / int(3*claimAckTimeout/2)
	// claimWait bounds the waits for a fetch and its handler.
	claimWait = 10 * claimAckTimeout
)

// claimPolicy is a delivery policy with claimAckTimeout for every
// attempt, so the broker redelivers any message the runtime does not keep
// alive while it fetches its envelope.
func claimPolicy() agentkit.DeliveryPolicy {
	return fastPolicy(claimAckTimeout, claimAckTimeout, claimAckTimeout)
}

// bigPayload is a JSON payload of about n bytes.
func bigPayload(n int) json.RawMessage {
	p, _ := json.Marshal(map[string]string{"blob": string(bytes.Repeat([]byte("x"), n))})
	return p
}

// slowAgent creates agent id on a slow link to m's server, with
// claimPolicy at normal priority.
func slowAgent(t *testing.T, m *mesh, id string) *agentkit.Agent {
	t.Helper()
	nc := natstest.Connect(t, m.s, nats.SetCustomDialer(slowLink{rate: claimRate}))
	a, err := agentkit.New(nc, id, agentkit.WithPolicy(wire.PriorityNormal, claimPolicy()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Stop)
	return a
}

// A message whose large envelope takes longer to fetch than its ack
// timeout is kept alive while the worker fetches it: the broker delivers
// it once, and its handler runs once, on the first delivery.
func TestLargePayload_KeptAliveWhileFetched(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	recv := slowAgent(t, m, "recv")
	rec := &recorder{}
	if err := recv.Handle("work", rec.handle(nil)); err != nil {
		t.Fatal(err)
	}
	if err := recv.Start(ctx(t)); err != nil {
		t.Fatal(err)
	}
	sender := m.started("sender", nil)
	if _, err := sender.Send(ctx(t), "recv", "work", bigPayload(bigEnvelope)); err != nil {
		t.Fatal(err)
	}
	eventually(t, claimWait, "the message handled", func() bool { return rec.count() >= 1 })
	deliveredOnceAtNormal(t, recv, 1)
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.msgs) != 1 || rec.msgs[0].Delivery != 1 {
		t.Fatalf("handled %d times, first on delivery %d; want once, on delivery 1", len(rec.msgs), rec.msgs[0].Delivery)
	}
}

// A task's message queued in its lane is kept alive while the worker that
// takes it from the lane fetches its large envelope.
func TestLargePayload_LaneMessageKeptAliveWhileFetched(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	recv := slowAgent(t, m, "recv")
	rec := &recorder{}
	release := make(chan struct{})
	unblock := sync.OnceFunc(func() { close(release) })
	t.Cleanup(unblock) // before Stop, which waits for the handlers
	if err := recv.Handle("first", agentkit.HandlerFunc(func(ctx context.Context, msg *agentkit.Message) error {
		<-release
		return rec.handle(nil)(ctx, msg)
	})); err != nil {
		t.Fatal(err)
	}
	if err := recv.Handle("second", rec.handle(nil)); err != nil {
		t.Fatal(err)
	}
	if err := recv.Start(ctx(t)); err != nil {
		t.Fatal(err)
	}
	sender := m.started("sender", nil)
	task := agentkit.WithTaskID("t1")
	if _, err := sender.Send(ctx(t), "recv", "first", nil, task); err != nil {
		t.Fatal(err)
	}
	if _, err := sender.Send(ctx(t), "recv", "second", bigPayload(bigEnvelope), task); err != nil {
		t.Fatal(err)
	}
	// The second message waits in the task's lane behind the first.
	eventually(t, 10*time.Second, "both messages at recv", func() bool {
		info, err := recv.ConsumerInfo(ctx(t), wire.PriorityNormal)
		return err == nil && info.NumAckPending == 2
	})
	unblock()
	eventually(t, claimWait, "both messages handled", func() bool { return rec.count() >= 2 })
	deliveredOnceAtNormal(t, recv, 2)
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for _, msg := range rec.msgs {
		if msg.Delivery != 1 {
			t.Errorf("%s handled on delivery %d, want 1", msg.Action, msg.Delivery)
		}
	}
}

// A large reply is kept alive while the requester's reader fetches it:
// the request gets it, and the broker delivers it once.
func TestLargePayload_ReplyKeptAliveWhileFetched(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	reply := bigPayload(bigEnvelope)
	m.started("analyst", map[string]agentkit.HandlerFunc{"analyze": func(ctx context.Context, msg *agentkit.Message) error {
		return msg.Reply(ctx, "analyzed", reply)
	}})
	orch := slowAgent(t, m, "orch")
	if err := orch.Start(ctx(t)); err != nil {
		t.Fatal(err)
	}
	got, err := orch.Request(ctx(t), "analyst", "analyze", nil)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Payload, reply) {
		t.Fatalf("reply of %d payload bytes, want %d", len(got.Payload), len(reply))
	}
	deliveredOnceAtNormal(t, orch, 1)
}

// deliveredOnceAtNormal waits until the broker has every ack of a's
// normal consumer and checks it delivered each of its n messages exactly
// once: the consumer sequence counts every delivery, redeliveries
// included.
func deliveredOnceAtNormal(t *testing.T, a *agentkit.Agent, n uint64) {
	t.Helper()
	eventually(t, 5*time.Second, "every ack at the broker", func() bool {
		info, err := a.ConsumerInfo(ctx(t), wire.PriorityNormal)
		return err == nil && info.NumAckPending == 0
	})
	info, err := a.ConsumerInfo(ctx(t), wire.PriorityNormal)
	if err != nil {
		t.Fatal(err)
	}
	if info.Delivered.Consumer != n {
		t.Fatalf("broker: %d deliveries of %d messages", info.Delivered.Consumer, n)
	}
}
