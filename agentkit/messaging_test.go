package agentkit_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/subjects"
)

func TestRequest_Response(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	m.started("planner_1", map[string]agentkit.HandlerFunc{"plan_workflow": func(ctx context.Context, msg *agentkit.Message) error {
		var in struct{ Operation string }
		if err := msg.DecodePayload(&in); err != nil {
			return agentkit.Reject(wire.CodeInvalid, err.Error())
		}
		return msg.Reply(ctx, "plan_complete", map[string]any{"tasks": []string{"fetch", "update", "validate"}, "op": in.Operation})
	}}, agentkit.WithType("planner"))
	orch := m.started("orch_1", nil, agentkit.WithType("orchestrator"))
	reply, err := orch.Request(ctx(t), "planner_1", "plan_workflow", map[string]string{"operation": "update"},
		agentkit.WithPriority(wire.PriorityHigh), agentkit.WithWorkflowID("wf_abc"), agentkit.WithCorrelationID("corr_1"))
	if err != nil {
		t.Fatal(err)
	}
	if reply.MessageType != wire.TypeResponse || reply.Action != "plan_complete" || reply.Status != wire.StatusSuccess ||
		reply.WorkflowID != "wf_abc" || reply.Correlation != "corr_1" || reply.Priority != wire.PriorityHigh ||
		reply.SenderID != "planner_1" || reply.SenderType != "planner" || reply.ReceiverType != "orchestrator" {
		t.Fatalf("reply = %+v", reply)
	}
	if string(reply.Payload) != `{"op":"update","tasks":["fetch","update","validate"]}` {
		t.Fatalf("payload = %s", reply.Payload)
	}
	if n := orch.Stats().Outcomes[agentkit.OutcomeReply]; n != 1 {
		t.Fatalf("reply outcomes = %d, want 1", n)
	}
}

// A Request inside a handler needs no free worker to receive its response:
// with one worker, the planner's handler asks the executor and waits.
func TestRequest_NestedWithOneWorker(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	m.started("executor", map[string]agentkit.HandlerFunc{"execute": func(ctx context.Context, msg *agentkit.Message) error {
		return msg.Reply(ctx, "done", nil)
	}})
	var planner *agentkit.Agent
	planner = m.started("planner", map[string]agentkit.HandlerFunc{"plan": func(ctx context.Context, msg *agentkit.Message) error {
		if _, err := planner.Request(ctx, "executor", "execute", nil, agentkit.WithCorrelationID(msg.Correlation)); err != nil {
			return err
		}
		return msg.Reply(ctx, "planned", nil)
	}}, agentkit.WithConcurrency(1))
	orch := m.started("orch", nil)
	if _, err := orch.Request(ctx(t), "planner", "plan", nil); err != nil {
		t.Fatal(err)
	}
}

func TestRequest_TimeoutThenLateResponse(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	release := make(chan struct{})
	var timedOut atomic.Value // the message id of the request that timed out
	timedOut.Store("")
	m.started("slow", map[string]agentkit.HandlerFunc{"think": func(ctx context.Context, msg *agentkit.Message) error {
		select {
		case <-release:
		case <-ctx.Done(): // the agent stops (a failed test must not hang)
			return ctx.Err()
		}
		if msg.MessageID != timedOut.Load() {
			return nil // an attempt whose publish outlived its deadline: no reply
		}
		return msg.Reply(ctx, "thought", nil)
	}})
	orch := m.started("orch", nil)
	// The deadline covers the publish too: on a loaded machine the publish
	// may outlive it, which is ErrPublishUnconfirmed, not this test's case;
	// such an attempt is made again.
	for attempt := 1; ; attempt++ {
		id := wire.NewMessageID()
		c, cancel := context.WithTimeout(ctx(t), 200*time.Millisecond)
		_, err := orch.Request(c, "slow", "think", nil, agentkit.WithMessageID(id))
		cancel()
		if errors.Is(err, agentkit.ErrPublishUnconfirmed) && attempt < 10 {
			continue
		}
		if !errors.Is(err, agentkit.ErrTimeout) || agentkit.CodeOf(err) != wire.CodeTimeout || !agentkit.IsRetryable(err) {
			t.Fatalf("Request error = %v, want ErrTimeout", err)
		}
		timedOut.Store(id)
		break
	}
	close(release)
	eventually(t, 5*time.Second, "late response counted", func() bool {
		return orch.Stats().Outcomes[agentkit.OutcomeLateReply] == 1
	})
}

