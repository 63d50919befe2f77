package agentkit

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentmesh-io/agentmesh/internal/natstest"
)

// The keep-alive scanner sleeps while its agent holds no message, wakes
// for one, and sleeps again once the message is settled, so idle agents
// cost no timer wake-ups. (That it stays awake and keeps a slow handler's
// message alive, the keep-alive tests check: their agents start idle.)
func TestScanner_SleepsWhileTheAgentHoldsNothing(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a, err := New(natstest.Connect(t, s), "sleeper", WithRegistration(false))
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int32
	release := make(chan struct{})
	a.HandleFunc("work", func(ctx context.Context, _ *Message) error {
		runs.Add(1)
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	if err := a.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Stop)
	asleep := a.recv.idleScan.asleep.Load
	natstest.Eventually(t, 10*time.Second, "the idle agent's scanner asleep", asleep)

	sender, err := New(natstest.Connect(t, s), "sender", WithRegistration(false))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sender.Send(ctx, "sleeper", "work", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 10*time.Second, "the handler running", func() bool { return runs.Load() == 1 })
	natstest.Eventually(t, 10*time.Second, "the scanner woken by the message", func() bool { return !asleep() })
	close(release)
	natstest.Eventually(t, 10*time.Second, "the message acked", func() bool { return a.Stats().Outcomes[OutcomeAck] == 1 })
	if n := runs.Load(); n != 1 {
		t.Fatalf("the handler ran %d times, want once", n)
	}
	natstest.Eventually(t, 10*time.Second, "the scanner asleep again", asleep)
}
