package agentkit_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/agentkit"
)

// An agent that has stopped (Stop or Drain returned) sends nothing,
// whichever way it is asked to: each send fails with ErrClosed, no
// message reaches the stream and the connection gains no subscription (a
// send would otherwise make nats.go's ack subscription again, and nothing
// would drop it before the connection closes).
func TestSend_StoppedAgentSendsNothing(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		start bool
		stop  func(*agentkit.Agent) error
	}{
		{"Stop", true, func(a *agentkit.Agent) error { a.Stop(); return nil }},
		{"Drain", true, func(a *agentkit.Agent) error { return a.Drain(context.Background()) }},
		{"Stop, never started", false, func(a *agentkit.Agent) error { a.Stop(); return nil }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			m := newMesh(t)
			m.createStream(func(*jetstream.StreamConfig) {})
			stream := m.meshStream()
			nc := m.conn()
			sender, err := agentkit.New(nc, "sender", agentkit.WithRegistration(false))
			if err != nil {
				t.Fatal(err)
			}
			if tc.start {
				if err := sender.Start(ctx(t)); err != nil {
					t.Fatal(err)
				}
			}
			if err := tc.stop(sender); err != nil {
				t.Fatal(err)
			}
			subs := nc.NumSubscriptions()
			for path, err := range sendPaths(t, sender, ctx(t)) {
				if !errors.Is(err, agentkit.ErrClosed) || errors.Is(err, agentkit.ErrPublish) {
					t.Errorf("%s after %s: %v, want ErrClosed", path, tc.name, err)
				}
			}
			if n := nc.NumSubscriptions(); n != subs {
				t.Errorf("the stopped agent's sends left %d subscriptions on its connection, want %d", n, subs)
			}
			// Another agent on the same connection: once its message is
			// acked, anything the stopped one had published is stored.
			other, err := agentkit.New(nc, "other", agentkit.WithRegistration(false))
			if err != nil {
				t.Fatal(err)
			}
			defer other.Stop()
			if _, err := other.Send(ctx(t), "recv", "marker", nil); err != nil {
				t.Fatal(err)
			}
			if n := msgCount(t, stream); n != 1 {
				t.Fatalf("stream holds %d messages, want only the marker: the stopped agent published", n)
			}
		})
	}
}

// A handler's message kept past its handler cannot be answered once its
// agent has stopped.
func TestReply_StoppedAgentRepliesNothing(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	kept := make(chan *agentkit.Message, 1)
	recv := m.started("recv", map[string]agentkit.HandlerFunc{"work": func(_ context.Context, msg *agentkit.Message) error {
		kept <- msg
		return nil
	}}, agentkit.WithRegistration(false))
	sender := m.agent("sender", agentkit.WithRegistration(false))
	if _, err := sender.Send(ctx(t), "recv", "work", nil); err != nil {
		t.Fatal(err)
	}
	msg := <-kept
	recv.Stop()
	if err := msg.Reply(ctx(t), "late", nil); !errors.Is(err, agentkit.ErrClosed) {
		t.Fatalf("Reply after Stop: %v, want ErrClosed", err)
	}
}

// Sends racing Stop leave no subscription behind either: whichever way
// each one ends (stored, or ErrClosed), the connection ends up with the
// subscriptions of an agent stopped in peace.
func TestSend_StopWhileSending(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	m.createStream(func(*jetstream.StreamConfig) {})
	subsAfterStop := func(race bool) int {
		nc := m.conn()
		sender, err := agentkit.New(nc, "sender", agentkit.WithRegistration(false))
		if err != nil {
			t.Fatal(err)
		}
		if err := sender.Start(ctx(t)); err != nil {
			t.Fatal(err)
		}
		if _, err := sender.Send(ctx(t), "recv", "work", nil); err != nil {
			t.Fatal(err)
		}
		var stopped atomic.Bool
		var wg sync.WaitGroup
		senders := 0
		if race {
			senders = 8
		}
		for range senders {
			wg.Go(func() {
				for {
					last := stopped.Load()
					_, err := sender.Send(ctx(t), "recv", "work", nil)
					if err != nil && !errors.Is(err, agentkit.ErrClosed) {
						t.Errorf("Send racing Stop: %v", err)
						return
					}
					if last {
						return
					}
				}
			})
		}
		sender.Stop()
		stopped.Store(true)
		wg.Wait()
		return nc.NumSubscriptions()
	}
	quiet, raced := subsAfterStop(false), subsAfterStop(true)
	if raced != quiet {
		t.Fatalf("%d subscriptions left by an agent stopped while sending, %d by one stopped in peace", raced, quiet)
	}
}