func TestRequest_NeedsStartedAgent(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	a := m.agent("orch")
	if _, err := a.Request(ctx(t), "x", "y", nil); !errors.Is(err, agentkit.ErrNotStarted) {
		t.Fatalf("err = %v, want ErrNotStarted", err)
	}
}

func TestSendAndWait_Ack(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	m.started("executor_1", map[string]agentkit.HandlerFunc{"execute_operation": func(context.Context, *agentkit.Message) error {
		time.Sleep(20 * time.Millisecond)
		return nil
	}})
	orch := m.started("orch_1", nil)
	ack, err := orch.SendAndWait(ctx(t), "executor_1", "execute_operation", map[string]any{"customer_id": "CUST001", "credit_limit": 100000})
	if err != nil {
		t.Fatal(err)
	}
	if !ack.OK || ack.Error != nil || ack.ProcessingTime < 20*time.Millisecond || ack.Envelope.Status != wire.StatusACK {
		t.Fatalf("ack = %+v", ack)
	}
}

func TestSendAndWait_Nack(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	m.started("executor_1", map[string]agentkit.HandlerFunc{"execute_operation": func(context.Context, *agentkit.Message) error {
		return agentkit.Reject(wire.CodeInvalid, "credit_limit must be positive")
	}})
	orch := m.started("orch_1", nil)
	ack, err := orch.SendAndWait(ctx(t), "executor_1", "execute_operation", map[string]any{"credit_limit": -1})
	var e *wire.Error
	if !errors.As(err, &e) || e.Code != wire.CodeInvalid || e.Message != "credit_limit must be positive" {
		t.Fatalf("err = %v, want INVALID NACK", err)
	}
	if ack.OK || ack.Envelope.Status != wire.StatusNACK || ack.Envelope.MessageType != wire.TypeAck || ack.Error.Code != wire.CodeInvalid {
		t.Fatalf("ack = %+v", ack)
	}
}

func TestPublishSubscribe_ThreeSubscribers(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	// Three agents subscribe after starting, one from the start; one
	// agent is not subscribed at all.
	all := []*recorder{{}, {}, {}, {}}
	for i, rec := range all[:3] {
		a := m.started(fmt.Sprintf("sub%d", i), map[string]agentkit.HandlerFunc{"finding": rec.handle(nil)})
		if err := a.Subscribe(ctx(t), "findings"); err != nil {
			t.Fatal(err)
		}
	}
	m.started("sub3", map[string]agentkit.HandlerFunc{"finding": all[3].handle(nil)}, agentkit.WithTopics("findings"))
	var other recorder
	bystander := m.started("bystander", map[string]agentkit.HandlerFunc{"finding": other.handle(nil)})
	pub := m.started("analyzer", map[string]agentkit.HandlerFunc{"finding": (&recorder{}).handle(nil)}, agentkit.WithTopics("findings"))
	env, err := pub.Publish(ctx(t), "findings", "finding", map[string]string{"severity": "HIGH"})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "four subscribers", func() bool {
		for i := range all {
			if all[i].count() != 1 {
				return false
			}
		}
		return true
	})
	for i := range all {
		if got := all[i].msgs[0]; got.MessageID != env.MessageID || got.Topic != "findings" || got.MessageType != wire.TypeNotification {
			t.Fatalf("subscriber %d got %+v", i, got.Envelope)
		}
	}
	eventually(t, 5*time.Second, "publisher skips its own message", func() bool { return pub.Stats().Outcomes[agentkit.OutcomeOwn] == 1 })
	info, err := bystander.ConsumerInfo(ctx(t), wire.PriorityNormal)
	if err != nil {
		t.Fatal(err)
	}
	if other.count() != 0 || info.Delivered.Stream != 0 {
		t.Fatalf("an unsubscribed agent received a topic message (%d delivered)", info.Delivered.Stream)
	}
}

