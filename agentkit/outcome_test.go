package agentkit_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// Each row of the outcome table, observed at the broker.

func TestOutcome_NilAcks(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	adv := m.watchAdvisories()
	var rec recorder
	recv := m.started("recv", map[string]agentkit.HandlerFunc{"work": rec.handle(nil)})
	sender := m.agent("sender")
	env, err := sender.Send(ctx(t), "recv", "work", map[string]int{"n": 1})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "ack metric", func() bool { return len(adv.of(subjects.EventAck, 0)) == 1 })
	ack := adv.of(subjects.EventAck, 0)[0]
	if ack.Consumer != "recv_normal" || ack.Deliveries != 1 {
		t.Fatalf("ack metric = %+v, want consumer recv_normal, 1 delivery", ack)
	}
	info, err := recv.ConsumerInfo(ctx(t), wire.PriorityNormal)
	if err != nil {
		t.Fatal(err)
	}
	if info.NumAckPending != 0 || info.AckFloor.Stream != ack.StreamSeq {
		t.Fatalf("consumer ack pending %d, floor %d; want 0, %d", info.NumAckPending, info.AckFloor.Stream, ack.StreamSeq)
	}
	if got := rec.msgs[0]; got.MessageID != env.MessageID || got.Delivery != 1 || string(got.Payload) != `{"n":1}` {
		t.Fatalf("handled %+v", got.Envelope)
	}
	if n := recv.Stats().Outcomes[agentkit.OutcomeAck]; n != 1 {
		t.Fatalf("ack outcomes = %d, want 1", n)
	}
}

func TestOutcome_BusyNaksWithDelayThenAcks(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	adv := m.watchAdvisories()
	var rec recorder
	calls := 0
	recv := m.started("recv", map[string]agentkit.HandlerFunc{"work": func(ctx context.Context, msg *agentkit.Message) error {
		calls++ // one message, handled sequentially
		rec.handle(nil)(ctx, msg)
		if calls < 3 {
			return agentkit.Busy(0)
		}
		return nil
	}}, agentkit.WithPolicy(wire.PriorityHigh, fastPolicy(200*time.Millisecond, 400*time.Millisecond, 400*time.Millisecond)))
	sender := m.agent("sender")
	if _, err := sender.Send(ctx(t), "recv", "work", nil, agentkit.WithPriority(wire.PriorityHigh)); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "ack after two NAKs", func() bool { return len(adv.of(subjects.EventAck, 0)) == 1 })
	naks := adv.of(subjects.EventNak, 0)
	if len(naks) != 2 || naks[0].Deliveries != 1 || naks[1].Deliveries != 2 {
		t.Fatalf("NAK advisories = %+v, want deliveries 1 and 2", naks)
	}
	if d := adv.of(subjects.EventAck, 0)[0].Deliveries; d != 3 {
		t.Fatalf("acked on delivery %d, want 3", d)
	}
	// NakWithDelay follows the priority's backoff: 200ms after the first
	// attempt, 400ms after the second.
	rec.mu.Lock()
	gap1, gap2 := rec.at[1].Sub(rec.at[0]), rec.at[2].Sub(rec.at[1])
	rec.mu.Unlock()
	if gap1 < 200*time.Millisecond || gap2 < 400*time.Millisecond {
		t.Fatalf("redelivery gaps %v, %v; want ≥ 200ms, ≥ 400ms", gap1, gap2)
	}
	if n := recv.Stats().Outcomes[agentkit.OutcomeNak]; n != 2 {
		t.Fatalf("nak outcomes = %d, want 2", n)
	}
}

func TestOutcome_RejectTerminatesAndTellsSender(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	adv := m.watchAdvisories()
	recv := m.started("recv", map[string]agentkit.HandlerFunc{"work": func(context.Context, *agentkit.Message) error {
		return agentkit.Reject(wire.CodeNotFound, "customer CUST999 not found")
	}})
	sender := m.started("sender", nil)
	reply, err := sender.Request(ctx(t), "recv", "work", nil)
	var remote *wire.Error
	if !errors.As(err, &remote) || remote.Code != wire.CodeNotFound || !wire.IsRemote(err) || agentkit.IsRetryable(err) {
		t.Fatalf("Request error = %v, want remote NOT_FOUND", err)
	}
	if reply == nil || reply.MessageType != wire.TypeError || reply.Status != wire.StatusRejected {
		t.Fatalf("reply = %+v, want a rejected error envelope", reply)
	}
	eventually(t, 5*time.Second, "TERM advisory", func() bool { return len(adv.of(subjects.EventTerminated, 0)) == 1 })
	term := adv.of(subjects.EventTerminated, 0)[0]
	if term.Consumer != "recv_normal" || term.Reason != "NOT_FOUND: customer CUST999 not found" {
		t.Fatalf("TERM advisory = %+v", term)
	}
	if n := recv.Stats().Outcomes[agentkit.OutcomeTerm]; n != 1 {
		t.Fatalf("term outcomes = %d, want 1", n)
	}
}

