package agentkit_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
)

// A Send whose publish was never acked may have been stored; Resend of
// the envelope it returned, once acks are back, stores nothing new and
// reports that the stream held it.
func TestResend_UnconfirmedSendWasHeld(t *testing.T) {
	t.Parallel()
	m, stream := noAckMesh(t)
	sender := m.agent("sender", agentkit.WithRegistration(false), agentkit.WithPublishTimeout(400*time.Millisecond))
	env, err := sender.Send(context.Background(), "recv", "work", nil)
	if !errors.Is(err, agentkit.ErrPublishUnconfirmed) {
		t.Fatalf("Send: %v, want ErrPublishUnconfirmed", err)
	}
	eventually(t, 10*time.Second, "the unconfirmed message stored", func() bool { return msgCount(t, stream) == 1 })
	cfg := stream.CachedInfo().Config
	cfg.NoAck = false
	js, err := jetstream.New(m.conn())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.UpdateStream(ctx(t), cfg); err != nil {
		t.Fatal(err)
	}
	held, err := sender.Resend(ctx(t), env)
	if err != nil || !held {
		t.Fatalf("Resend: held %v, err %v; want held, no error", held, err)
	}
	if n := msgCount(t, stream); n != 1 {
		t.Fatalf("stream holds %d messages after the resend, want 1", n)
	}
}

// Resend of an envelope the stream does not hold stores it and says so.
func TestResend_NewEnvelopeIsStored(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	sender := m.started("sender", nil, agentkit.WithRegistration(false)) // the start creates the stream
	env, err := sender.NewRequest(ctx(t), "recv", "work", nil)
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []bool{false, true} {
		held, err := sender.Resend(ctx(t), env)
		if err != nil || held != want {
			t.Fatalf("Resend %d: held %v, err %v; want held %v", i+1, held, err, want)
		}
	}
	if n := msgCount(t, m.meshStream()); n != 1 {
		t.Fatalf("stream holds %d messages, want 1", n)
	}
	if _, err := sender.Resend(ctx(t), nil); !errors.Is(err, wire.ErrInvalidEnvelope) {
		t.Fatalf("Resend(nil): %v, want ErrInvalidEnvelope", err)
	}
}

// A SendAndWait whose publish is never acked fails with
// ErrPublishUnconfirmed before it waits for any reply, with or without an
// id of the caller's (which publishes alone).
func TestSendAndWait_NoAckIsUnconfirmed(t *testing.T) {
	t.Parallel()
	m, _ := noAckMesh(t)
	sender := m.started("sender", nil, agentkit.WithRegistration(false), agentkit.WithPublishTimeout(400*time.Millisecond))
	for name, opts := range map[string][]agentkit.SendOption{
		"new id":   nil,
		"given id": {agentkit.WithMessageID(wire.NewMessageID())},
	} {
		c, cancel := context.WithTimeout(ctx(t), 500*time.Millisecond)
		_, err := sender.SendAndWait(c, "recv", "work", nil, opts...)
		cancel()
		if !errors.Is(err, agentkit.ErrPublishUnconfirmed) || errors.Is(err, agentkit.ErrPublish) || errors.Is(err, agentkit.ErrDuplicateRequest) {
			t.Errorf("SendAndWait, %s: %v, want ErrPublishUnconfirmed alone", name, err)
		}
	}
}

// answerer starts "recv", whose "work" handler replies "done" and counts
// its runs, and "orch".
func answerer(t *testing.T) (orch *agentkit.Agent, runs *atomic.Int32) {
	m := newMesh(t)
	runs = new(atomic.Int32)
	m.started("recv", map[string]agentkit.HandlerFunc{"work": func(ctx context.Context, msg *agentkit.Message) error {
		runs.Add(1)
		return msg.Reply(ctx, "done", nil)
	}})
	return m.started("orch", nil, agentkit.WithRequestTimeout(time.Hour)), runs
}