func TestBroadcast_FiveAgents(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	var recs [5]recorder
	for i := range recs {
		m.started(fmt.Sprintf("agent%d", i), map[string]agentkit.HandlerFunc{"shutdown_notice": recs[i].handle(nil)})
	}
	var own recorder
	ops := m.started("ops", map[string]agentkit.HandlerFunc{"shutdown_notice": own.handle(nil)})
	if _, err := ops.Broadcast(ctx(t), "shutdown_notice", map[string]int{"countdown": 30}, agentkit.WithPriority(wire.PriorityCritical)); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "five deliveries", func() bool {
		for i := range recs {
			if recs[i].count() != 1 {
				return false
			}
		}
		return true
	})
	eventually(t, 5*time.Second, "sender skips its own broadcast", func() bool { return ops.Stats().Outcomes[agentkit.OutcomeOwn] == 1 })
	if own.count() != 0 {
		t.Errorf("the sender handled its own broadcast %d times", own.count())
	}
}

func TestSend_SameMessageIDHandledOnce(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	var rec recorder
	recv := m.started("recv", map[string]agentkit.HandlerFunc{"work": rec.handle(nil)})
	sender := m.agent("sender")
	id := wire.NewMessageID()
	for range 2 {
		if _, err := sender.Send(ctx(t), "recv", "work", nil, agentkit.WithMessageID(id)); err != nil {
			t.Fatal(err)
		}
	}
	if n := sender.Stats().PublishDuplicates; n != 1 {
		t.Fatalf("PublishDuplicates = %d, want 1 (the second send)", n)
	}
	// A marker sent after both: once it is handled, the duplicate would
	// have been too.
	if _, err := sender.Send(ctx(t), "recv", "marker", nil); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "marker", func() bool { return recv.Stats().Outcomes[agentkit.OutcomeTerm] == 1 })
	if got := rec.ids(); len(got) != 1 || got[id] != 1 {
		t.Fatalf("handled %v, want %s once", got, id)
	}
	info, err := recv.ConsumerInfo(ctx(t), wire.PriorityNormal)
	if err != nil {
		t.Fatal(err)
	}
	if info.Delivered.Stream != 2 {
		t.Fatalf("stream holds %d messages for recv, want 2 (duplicate dropped)", info.Delivered.Stream)
	}
}

// A Request that timed out can be tried again under the same message_id
// (WithMessageID): the stream stores it once, and the retry receives the
// response to the first copy, which was still being handled.
func TestRequest_RetrySameIDAfterTimeout(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	release := make(chan struct{})
	m.started("recv", map[string]agentkit.HandlerFunc{"work": func(ctx context.Context, msg *agentkit.Message) error {
		<-release
		return msg.Reply(ctx, "done", nil)
	}})
	orch := m.started("orch", nil)
	id := wire.NewMessageID()
	short, cancel := context.WithTimeout(ctx(t), 300*time.Millisecond)
	defer cancel()
	if _, err := orch.Request(short, "recv", "work", nil, agentkit.WithMessageID(id)); !errors.Is(err, agentkit.ErrTimeout) {
		t.Fatalf("first Request: %v, want ErrTimeout", err)
	}
	type result struct {
		reply *wire.Envelope
		err   error
	}
	done := make(chan result, 1)
	go func() {
		r, err := orch.Request(ctx(t), "recv", "work", nil, agentkit.WithMessageID(id))
		done <- result{r, err}
	}()
	eventually(t, 5*time.Second, "the retry's publish", func() bool { return orch.Stats().PublishDuplicates == 1 })
	close(release)
	r := <-done
	if r.err != nil || r.reply.InReplyTo != id || r.reply.Action != "done" {
		t.Fatalf("retry: reply %+v, err %v; want the response to %s", r.reply, r.err, id)
	}
}

