package agentkit_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// A new agent id gets the broadcasts and topic messages published after
// it first started, none of those before: its fan-out consumers start at
// the stream's end. Direct messages sent before are handled.
func TestFanout_NewAgentGetsNoHistory(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	ops := m.started("ops", nil)
	early := map[string]bool{}
	for _, send := range []func() (*wire.Envelope, error){
		func() (*wire.Envelope, error) { return ops.Broadcast(ctx(t), "notice", nil) },
		func() (*wire.Envelope, error) { return ops.Publish(ctx(t), "news", "notice", nil) },
	} {
		env, err := send()
		if err != nil {
			t.Fatal(err)
		}
		early[env.MessageID] = true
	}
	direct, err := ops.Send(ctx(t), "late", "notice", nil)
	if err != nil {
		t.Fatal(err)
	}

	var rec recorder
	late := m.started("late", map[string]agentkit.HandlerFunc{"notice": rec.handle(nil)}, agentkit.WithTopics("news"))
	b, err := ops.Broadcast(ctx(t), "notice", nil)
	if err != nil {
		t.Fatal(err)
	}
	p, err := ops.Publish(ctx(t), "news", "notice", nil)
	if err != nil {
		t.Fatal(err)
	}
	// The early fan-out messages precede the late ones on the same
	// consumer, so once the late ones are handled the early ones would
	// have been too.
	eventually(t, 10*time.Second, "the direct message and the two later fan-out messages", func() bool {
		ids := rec.ids()
		return ids[direct.MessageID] == 1 && ids[b.MessageID] == 1 && ids[p.MessageID] == 1
	})
	for id, n := range rec.ids() {
		if early[id] {
			t.Errorf("the new agent handled %s, published before it first started, %d times", id, n)
		}
	}
	eventually(t, 10*time.Second, "three acks", func() bool { return late.Stats().Outcomes[agentkit.OutcomeAck] == 3 })
}

// An agent that restarts continues where its fan-out consumers left off:
// what was broadcast while it was down is handled once it is back.
func TestFanout_RestartContinues(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	ops := m.started("ops", nil)
	var rec recorder
	first := m.started("worker", map[string]agentkit.HandlerFunc{"notice": rec.handle(nil)})
	before, err := ops.Broadcast(ctx(t), "notice", nil)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the first broadcast", func() bool { return rec.ids()[before.MessageID] == 1 })
	if err := first.Drain(ctx(t)); err != nil {
		t.Fatal(err)
	}
	var down []string
	for range 3 {
		env, err := ops.Broadcast(ctx(t), "notice", nil, agentkit.WithPriority(wire.PriorityLow))
		if err != nil {
			t.Fatal(err)
		}
		down = append(down, env.MessageID)
	}
	m.started("worker", map[string]agentkit.HandlerFunc{"notice": rec.handle(nil)})
	eventually(t, 10*time.Second, "the broadcasts sent while the agent was down", func() bool {
		ids := rec.ids()
		for _, id := range down {
			if ids[id] != 1 {
				return false
			}
		}
		return true
	})
	if n := rec.ids()[before.MessageID]; n != 1 {
		t.Errorf("the broadcast handled before the restart was handled %d times", n)
	}
}

// A fan-out message whose action the agent does not handle is acked as
// ignored: no TERM, no CAPABILITY_MISSING, counted apart.
func TestFanout_UnhandledIsIgnored(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	adv := m.watchAdvisories()
	var rec recorder
	worker := m.started("worker", map[string]agentkit.HandlerFunc{"work": rec.handle(nil)}, agentkit.WithTopics("news"))
	ops := m.started("ops", nil)
	for _, send := range []func() (*wire.Envelope, error){
		func() (*wire.Envelope, error) { return ops.Broadcast(ctx(t), "reindex", nil) },
		func() (*wire.Envelope, error) {
			return ops.Publish(ctx(t), "news", "reindex", nil, agentkit.WithPriority(wire.PriorityCritical))
		},
	} {
		if _, err := send(); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 10*time.Second, "two ignored", func() bool { return worker.Stats().Outcomes[agentkit.OutcomeIgnored] == 2 })
	// A direct message with an action nobody handles is still refused.
	if _, err := ops.Send(ctx(t), "worker", "reindex", nil); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the direct one refused", func() bool {
		return worker.Stats().Outcomes[agentkit.OutcomeCapabilityMissing] == 1
	})
	// The server sends advisories in order: once the direct message's TERM
	// is in, any TERM of the earlier fan-out messages would be too.
	eventually(t, 10*time.Second, "the direct message's TERM advisory", func() bool { return len(adv.of(subjects.EventTerminated, 0)) > 0 })
	if terms := adv.of(subjects.EventTerminated, 0); len(terms) != 1 || terms[0].Consumer != "worker_normal" {
		t.Errorf("TERM advisories %+v, want only the direct message's", terms)
	}
	if rec.count() != 0 {
		t.Errorf("the work handler ran %d times", rec.count())
	}
}