// A Request or SendAndWait retried under the id of one that was answered
// fails at once with ErrDuplicateRequest: the stream holds the message, so
// no answer will come. The call's ctx outlasts the test's other waits, so
// returning at all shows it did not wait; the failure is local, so the
// breaker stays closed, and the receiver handled the message once.
func TestRequest_RetryOfAnsweredIsDuplicate(t *testing.T) {
	t.Parallel()
	for name, call := range map[string]func(*agentkit.Agent, context.Context, ...agentkit.SendOption) error{
		"Request": func(a *agentkit.Agent, c context.Context, opts ...agentkit.SendOption) error {
			_, err := a.Request(c, "recv", "work", nil, opts...)
			return err
		},
		"SendAndWait": func(a *agentkit.Agent, c context.Context, opts ...agentkit.SendOption) error {
			_, err := a.SendAndWait(c, "recv", "work", nil, opts...)
			return err
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			orch, runs := answerer(t)
			id := agentkit.WithMessageID(wire.NewMessageID())
			if err := call(orch, ctx(t), id); err != nil {
				t.Fatal(err)
			}
			err := call(orch, ctx(t), id)
			if !errors.Is(err, agentkit.ErrDuplicateRequest) || agentkit.IsRetryable(err) {
				t.Fatalf("retry: %v, want ErrDuplicateRequest, not retryable", err)
			}
			if st := orch.BreakerState("recv"); st != agentkit.BreakerClosed {
				t.Errorf("breaker %s after a local failure", st)
			}
			if d := orch.Stats().PublishDuplicates; d != 1 {
				t.Errorf("PublishDuplicates = %d, want the retry's 1", d)
			}
			if n := runs.Load(); n != 1 {
				t.Errorf("handled %d times, want 1", n)
			}
		})
	}
}

// A Request that ended before its answer came (here its ctx was
// cancelled while the receiver handled it) and is retried under its id
// after the answer arrived, as a late reply, fails at once too.
func TestRequest_RetryAfterLateAnswerIsDuplicate(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	started, release := make(chan struct{}, 1), make(chan struct{})
	m.started("recv", map[string]agentkit.HandlerFunc{"work": func(ctx context.Context, msg *agentkit.Message) error {
		started <- struct{}{}
		<-release
		return msg.Reply(ctx, "done", nil)
	}})
	orch := m.started("orch", nil, agentkit.WithRequestTimeout(time.Hour))
	id := agentkit.WithMessageID(wire.NewMessageID())
	first, cancel := context.WithCancel(ctx(t))
	done := make(chan error, 1)
	go func() {
		_, err := orch.Request(first, "recv", "work", nil, id)
		done <- err
	}()
	<-started // stored and being handled
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("first Request: %v, want context.Canceled", err)
	}
	close(release)
	eventually(t, 10*time.Second, "the late answer", func() bool { return orch.Stats().Outcomes[agentkit.OutcomeLateReply] == 1 })
	if _, err := orch.Request(ctx(t), "recv", "work", nil, id); !errors.Is(err, agentkit.ErrDuplicateRequest) {
		t.Fatalf("retry: %v, want ErrDuplicateRequest", err)
	}
}

// Two calls of one agent waiting under one message id: the second fails
// at once, before publishing, and the first still gets the answer.
func TestRequest_ConcurrentSameIDIsDuplicate(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	started, release := make(chan struct{}, 1), make(chan struct{})
	m.started("recv", map[string]agentkit.HandlerFunc{"work": func(ctx context.Context, msg *agentkit.Message) error {
		started <- struct{}{}
		<-release
		return msg.Reply(ctx, "done", nil)
	}})
	orch := m.started("orch", nil)
	id := wire.NewMessageID()
	type result struct {
		reply *wire.Envelope
		err   error
	}
	done := make(chan result, 1)
	go func() {
		r, err := orch.Request(ctx(t), "recv", "work", nil, agentkit.WithMessageID(id))
		done <- result{r, err}
	}()
	<-started
	if _, err := orch.Request(ctx(t), "recv", "work", nil, agentkit.WithMessageID(id)); !errors.Is(err, agentkit.ErrDuplicateRequest) {
		t.Fatalf("second Request: %v, want ErrDuplicateRequest", err)
	}
	if d := orch.Stats().PublishDuplicates; d != 0 {
		t.Errorf("PublishDuplicates = %d: the second Request published", d)
	}
	close(release)
	if r := <-done; r.err != nil || r.reply.InReplyTo != id {
		t.Fatalf("first Request: reply %+v, err %v; want the answer to %s", r.reply, r.err, id)
	}
}
