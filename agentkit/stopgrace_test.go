package agentkit_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/internal/natstest"
)

// A Stop whose handler ignores its cancelled context returns once the
// stop grace has passed: the handler is abandoned, its message goes to
// another instance, and its late result settles nothing.
func TestLifecycle_StopAbandonsHandlerIgnoringCtx(t *testing.T) {
	testAbandon(t, "Stop", 0, func(a *agentkit.Agent) error {
		a.Stop()
		return nil
	})
}

// A Drain whose ctx ends while a handler ignores its context turns into a
// Stop, bounded the same way, and returns ctx's error.
func TestLifecycle_DrainAbandonsHandlerIgnoringCtx(t *testing.T) {
	const short = 200 * time.Millisecond
	testAbandon(t, "Drain", short, func(a *agentkit.Agent) error {
		ctx, cancel := context.WithTimeout(context.Background(), short)
		defer cancel()
		err := a.Drain(ctx)
		if !errors.Is(err, context.DeadlineExceeded) {
			return errors.New("Drain err = " + errString(err) + ", want context.DeadlineExceeded")
		}
		return nil
	})
}

func errString(err error) string {
	if err == nil {
		return "nil"
	}
	return err.Error()
}

// testAbandon runs one instance of agent "worker" whose handler blocks
// until the end of the test, whatever its context says, stops it with
// stop (which waits up to extra beyond the grace before cancelling
// handlers) and checks the bounded stop, the message's redelivery to a
// second instance, and that the abandoned handler, once released, leaves
// no goroutine and no settle behind. Not parallel: it counts goroutines.
func testAbandon(t *testing.T, name string, extra time.Duration, stop func(*agentkit.Agent) error) {
	const grace = 500 * time.Millisecond
	s := natstest.RunServer(t)
	nc := natstest.Connect(t, s)
	sender, err := agentkit.New(natstest.Connect(t, s), "sender")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sender.Stop)
	// A first round creates what outlives an agent: the stream, the
	// consumers (server goroutines), the connections' publisher
	// subscriptions.
	warm, err := agentkit.New(nc, "worker")
	if err != nil {
		t.Fatal(err)
	}
	warm.HandleFunc("work", func(context.Context, *agentkit.Message) error { return nil })
	if err := warm.Start(ctx(t)); err != nil {
		t.Fatal(err)
	}
	warm.Stop()
	if _, err := sender.Send(ctx(t), "nobody", "warm_up", nil); err != nil {
		t.Fatal(err)
	}
	before := goleak.IgnoreCurrent()

	var errs errorLog
	var settles settleLog
	var starts atomic.Int32
	release, returned := make(chan struct{}), make(chan struct{})
	a, err := agentkit.New(nc, "worker", agentkit.WithConcurrency(1), agentkit.WithStopGrace(grace),
		agentkit.WithErrorHandler(errs.add), agentkit.WithHooks(&settles))
	if err != nil {
		t.Fatal(err)
	}
	a.HandleFunc("work", func(context.Context, *agentkit.Message) error {
		defer close(returned)
		starts.Add(1)
		<-release // ignores its context
		return nil
	})
	if err := a.Start(ctx(t)); err != nil {
		t.Fatal(err)
	}
	defer func() {
		select {
		case <-release:
		default:
			close(release) // on a failure: let the handler go
		}
	}()
	if _, err := sender.Send(ctx(t), "worker", "work", nil); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the handler started", func() bool { return starts.Load() == 1 })

	// The handler blocks until release, closed only at the end of the
	// test: Stop returning at all shows it is bounded. How long it took
	// is logged, not asserted (a loaded machine stretches it); the minute
	// only keeps a hang from holding the test until go test's timeout.
	start := time.Now()
	stopped := make(chan error, 1)
	go func() { stopped <- stop(a) }()
	select {
	case err := <-stopped:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute):
		t.Fatalf("%s still waits for a handler ignoring its context after a minute (grace %v)", name, grace)
	}
	took := time.Since(start)
	t.Logf("%s with a handler ignoring its context took %v (grace %v)", name, took, grace)
	if took < extra+grace {
		t.Fatalf("%s took %v: it did not wait the grace %v", name, took, grace)
	}
	select {
	case <-a.Closed():
	default:
		t.Fatalf("Closed not closed after %s", name)
	}
	abandoned := errs.matching(agentkit.ErrHandlersAbandoned)
	if len(abandoned) != 1 || !strings.Contains(abandoned[0].Error(), "1 of worker") {
		t.Fatalf("errors matching ErrHandlersAbandoned = %v, want one naming 1 handler", abandoned)
	}
	evs := settles.get()
	if len(evs) != 1 || evs[0].Outcome != agentkit.OutcomeNak || !errors.Is(evs[0].Err, agentkit.ErrHandlersAbandoned) {
		t.Fatalf("settle events = %+v, want one NAK for the abandoned handler", evs)
	}

	// The message goes back at once: another instance handles it well
	// before the ack wait (10s) would have redelivered it.
	var rec recorder
	b, err := agentkit.New(nc, "worker")
	if err != nil {
		t.Fatal(err)
	}
	b.HandleFunc("work", rec.handle(nil))
	if err := b.Start(ctx(t)); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the second instance handled the message", func() bool { return rec.count() == 1 })
	b.Stop()
	rec.mu.Lock()
	d := rec.msgs[0].Delivery
	rec.mu.Unlock()
	if d != 2 {
		t.Fatalf("delivery at the second instance = %d, want 2", d)
	}

	// The abandoned handler returns: its worker ends and settles nothing.
	nerrs := errs.count()
	close(release)
	<-returned
	goleak.VerifyNone(t, before,
		// one async-publish reply subscription per JetStream context, owned by nc
		goleak.IgnoreAnyFunction("github.com/nats-io/nats%2ego.(*Conn).waitForMsgs"))
	if n := len(settles.get()); n != 1 {
		t.Fatalf("%d settle events after the handler returned, want still 1", n)
	}
	if n := a.Stats().Outcomes[agentkit.OutcomeAck]; n != 0 {
		t.Fatalf("acks = %d: the abandoned handler's result was settled", n)
	}
	if n := errs.count(); n != nerrs {
		t.Fatalf("the abandoned handler's return reported %v", errs.get()[nerrs:])
	}
}

// errorLog records what an agent's error handler receives.
type errorLog struct {
	mu   sync.Mutex
	errs []error
}

func (l *errorLog) add(err error) {
	l.mu.Lock()
	l.errs = append(l.errs, err)
	l.mu.Unlock()
}

func (l *errorLog) get() []error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]error(nil), l.errs...)
}

func (l *errorLog) count() int { return len(l.get()) }

func (l *errorLog) matching(target error) []error {
	var out []error
	for _, err := range l.get() {
		if errors.Is(err, target) {
			out = append(out, err)
		}
	}
	return out
}

// settleLog is a SettleHook recording every event.
type settleLog struct {
	mu     sync.Mutex
	events []agentkit.SettleEvent
}

func (l *settleLog) OnSettle(ev agentkit.SettleEvent) {
	l.mu.Lock()
	l.events = append(l.events, ev)
	l.mu.Unlock()
}

func (l *settleLog) get() []agentkit.SettleEvent {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]agentkit.SettleEvent(nil), l.events...)
}