// WithFanoutActions narrows what the agent takes from fan-out; declaring
// none leaves it without fan-out consumers, so the broker sends it none.
func TestFanout_DeclaredActions(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	var notices, work recorder
	handlers := func() map[string]agentkit.HandlerFunc {
		return map[string]agentkit.HandlerFunc{"notice": notices.handle(nil), "work": work.handle(nil)}
	}
	some := m.started("some", handlers(), agentkit.WithFanoutActions("notice"))
	none := m.started("none", handlers(), agentkit.WithFanoutActions())
	js, err := jetstream.New(m.conn())
	if err != nil {
		t.Fatal(err)
	}
	for _, class := range subjects.FanoutClasses {
		name, _ := subjects.Default.FanoutConsumer("none", class)
		if _, err := js.Consumer(ctx(t), subjects.Default.Stream(), name); !errors.Is(err, jetstream.ErrConsumerNotFound) {
			t.Errorf("consumer %s of an agent declaring no fan-out action: %v", name, err)
		}
		name, _ = subjects.Default.FanoutConsumer("some", class)
		if _, err := js.Consumer(ctx(t), subjects.Default.Stream(), name); err != nil {
			t.Errorf("consumer %s: %v", name, err)
		}
	}
	ops := m.started("ops", nil)
	if _, err := ops.Broadcast(ctx(t), "work", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ops.Broadcast(ctx(t), "notice", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ops.Send(ctx(t), "none", "work", nil); err != nil {
		t.Fatal(err)
	}
	// A handler's run is counted before its ack settles: wait for both.
	eventually(t, 10*time.Second, "notice handled by some, work ignored by some, direct work handled and acked by none", func() bool {
		return notices.count() == 1 && some.Stats().Outcomes[agentkit.OutcomeIgnored] == 1 && work.count() == 1 &&
			none.Stats().Outcomes[agentkit.OutcomeAck] == 1
	})
	if got := none.Stats().Outcomes; got[agentkit.OutcomeAck] != 1 || got[agentkit.OutcomeIgnored] != 0 || work.count() != 1 {
		t.Errorf("the agent without fan-out consumers: %v (work handled %d times)", got, work.count())
	}
}

// A critical broadcast overtakes a backlog of low ones: it has its own
// consumer and is handled by the critical worker while the others wait.
func TestFanout_CriticalOvertakesBacklog(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	release := make(chan struct{})
	defer close(release)
	var bulkStarted atomic.Int32
	urgent := make(chan struct{}, 1)
	m.started("worker", map[string]agentkit.HandlerFunc{
		"bulk": func(ctx context.Context, _ *agentkit.Message) error {
			bulkStarted.Add(1)
			select {
			case <-release:
			case <-ctx.Done():
			}
			return nil
		},
		"alarm": func(context.Context, *agentkit.Message) error { urgent <- struct{}{}; return nil },
	}, agentkit.WithConcurrency(1))
	ops := m.started("ops", nil)
	for range 50 {
		if _, err := ops.Broadcast(ctx(t), "bulk", nil, agentkit.WithPriority(wire.PriorityLow)); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 10*time.Second, "the worker busy with the backlog", func() bool { return bulkStarted.Load() == 1 })
	if _, err := ops.Broadcast(ctx(t), "alarm", nil, agentkit.WithPriority(wire.PriorityCritical)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-urgent:
	case <-ctx(t).Done():
		t.Fatal("the critical broadcast waited behind the backlog")
	}
	if n := bulkStarted.Load(); n != 1 {
		t.Errorf("%d backlog handlers started before the critical broadcast was handled, want 1", n)
	}
}

// Subscribing and unsubscribing while messages flow loses and duplicates
// nothing on the topics the agent keeps, and takes the new topic's
// messages from the moment Subscribe returns until Unsubscribe is called.
func TestFanout_SubscribeUnderLoad(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	var rec recorder
	worker := m.started("worker", map[string]agentkit.HandlerFunc{"tick": rec.handle(nil)}, agentkit.WithTopics("steady"))
	pub := m.started("pub", nil)

	var mu sync.Mutex
	var steady []string
	stop := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				done <- nil
				return
			default:
			}
			env, err := pub.Publish(context.Background(), "steady", "tick", i)
			if err != nil {
				done <- err
				return
			}
			mu.Lock()
			steady = append(steady, env.MessageID)
			mu.Unlock()
		}
	}()
	var during []string
	for i := range 5 {
		if err := worker.Subscribe(ctx(t), "flip"); err != nil {
			t.Fatal(err)
		}
		env, err := pub.Publish(ctx(t), "flip", "tick", fmt.Sprint("flip", i))
		if err != nil {
			t.Fatal(err)
		}
		during = append(during, env.MessageID)
		if err := worker.Unsubscribe(ctx(t), "flip"); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	want := append(append([]string{}, steady...), during...)
	mu.Unlock()
	eventually(t, 30*time.Second, "every steady message and each one published while subscribed", func() bool {
		ids := rec.ids()
		for _, id := range want {
			if ids[id] == 0 {
				return false
			}
		}
		return true
	})
	for id, n := range rec.ids() {
		if n != 1 {
			t.Errorf("%s handled %d times", id, n)
		}
	}
	if len(rec.ids()) != len(want) {
		t.Errorf("handled %d distinct messages, want %d", len(rec.ids()), len(want))
	}
}

