package agentkit_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/internal/natstest"
)

func TestLifecycle_StartTwiceAndHandleAfterStart(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	a := m.started("a", nil)
	if err := a.Start(ctx(t)); !errors.Is(err, agentkit.ErrAlreadyStarted) {
		t.Fatalf("second Start: %v", err)
	}
	if err := a.HandleFunc("x", func(context.Context, *agentkit.Message) error { return nil }); !errors.Is(err, agentkit.ErrAlreadyStarted) {
		t.Fatalf("Handle after Start: %v", err)
	}
	a.Stop()
	a.Stop() // idempotent
	select {
	case <-a.Closed():
	default:
		t.Fatal("Closed not closed after Stop")
	}
	if err := a.Subscribe(ctx(t), "t"); !errors.Is(err, agentkit.ErrClosed) {
		t.Fatalf("Subscribe after Stop: %v", err)
	}
}

// Start provisions idempotently: a second instance with the same id and
// options converges on the same consumers.
func TestLifecycle_StartIsIdempotentOnTheServer(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	m.started("a", nil)
	b := m.started("a", nil)
	for _, p := range wire.Priorities {
		info, err := b.ConsumerInfo(ctx(t), p)
		if err != nil {
			t.Fatal(err)
		}
		pol := agentkit.DefaultPolicies()[p]
		if info.Config.MaxDeliver != pol.MaxDeliver || len(info.Config.BackOff) != len(pol.BackOff) ||
			info.Config.SampleFrequency != "100" || info.Config.AckWait != pol.BackOff[0] {
			t.Fatalf("%s consumer config = %+v", p, info.Config)
		}
	}
}

// Drain lets running handlers finish and acks their messages.
func TestLifecycle_DrainFinishesInFlight(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	started := make(chan struct{}, 1)
	var finished atomic.Int64
	recv := m.started("recv", map[string]agentkit.HandlerFunc{"work": func(ctx context.Context, _ *agentkit.Message) error {
		started <- struct{}{}
		time.Sleep(200 * time.Millisecond)
		finished.Add(1)
		return nil
	}}, agentkit.WithConcurrency(1))
	sender := m.agent("sender")
	if _, err := sender.Send(ctx(t), "recv", "work", nil); err != nil {
		t.Fatal(err)
	}
	<-started
	if err := recv.Drain(ctx(t)); err != nil {
		t.Fatal(err)
	}
	if finished.Load() != 1 || recv.Stats().Outcomes[agentkit.OutcomeAck] != 1 {
		t.Fatalf("drain returned before the handler finished (finished=%d)", finished.Load())
	}
}

// A handler still running when Drain begins may call into its agent:
// Drain must not hold a lock those calls need (it did, and deadlocked). A
// request can no longer get its reply, so it fails at once with ErrClosed.
func TestLifecycle_DrainWhileHandlerCallsTheAgent(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	started, release := make(chan struct{}), make(chan struct{})
	var recv *agentkit.Agent
	requestErr := make(chan error, 1)
	recv = m.started("recv", map[string]agentkit.HandlerFunc{"work": func(ctx context.Context, _ *agentkit.Message) error {
		close(started)
		<-release
		_, err := recv.Request(ctx, "peer", "ping", nil)
		requestErr <- err
		return agentkit.Reroute("nobody_has_this") // settling a reroute reads the registry
	}}, agentkit.WithConcurrency(1))
	sender := m.started("sender", nil)
	if _, err := sender.Send(ctx(t), "recv", "work", nil); err != nil {
		t.Fatal(err)
	}
	<-started
	drained := make(chan error, 1)
	go func() { drained <- recv.Drain(ctx(t)) }()
	eventually(t, 10*time.Second, "recv announced STOPPING", func() bool {
		rec, ok := sender.Registry().Get("recv")
		return ok && rec.Status == agentkit.StatusStopping
	})
	close(release)
	deadlock := time.After(20 * time.Second)
	select {
	case err := <-requestErr:
		if !errors.Is(err, agentkit.ErrClosed) {
			t.Fatalf("Request from a draining agent's handler = %v, want ErrClosed", err)
		}
	case <-deadlock:
		t.Fatal("the handler's Request has not returned after 20s: deadlock")
	}
	select {
	case err := <-drained:
		if err != nil {
			t.Fatalf("Drain: %v", err)
		}
	case <-deadlock:
		t.Fatal("Drain has not returned after 20s: deadlock")
	}
}

