package agentkit

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// lineAgent returns a sender and its stream (see streamAgent), with every
// send slot taken, so each Send joins the line until the test frees a
// slot.
func lineAgent(t *testing.T, fast bool, opts ...Option) (*Agent, jetstream.Stream) {
	t.Helper()
	a, stream := streamAgent(t, fast, opts...)
	a.send.line.busy = sendSlots
	return a, stream
}

// inLine waits until n Sends wait in a's line.
func inLine(t *testing.T, a *Agent, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		a.send.line.mu.Lock()
		got := len(a.send.line.queue)
		a.send.line.mu.Unlock()
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d Sends in line, want %d", got, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// sendAll starts n Sends to distinct receivers' inboxes and returns a
// function that waits for them and returns their errors.
func sendAll(a *Agent, ctx context.Context, n int) func() []error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			_, errs[i] = a.Send(ctx, "receiver", "work", map[string]int{"i": i})
		})
	}
	return func() []error { wg.Wait(); return errs }
}

// Sends that find every slot busy wait in line; the slot's next holder
// publishes the whole line, as one fast batch where the stream takes
// them, else one by one, and each Send returns once its own message is
// stored.
func TestSendLine_PublishesTheLine(t *testing.T) {
	for _, fast := range []bool{true, false} {
		t.Run(fmt.Sprintf("fast batches %v", fast), func(t *testing.T) {
			a, stream := lineAgent(t, fast)
			const n = 20
			wait := sendAll(a, context.Background(), n)
			inLine(t, a, n)
			a.send.passSlot()
			for i, err := range wait() {
				if err != nil {
					t.Errorf("send %d: %v", i, err)
				}
			}
			if got, want := a.Stats().FastBatched, map[bool]uint64{true: n}[fast]; got != want {
				t.Errorf("FastBatched = %d, want %d", got, want)
			}
			info, err := stream.Info(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if info.State.Msgs != n {
				t.Errorf("stream holds %d messages, want %d", info.State.Msgs, n)
			}
			a.send.line.mu.Lock()
			defer a.send.line.mu.Unlock()
			// The test's passSlot freed one of the slots it had taken.
			if a.send.line.busy != sendSlots-1 || len(a.send.line.queue) != 0 {
				t.Errorf("after the line: %d slots busy, %d in line; want %d and 0", a.send.line.busy, len(a.send.line.queue), sendSlots-1)
			}
		})
	}
}

// A Send whose ctx ends while it waits in line leaves the line, returns
// the ctx's error and publishes nothing; the line behind it goes on.
func TestSendLine_CancelledInLine(t *testing.T) {
	a, stream := lineAgent(t, true)
	ctx, cancel := context.WithCancel(context.Background())
	waitCancelled := sendAll(a, ctx, 1)
	inLine(t, a, 1)
	waitOthers := sendAll(a, context.Background(), 3)
	inLine(t, a, 4)
	cancel()
	if err := waitCancelled()[0]; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Send: %v, want context.Canceled", err)
	}
	inLine(t, a, 3)
	a.send.passSlot()
	for i, err := range waitOthers() {
		if err != nil {
			t.Errorf("send %d: %v", i, err)
		}
	}
	info, err := stream.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 3 {
		t.Errorf("stream holds %d messages, want the 3 not cancelled", info.State.Msgs)
	}
}

// A Send taken into a batch returns when its ctx ends, not when the batch
// does: here the stream never acks a single publish (NoAck; it takes no
// fast batches, which it would ack), so the batch's leader waits out the
// attempt timeout while its member's short ctx has long ended.
func TestSendLine_MemberHonoursItsContext(t *testing.T) {
	t.Parallel()
	// Attempts of 1s; the leader's publish ends within the 4s.
	a, stream := lineAgent(t, false, WithPublishTimeout(4*time.Second))
	cfg := stream.CachedInfo().Config
	cfg.NoAck = true
	js, _ := jetstream.New(a.nc)
	if err := js.DeleteStream(context.Background(), cfg.Name); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	leader := sendAll(a, context.Background(), 1)
	inLine(t, a, 1)
	short, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	member := sendAll(a, short, 1)
	inLine(t, a, 2)
	leaderDone := make(chan []error, 1)
	go func() { leaderDone <- leader() }()
	a.send.passSlot()
	if err := member()[0]; !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("member: %v, want its ctx's deadline", err)
	}
	select {
	case errs := <-leaderDone:
		t.Fatalf("the leader's batch ended (%v) before its member returned: the member waited for it", errs)
	default:
	}
	<-leaderDone // the publish timeout
}