// Two instances that consume at once share one agent's consumer. One dies
// (its connection closes) while holding messages mid-handler; the other
// handles everything, including the messages the dead one never acked.
func TestInstances_ShareWorkAndSurviveACrash(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	pol := fastPolicy(200*time.Millisecond, 200*time.Millisecond, 200*time.Millisecond)
	// A's handlers hang until A dies; a processing limit ending them first
	// (the sends can take that long on a loaded machine) would redeliver
	// their messages, maybe to A again, until their attempts run out.
	pol.ProcessingLimit = 10 * time.Minute
	const n = 200
	var mu sync.Mutex
	acked := map[string]string{} // message id → instance that handled it
	stuck := make(chan struct{})
	var stuckOnce sync.Once
	handler := func(instance string) agentkit.HandlerFunc {
		return func(ctx context.Context, msg *agentkit.Message) error {
			if instance == "A" {
				stuckOnce.Do(func() { close(stuck) })
				<-ctx.Done() // A hangs until it dies
				return ctx.Err()
			}
			mu.Lock()
			acked[msg.MessageID] = instance
			mu.Unlock()
			return nil
		}
	}
	connA := m.conn()
	a, err := agentkit.New(connA, "worker", agentkit.WithPolicy(wire.PriorityNormal, pol), agentkit.WithConcurrency(2), agentkit.WithConcurrentInstances())
	if err != nil {
		t.Fatal(err)
	}
	a.HandleFunc("work", handler("A"))
	if err := a.Start(ctx(t)); err != nil {
		t.Fatal(err)
	}
	m.started("worker", map[string]agentkit.HandlerFunc{"work": handler("B")}, agentkit.WithPolicy(wire.PriorityNormal, pol), agentkit.WithConcurrentInstances())
	sender := m.agent("sender")
	sent := map[string]bool{}
	for i := range n {
		env, err := sender.Send(ctx(t), "worker", "work", map[string]int{"i": i})
		if err != nil {
			t.Fatal(err)
		}
		sent[env.MessageID] = true
	}
	<-stuck
	connA.Close() // instance A crashes: no Stop, no acks
	// B works through the backlog, and A's messages once their ack wait
	// passes: fail only when B stops making progress.
	last, since := -1, time.Now()
	for {
		mu.Lock()
		got := len(acked)
		mu.Unlock()
		if got == n {
			break
		}
		if got != last {
			last, since = got, time.Now()
		} else if time.Since(since) > 10*time.Second {
			t.Fatalf("B handled %d of %d messages and none for 10s", got, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for id := range sent {
		if acked[id] != "B" {
			t.Fatalf("message %s not handled", id)
		}
	}
	a.Stop()
}

func TestCritical_OvertakesLowBacklog(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	const backlog = 10000
	gate := make(chan struct{})
	var lowDone atomic.Int64
	var lowAtCritical atomic.Int64
	criticalDone := make(chan struct{})
	recv := m.agent("recv", agentkit.WithConcurrency(2))
	recv.HandleFunc("low_work", func(ctx context.Context, _ *agentkit.Message) error {
		select {
		case <-gate: // the general workers are all busy with low work
		case <-ctx.Done(): // the agent stops (a failed test must not hang)
			return ctx.Err()
		}
		lowDone.Add(1)
		return nil
	})
	recv.HandleFunc("alarm", func(context.Context, *agentkit.Message) error {
		lowAtCritical.Store(lowDone.Load())
		close(criticalDone)
		return nil
	})
	// Fill the backlog before the receiver starts, as fast as possible.
	sender := m.agent("sender")
	js, _ := jetstream.New(m.conn())
	if err := agentkit.EnsureStream(ctx(t), js, agentkit.StreamConfig(subjects.Default, 1)); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var next atomic.Int64
	for range 32 {
		wg.Go(func() {
			for next.Add(1) <= backlog {
				if _, err := sender.Send(ctx(t), "recv", "low_work", nil, agentkit.WithPriority(wire.PriorityLow)); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if err := recv.Start(ctx(t)); err != nil {
		t.Fatal(err)
	}
	if _, err := sender.Send(ctx(t), "recv", "alarm", nil, agentkit.WithPriority(wire.PriorityCritical)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-criticalDone:
	case <-time.After(10 * time.Second):
		t.Fatal("critical message not handled while the low backlog waits")
	}
	if got := lowAtCritical.Load(); got != 0 {
		t.Fatalf("%d low messages handled before the critical one", got)
	}
	close(gate)
	eventually(t, 60*time.Second, "the whole low backlog", func() bool { return lowDone.Load() == backlog })
}

func TestExpired_NeverHandled(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	var rec recorder
	recv := m.agent("recv")
	recv.HandleFunc("work", rec.handle(nil))
	sender := m.started("sender", nil)
	js, _ := jetstream.New(m.conn())
	if err := agentkit.EnsureStream(ctx(t), js, agentkit.StreamConfig(subjects.Default, 1)); err != nil {
		t.Fatal(err)
	}
	expired, err := sender.Send(ctx(t), "recv", "work", nil, agentkit.WithTTL(time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond) // let the 1ms ttl pass before the receiver starts
	if err := recv.Start(ctx(t)); err != nil {
		t.Fatal(err)
	}
	fresh, err := sender.Send(ctx(t), "recv", "work", nil, agentkit.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "fresh message handled", func() bool { return rec.count() == 1 })
	eventually(t, 5*time.Second, "expired counted", func() bool { return recv.Stats().Outcomes[agentkit.OutcomeExpired] == 1 })
	if ids := rec.ids(); ids[expired.MessageID] != 0 || ids[fresh.MessageID] != 1 {
		t.Fatalf("handled %v", ids)
	}
	info, _ := recv.ConsumerInfo(ctx(t), wire.PriorityNormal)
	if info.NumAckPending != 0 || info.NumRedelivered != 0 {
		t.Fatalf("expired message not acked: %+v", info)
	}
}

// WithTTL rounds up to whole milliseconds: a sub-millisecond ttl must not
// become ttl_ms 0, which means no expiry.
func TestWithTTL_RoundsUp(t *testing.T) {
	t.Parallel()
	sender := newMesh(t).agent("sender")
	for ttl, want := range map[time.Duration]int64{500 * time.Microsecond: 1, 1500 * time.Microsecond: 2, 2 * time.Millisecond: 2, time.Minute: 60000,
		-500 * time.Microsecond: -1} {
		e, err := sender.NewRequest(ctx(t), "recv", "work", nil, agentkit.WithTTL(ttl))
		if err != nil {
			t.Fatal(err)
		}
		if e.TTLMillis != want {
			t.Errorf("WithTTL(%v): ttl_ms = %d, want %d", ttl, e.TTLMillis, want)
		}
	}
}

// Concurrent Send and SendBatch calls encode into recycled buffers; every
// message must arrive with exactly the payload it was sent with.
func TestSend_ConcurrentPayloadsIntact(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	type body struct {
		ID  string `json:"id"`
		Pad string `json:"pad"`
	}
	const senders, each = 16, 40
	var mu sync.Mutex
	bad := []string{}
	got := map[string]int{}
	recv := m.started("recv", map[string]agentkit.HandlerFunc{"work": func(_ context.Context, msg *agentkit.Message) error {
		var b body
		err := msg.DecodePayload(&b)
		mu.Lock()
		defer mu.Unlock()
		// The payload names its own message; the pad's length is tied to it.
		if err != nil || b.ID != msg.MessageID || len(b.Pad) != 100+int(b.ID[0])*7 {
			bad = append(bad, string(msg.Payload))
		}
		got[msg.MessageID]++
		return nil
	}}, agentkit.WithConcurrency(4))
	sender := m.agent("sender")
	payload := func(id string) body { return body{ID: id, Pad: strings.Repeat(id[:1], 100+int(id[0])*7)} }
	var wg sync.WaitGroup
	for g := range senders {
		wg.Go(func() {
			if g%2 == 0 { // Send, one at a time
				for range each {
					id := wire.NewMessageID()
					if _, err := sender.Send(ctx(t), "recv", "work", payload(id), agentkit.WithMessageID(id)); err != nil {
						t.Error(err)
						return
					}
				}
				return
			}
			batch := make([]*wire.Envelope, each) // SendBatch, all at once
			for i := range batch {
				id := wire.NewMessageID()
				e, err := sender.NewRequest(ctx(t), "recv", "work", payload(id), agentkit.WithMessageID(id))
				if err != nil {
					t.Error(err)
					return
				}
				batch[i] = e
			}
			if err := sender.SendBatch(ctx(t), batch); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	eventually(t, 10*time.Second, "all handled", func() bool { return recv.Stats().Outcomes[agentkit.OutcomeAck] >= senders*each })
	mu.Lock()
	defer mu.Unlock()
	if len(bad) > 0 {
		t.Fatalf("%d payloads did not match their message, first: %s", len(bad), bad[0])
	}
	if len(got) != senders*each {
		t.Fatalf("handled %d distinct messages, want %d", len(got), senders*each)
	}
}