// A handler's Request already waiting when Drain begins fails with
// ErrClosed as soon as the readers stop, which would read its reply: it
// held Drain up until its timeout, counted against a healthy peer.
func TestLifecycle_DrainFailsWaitingRequests(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	var recv *agentkit.Agent
	requestErr := make(chan error, 1)
	recv = m.started("recv", map[string]agentkit.HandlerFunc{"work": func(ctx context.Context, _ *agentkit.Message) error {
		_, err := recv.Request(ctx, "nobody", "ping", nil) // nobody answers
		requestErr <- err
		return nil
	}}, agentkit.WithRequestTimeout(time.Minute))
	if _, err := m.agent("sender").Send(ctx(t), "recv", "work", nil); err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(m.conn())
	eventually(t, 10*time.Second, "the handler's request stored (its waiter registered first)", func() bool {
		st, err := js.Stream(ctx(t), "MESH")
		if err != nil {
			return false
		}
		info, err := st.Info(ctx(t), jetstream.WithSubjectFilter("mesh.agent.nobody.>"))
		return err == nil && len(info.State.Subjects) == 1
	})
	start := time.Now()
	drained := make(chan error, 1)
	go func() { drained <- recv.Drain(ctx(t)) }()
	select {
	case err := <-requestErr:
		if !errors.Is(err, agentkit.ErrClosed) {
			t.Fatalf("the waiting Request = %v, want ErrClosed", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the waiting Request has not returned 20s into Drain")
	}
	if err := <-drained; err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Fatalf("Drain took %v", d)
	}
}

// Stop cancels running handlers and hands their messages back at once, so
// another instance gets them without waiting for the ack timeout.
func TestLifecycle_StopHandsBackInFlight(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	var starts atomic.Int32
	a := m.started("worker", map[string]agentkit.HandlerFunc{"work": func(ctx context.Context, _ *agentkit.Message) error {
		starts.Add(1)
		<-ctx.Done()
		return ctx.Err()
	}}, agentkit.WithConcurrency(1))
	sender := m.agent("sender")
	// One message runs; two wait in the queue for the one worker.
	const n = 3
	for range n {
		if _, err := sender.Send(ctx(t), "worker", "work", nil); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 5*time.Second, "all three in the worker's client", func() bool {
		info, err := a.ConsumerInfo(ctx(t), wire.PriorityNormal)
		return err == nil && info.NumAckPending == n && starts.Load() == 1
	})
	a.Stop()
	if got := starts.Load(); got != 1 {
		t.Fatalf("handler started %d times, want 1: Stop must hand back queued messages without running them", got)
	}
	var rec recorder
	b := m.started("worker", map[string]agentkit.HandlerFunc{"work": rec.handle(nil)})
	// The default normal ack wait is 10s; the messages must come back well before.
	deadline := time.Now().Add(3 * time.Second)
	for rec.count() != n {
		if time.Now().After(deadline) {
			info, _ := b.ConsumerInfo(ctx(t), wire.PriorityNormal)
			t.Fatalf("%d of %d redelivered to the second instance: %+v waiting=%d ackpending=%d redelivered=%d pending=%d stats A=%v",
				rec.count(), n, info.Delivered, info.NumWaiting, info.NumAckPending, info.NumRedelivered, info.NumPending, a.Stats().Outcomes)
		}
		time.Sleep(10 * time.Millisecond)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for _, msg := range rec.msgs {
		if msg.Delivery != 2 {
			t.Fatalf("delivery = %d, want 2", msg.Delivery)
		}
	}
}

// Every goroutine an agent starts ends with Stop. A first round creates the
// server-side stream and consumers (whose goroutines belong to the server)
// and nats.go's per-connection reply subscription; the second round must
// leave nothing behind.
func TestLifecycle_NoGoroutineLeak(t *testing.T) {
	s := natstest.RunServer(t)
	nc := natstest.Connect(t, s)
	round := func() {
		a, err := agentkit.New(nc, "leaky")
		if err != nil {
			t.Fatal(err)
		}
		a.HandleFunc("work", func(ctx context.Context, m *agentkit.Message) error { return m.Reply(ctx, "done", nil) })
		if err := a.Start(ctx(t)); err != nil {
			t.Fatal(err)
		}
		if _, err := a.Request(ctx(t), "leaky", "work", nil); err != nil {
			t.Fatal(err)
		}
		a.Stop()
	}
	round()
	before := goleak.IgnoreCurrent()
	round()
	goleak.VerifyNone(t, before,
		// one async-publish reply subscription per JetStream context, owned by nc
		goleak.IgnoreAnyFunction("github.com/nats-io/nats%2ego.(*Conn).waitForMsgs"))
}

// A Drain whose ctx ends while a handler runs turns into a Stop: the
// handler's context is cancelled, Drain returns ctx's error, and the
// message goes back for redelivery. Drain used to wait for the handler
// with no regard for ctx (here: for ever, as the handler waits for its
// context).
func TestLifecycle_DrainHonoursCtxWhileHandlersRun(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	started := make(chan struct{}, 1)
	cancelled := make(chan error, 1)
	recv := m.started("recv", map[string]agentkit.HandlerFunc{"work": func(ctx context.Context, _ *agentkit.Message) error {
		started <- struct{}{}
		<-ctx.Done()
		cancelled <- ctx.Err()
		return ctx.Err()
	}}, agentkit.WithConcurrency(1))
	sender := m.agent("sender")
	if _, err := sender.Send(ctx(t), "recv", "work", nil); err != nil {
		t.Fatal(err)
	}
	<-started
	short, cancel := context.WithTimeout(ctx(t), 200*time.Millisecond)
	defer cancel()
	if err := recv.Drain(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Drain err = %v, want context.DeadlineExceeded", err)
	}
	if err := <-cancelled; err == nil {
		t.Fatal("the handler's context was not cancelled")
	}
	if n := recv.Stats().Outcomes[agentkit.OutcomeNak]; n != 1 {
		t.Fatalf("nak outcomes = %d, want 1: the message goes back for redelivery", n)
	}
}