// A fan-out message runs under its own priority's processing limit, not
// that of its class's highest priority, whose consumer carries it.
func TestFanout_OwnPriorityProcessingLimit(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	cut := make(chan error, 1)
	m.started("worker", map[string]agentkit.HandlerFunc{
		"slow": func(ctx context.Context, _ *agentkit.Message) error {
			<-ctx.Done() // critical's limit is a minute; high's here a second
			cut <- ctx.Err()
			return ctx.Err()
		},
	}, agentkit.WithPolicy(wire.PriorityHigh, agentkit.DeliveryPolicy{ProcessingLimit: time.Second}))
	ops := m.started("ops", nil)
	if _, err := ops.Broadcast(ctx(t), "slow", nil, agentkit.WithPriority(wire.PriorityHigh)); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-cut:
		if err == nil {
			t.Error("the handler's ctx ended without an error")
		}
	case <-ctx(t).Done():
		t.Fatal("a high broadcast ran past high's processing limit")
	}
}

// A broadcast shaped as the response to someone's request answers
// nobody: only a direct message can be a reply.
func TestFanout_BroadcastIsNoReply(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	release := make(chan struct{})
	defer close(release)
	m.started("slow", map[string]agentkit.HandlerFunc{"ask": func(ctx context.Context, msg *agentkit.Message) error {
		select {
		case <-release:
		case <-ctx.Done():
		}
		return msg.Reply(ctx, "answer", "the real answer")
	}})
	asker := m.started("asker", map[string]agentkit.HandlerFunc{"answer": func(context.Context, *agentkit.Message) error { return nil }})
	id := wire.NewMessageID()
	got := make(chan *wire.Envelope, 1)
	go func() {
		env, err := asker.Request(ctx(t), "slow", "ask", nil, agentkit.WithMessageID(id))
		if err != nil {
			t.Error(err)
		}
		got <- env
	}()
	// mallory broadcasts a forged response to the request.
	req := wire.NewEnvelope(wire.TypeRequest, "asker", "ask")
	req.MessageID, req.ReceiverID = id, "slow"
	forged := req.NewResponse("mallory", "answer", json.RawMessage(`"forged"`))
	forged.ReceiverID = ""
	data, err := forged.Encode()
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(m.conn())
	if err != nil {
		t.Fatal(err)
	}
	subj, _ := subjects.Default.Broadcast("normal", "mallory")
	if _, err := js.Publish(ctx(t), subj, data); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the asker handled the forged broadcast", func() bool {
		return asker.Stats().Outcomes[agentkit.OutcomeAck]+asker.Stats().Outcomes[agentkit.OutcomeIgnored] >= 1
	})
	release <- struct{}{}
	if env := <-got; env == nil || string(env.Payload) != `"the real answer"` {
		t.Fatalf("the request was answered by %+v", env)
	}
}