func TestOutcome_PanicRecoveredAndRetried(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	adv := m.watchAdvisories()
	calls := 0
	recv := m.started("recv", map[string]agentkit.HandlerFunc{"work": func(context.Context, *agentkit.Message) error {
		calls++
		if calls == 1 {
			panic("model returned nonsense")
		}
		return nil
	}}, agentkit.WithPolicy(wire.PriorityNormal, fastPolicy(300*time.Millisecond, 300*time.Millisecond)))
	sender := m.agent("sender")
	if _, err := sender.Send(ctx(t), "recv", "work", nil); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "ack after panic", func() bool { return len(adv.of(subjects.EventAck, 0)) == 1 })
	if naks := adv.of(subjects.EventNak, 0); len(naks) != 1 {
		t.Fatalf("NAK advisories = %d, want 1", len(naks))
	}
	st := recv.Stats().Outcomes
	if st[agentkit.OutcomePanic] != 1 || st[agentkit.OutcomeNak] != 1 || st[agentkit.OutcomeAck] != 1 {
		t.Fatalf("outcomes = %v", st)
	}
}

// A handler that outlives the processing limit stops being kept alive: its
// context is cancelled and the message is retried; after MaxDeliver the
// server emits MAX_DELIVERIES for the monitor to escalate.
func TestOutcome_ProcessingLimitThenMaxDeliveries(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	adv := m.watchAdvisories()
	// Margins of many scheduler delays on a loaded machine under -race: the
	// keep-alive, every 750ms, must beat a 3s ack wait (a 2s one can lose
	// when several suites share the machine, a case
	// TestOutcome_RedeliveryOvertakesRunningHandler covers), and the limit
	// is two ack waits.
	pol := fastPolicy(3*time.Second, 3*time.Second)
	pol.ProcessingLimit = 6 * time.Second
	var rec recorder
	m.started("recv", map[string]agentkit.HandlerFunc{"work": func(ctx context.Context, msg *agentkit.Message) error {
		rec.handle(nil)(ctx, msg)
		<-ctx.Done()
		return ctx.Err()
	}}, agentkit.WithPolicy(wire.PriorityLow, pol))
	sender := m.started("sender", nil)
	_, err := sender.Request(ctx(t), "recv", "work", nil, agentkit.WithPriority(wire.PriorityLow))
	if agentkit.CodeOf(err) != wire.CodeTimeout || !wire.IsRemote(err) {
		t.Fatalf("Request error = %v, want the receiver's TIMEOUT after its last attempt", err)
	}
	eventually(t, 5*time.Second, "MAX_DELIVERIES", func() bool { return len(adv.of(subjects.EventMaxDeliveries, 0)) == 1 })
	if got := adv.of(subjects.EventMaxDeliveries, 0)[0]; got.Deliveries != 2 || got.Consumer != "recv_low" {
		t.Fatalf("MAX_DELIVERIES = %+v", got)
	}
	if rec.count() != 2 {
		t.Fatalf("handled %d times, want 2 (MaxDeliver)", rec.count())
	}
	// The handler ran longer than the 3s ack wait: InProgress kept the
	// first delivery alive, so the retry came from the NAK after the limit.
	rec.mu.Lock()
	gap := rec.at[1].Sub(rec.at[0])
	rec.mu.Unlock()
	if gap < pol.ProcessingLimit {
		t.Fatalf("second delivery after %v, want ≥ the %v processing limit", gap, pol.ProcessingLimit)
	}
}

