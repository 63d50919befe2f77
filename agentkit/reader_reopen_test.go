package agentkit_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// asyncErrors records what an agent reports to its error handler, and when.
type asyncErrors struct {
	mu  sync.Mutex
	got []error
	at  []time.Time
}

func (e *asyncErrors) add(err error) {
	e.mu.Lock()
	e.got = append(e.got, err)
	e.at = append(e.at, time.Now())
	e.mu.Unlock()
}

// times returns when each of the reported errors that are target came.
func (e *asyncErrors) times(target error) []time.Time {
	e.mu.Lock()
	defer e.mu.Unlock()
	var at []time.Time
	for i, err := range e.got {
		if errors.Is(err, target) {
			at = append(at, e.at[i])
		}
	}
	return at
}

// count returns how many of the reported errors are target.
func (e *asyncErrors) count(target error) int { return len(e.times(target)) }

// reopenPolicy is a normal-priority policy whose pull requests live 2s,
// so a reader pulling from a missing consumer reports missing heartbeats
// every 2s; adaptive ones end an iterator every generation.
func reopenPolicy(adaptive bool) agentkit.DeliveryPolicy {
	pol := fastPolicy(time.Second, time.Second)
	if adaptive {
		pol.Prefetch, pol.MaxPrefetch = 1, 64
	}
	return pol
}

// reopenRig is agent "recv" on its own mesh with what its reader tests
// need: its handled messages and async errors, and an administrator's
// JetStream context and recv's normal consumer config.
type reopenRig struct {
	m    *mesh
	recv *agentkit.Agent
	rec  *recorder
	errs *asyncErrors
	js   jetstream.JetStream
	cfg  jetstream.ConsumerConfig
}

// startReopen starts "recv" with pol at normal priority.
func startReopen(t *testing.T, pol agentkit.DeliveryPolicy) *reopenRig {
	t.Helper()
	r := &reopenRig{m: newMesh(t), rec: &recorder{}, errs: &asyncErrors{}}
	r.recv = r.m.started("recv", map[string]agentkit.HandlerFunc{"work": r.rec.handle(nil)},
		agentkit.WithPolicy(wire.PriorityNormal, pol), agentkit.WithErrorHandler(r.errs.add))
	var err error
	if r.js, err = jetstream.New(r.m.conn()); err != nil {
		t.Fatal(err)
	}
	if r.cfg, err = agentkit.ConsumerConfig(subjects.Default, "recv", wire.PriorityNormal, pol); err != nil {
		t.Fatal(err)
	}
	return r
}

// rejectPulls has the server answer every pull request of recv's normal
// consumer with 400, which ends the iterator: the consumer is recreated
// with a priority group, as an administrator might.
func (r *reopenRig) rejectPulls(t *testing.T) {
	t.Helper()
	grouped := r.cfg
	grouped.PriorityGroups, grouped.PriorityPolicy = []string{"pinned-elsewhere"}, jetstream.PriorityPolicyOverflow
	replaceConsumer(t, r.js, grouped)
}

// replaceConsumer deletes the consumer of cfg and creates it as cfg says,
// as an administrator would.
func replaceConsumer(t *testing.T, js jetstream.JetStream, cfg jetstream.ConsumerConfig) {
	t.Helper()
	if err := js.DeleteConsumer(ctx(t), subjects.Default.Stream(), cfg.Durable); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateOrUpdateConsumer(ctx(t), subjects.Default.Stream(), cfg); err != nil {
		t.Fatal(err)
	}
}

// eachHandledOnce waits until rec handled n messages and checks none twice.
func eachHandledOnce(t *testing.T, rec *recorder, n int) {
	t.Helper()
	eventually(t, 15*time.Second, "every message handled", func() bool { return rec.count() >= n })
	if ids := rec.ids(); len(ids) != n || rec.count() != n {
		t.Fatalf("handled %d messages, %d distinct; want %d once each", rec.count(), len(ids), n)
	}
}

// A reader whose consumer is deleted keeps reading, and says so while the
// consumer is missing: once an administrator creates it again, the
// messages sent meanwhile are handled, each once. A fixed policy's reader
// used to end with the iterator the server closed, after one error.
func TestReader_ResumesWhenItsConsumerIsRecreated(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		adaptive bool
	}{{"fixed", false}, {"adaptive", true}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := startReopen(t, reopenPolicy(tc.adaptive))
			sender := r.m.agent("sender")
			sendN(t, sender, "work", 1)
			eventually(t, 5*time.Second, "the first message handled", func() bool { return r.rec.count() == 1 })

			if err := r.js.DeleteConsumer(ctx(t), subjects.Default.Stream(), r.cfg.Durable); err != nil {
				t.Fatal(err)
			}
			sendN(t, sender, "work", 3)
			// Still pulling, and visibly so: nothing answers. (A pull
			// request pending at the deletion also reports the deletion.)
			eventually(t, 10*time.Second, "the missing consumer reported", func() bool { return r.errs.count(jetstream.ErrNoHeartbeat) > 0 })
			if err := r.recv.Err(); err == nil {
				t.Error("Err() = nil while the reader's consumer is missing")
			}

			if _, err := r.js.CreateOrUpdateConsumer(ctx(t), subjects.Default.Stream(), r.cfg); err != nil {
				t.Fatal(err)
			}
			// The new consumer delivers the first message again: the
			// agent remembers handling it.
			eachHandledOnce(t, r.rec, 4)
			if err := r.recv.Err(); err != nil {
				t.Errorf("Err() = %v once the reader reads again", err)
			}
		})
	}
}

// A server that rejects every pull request (the consumer was recreated
// with a priority group: each pull is answered 400, which ends the
// iterator) neither makes the reader spin nor silences it: each rejection
// is reported, with pauses growing between them, and once the consumer is
// fixed the reader resumes. It used to reopen at once, reporting tens of
// thousands of rejections a second.
func TestReader_BacksOffWhileTheServerRejectsPulls(t *testing.T) {
	t.Parallel()
	r := startReopen(t, reopenPolicy(true))
	r.rejectPulls(t)
	sendN(t, r.m.agent("sender"), "work", 3)
	eventually(t, 10*time.Second, "rejections reported", func() bool { return r.errs.count(jetstream.ErrBadRequest) >= 4 })
	// Before the 4th rejection the reader paused at least 200ms (400ms,
	// less up to half for jitter); a reader reopening at once takes a
	// round trip.
	if at := r.errs.times(jetstream.ErrBadRequest); at[3].Sub(at[2]) < 100*time.Millisecond {
		t.Fatalf("rejections %v apart: the reader did not back off", at[3].Sub(at[2]))
	}

	replaceConsumer(t, r.js, r.cfg)
	eachHandledOnce(t, r.rec, 3)
}

// Drain is not held up by a reader pausing before it reopens: the pause
// ends with the source.
func TestReader_DrainEndsTheReopenPause(t *testing.T) {
	t.Parallel()
	r := startReopen(t, reopenPolicy(true))
	r.rejectPulls(t)
	// After the 6th rejection the reader pauses at least 1.6s (3.2s, less
	// up to half for jitter).
	eventually(t, 20*time.Second, "six rejections reported", func() bool { return r.errs.count(jetstream.ErrBadRequest) >= 6 })
	c, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := r.recv.Drain(c); err != nil {
		t.Fatalf("Drain: %v", err)
	}
}