// A context.Canceled of the handler's own (a sub-operation it cancelled)
// is its error, not the processing limit: it was reported as TIMEOUT
// ("processing limit reached").
func TestOutcome_OwnCancelIsNotTheProcessingLimit(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	m.started("recv", map[string]agentkit.HandlerFunc{"work": func(ctx context.Context, _ *agentkit.Message) error {
		sub, cancel := context.WithCancel(ctx)
		cancel()
		return sub.Err()
	}}, agentkit.WithPolicy(wire.PriorityNormal, fastPolicy(time.Second)))
	sender := m.started("sender", nil)
	_, err := sender.Request(ctx(t), "recv", "work", nil)
	var e *wire.Error
	if !errors.As(err, &e) || !wire.IsRemote(err) {
		t.Fatalf("Request error = %v, want the receiver's error after its last attempt", err)
	}
	if e.Code == wire.CodeTimeout || strings.Contains(e.Message, "processing limit") {
		t.Fatalf("the handler's own cancel reported as %s %q", e.Code, e.Message)
	}
}

// A handler that ignores its cancelled context outlives the processing
// limit, so the server redelivers its message while it still runs. The
// redelivery is left to the running handler, which learns that the server
// has reached the last attempt: when it fails, the sender hears so at once.
func TestOutcome_RedeliveryOvertakesRunningHandler(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	pol := fastPolicy(time.Second, time.Second) // 2 attempts
	pol.ProcessingLimit = time.Second
	release := make(chan struct{})
	recv := m.started("recv", map[string]agentkit.HandlerFunc{"work": func(context.Context, *agentkit.Message) error {
		<-release // long after its context is cancelled
		return errors.New("finished too late")
	}}, agentkit.WithPolicy(wire.PriorityLow, pol))
	sender := m.started("sender", nil)
	requestCtx, cancel := context.WithTimeout(ctx(t), 15*time.Second)
	defer cancel()
	result := make(chan error, 1)
	go func() {
		_, err := sender.Request(requestCtx, "recv", "work", nil, agentkit.WithPriority(wire.PriorityLow))
		result <- err
	}()
	eventually(t, 10*time.Second, "the redelivery, left to the running handler", func() bool {
		return recv.Stats().Outcomes[agentkit.OutcomeDuplicate] == 1
	})
	close(release)
	if err := <-result; !wire.IsRemote(err) || !strings.Contains(err.Error(), "giving up after 2 attempts") {
		t.Fatalf("Request error = %v, want the receiver giving up after 2 attempts", err)
	}
}

// Without InProgress a message not acked within the ack wait would be
// redelivered; with it, a 5s handler under a 2s ack wait (margins for a
// loaded machine under -race) is delivered once.
func TestOutcome_InProgressKeepsSlowHandlerAlive(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	adv := m.watchAdvisories()
	var rec recorder
	m.started("recv", map[string]agentkit.HandlerFunc{"work": func(ctx context.Context, msg *agentkit.Message) error {
		rec.handle(nil)(ctx, msg)
		time.Sleep(5 * time.Second)
		return nil
	}}, agentkit.WithPolicy(wire.PriorityNormal, fastPolicy(2*time.Second, 2*time.Second, 2*time.Second)))
	sender := m.agent("sender")
	if _, err := sender.Send(ctx(t), "recv", "work", nil); err != nil {
		t.Fatal(err)
	}
	eventually(t, 15*time.Second, "ack", func() bool { return len(adv.of(subjects.EventAck, 0)) == 1 })
	if d := adv.of(subjects.EventAck, 0)[0].Deliveries; d != 1 || rec.count() != 1 {
		t.Fatalf("acked on delivery %d after %d handler calls; want 1 and 1", d, rec.count())
	}
}

func TestOutcome_UnknownActionIsCapabilityMissing(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	adv := m.watchAdvisories()
	recv := m.started("recv", map[string]agentkit.HandlerFunc{"work": (&recorder{}).handle(nil)})
	sender := m.started("sender", nil)
	ack, err := sender.SendAndWait(ctx(t), "recv", "dance", nil)
	if agentkit.CodeOf(err) != wire.CodeCapabilityMissing || ack == nil || ack.OK || ack.Error == nil {
		t.Fatalf("SendAndWait = %+v, %v; want a CAPABILITY_MISSING NACK", ack, err)
	}
	if !strings.Contains(ack.Error.Message, `"dance"`) {
		t.Fatalf("NACK reason %q does not name the action", ack.Error.Message)
	}
	eventually(t, 5*time.Second, "TERM advisory", func() bool { return len(adv.of(subjects.EventTerminated, 0)) == 1 })
	st := recv.Stats().Outcomes
	if st[agentkit.OutcomeCapabilityMissing] != 1 || st[agentkit.OutcomeTerm] != 1 {
		t.Fatalf("outcomes = %v", st)
	}
}
