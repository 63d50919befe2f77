package auth

import (
	"context"
	"errors"
	"sync"

	"github.com/nats-io/nats.go"

	"github.com/agentmesh-io/agentmesh/agentkit/permission"
)

// ErrPermissionDenied is [permission.ErrDenied], the one sentinel of a
// refused subject that agentkit's sends match too.
var ErrPermissionDenied = permission.ErrDenied

// PermissionError is a server's permissions violation, as
// [permission.Parse] reads it from the asynchronous error nats.go reports.
type PermissionError = permission.Error

// watcherKeep is how many violations a Watcher remembers.
const watcherKeep = 64

// Watcher collects a connection's permissions violations, which nats.go
// reports only to the connection's asynchronous error handler, and lets
// callers wait for them: [Watcher.Guard] makes an operation that would
// otherwise time out on a denied publish fail at once with a
// [*PermissionError]. Install it when connecting with [Watcher.Option].
// All methods are safe for concurrent use.
type Watcher struct {
	next nats.ErrHandler

	mu      sync.Mutex
	seq     uint64             // violations seen
	recent  []*PermissionError // the last watcherKeep
	changed chan struct{}      // closed and replaced on every violation
}

// NewWatcher returns a Watcher that passes every error, violations
// included, on to next (nil: nothing).
func NewWatcher(next nats.ErrHandler) *Watcher {
	return &Watcher{next: next, changed: make(chan struct{})}
}

// Option returns the nats.ErrorHandler option that feeds w.
func (w *Watcher) Option() nats.Option { return nats.ErrorHandler(w.Handle) }

// Handle is the nats.ErrHandler: it records permissions violations and
// passes every error on. It is fast and does not block.
func (w *Watcher) Handle(nc *nats.Conn, sub *nats.Subscription, err error) {
	if pe, ok := permission.Parse(err); ok {
		w.mu.Lock()
		w.seq++
		w.recent = append(w.recent, pe)
		if len(w.recent) > watcherKeep {
			w.recent = w.recent[len(w.recent)-watcherKeep:]
		}
		close(w.changed)
		w.changed = make(chan struct{})
		w.mu.Unlock()
	}
	if w.next != nil {
		w.next(nc, sub, err)
	}
}

// Count returns how many violations w has seen.
func (w *Watcher) Count() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.seq
}

// Recent returns the last violations seen (at most 64), oldest first.
func (w *Watcher) Recent() []*PermissionError {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]*PermissionError(nil), w.recent...)
}

// Wait returns the first violation after the count'th that satisfies
// match (nil: any), waiting for it until ctx ends. Use Wait(ctx,
// w.Count(), ...) taken before an operation to wait for a violation that
// operation causes.
func (w *Watcher) Wait(ctx context.Context, count uint64, match func(*PermissionError) bool) (*PermissionError, error) {
	for {
		w.mu.Lock()
		// recent[i] is violation number seq-len(recent)+i+1.
		first := w.seq - uint64(len(w.recent))
		for i, pe := range w.recent {
			if first+uint64(i)+1 > count && (match == nil || match(pe)) {
				w.mu.Unlock()
				return pe, nil
			}
		}
		count = max(count, w.seq)
		ch := w.changed
		w.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// Guard runs fn with a context that is cancelled as soon as the
// connection reports a permissions violation, and returns fn's error
// joined with that violation, so a send the server refuses fails at once
// with an error matching ErrPermissionDenied (and naming the subject)
// instead of waiting out its timeout. Without a violation it returns fn's
// error unchanged.
//
// The connection's violations are not tied to a call: a violation caused
// by another goroutine sharing the connection also cancels fn. Guard
// suits connections used by one agent, where any denial is a
// configuration error worth failing fast on.
func (w *Watcher) Guard(ctx context.Context, fn func(ctx context.Context) error) error {
	start := w.Count()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		denied *PermissionError
		wg     sync.WaitGroup
	)
	wg.Go(func() {
		pe, err := w.Wait(ctx, start, nil)
		if err == nil {
			denied = pe
			cancel()
		}
	})
	err := fn(ctx)
	cancel()
	wg.Wait()
	if denied == nil {
		// A violation may have landed between fn returning and cancel.
		if err == nil {
			return nil
		}
		w.mu.Lock()
		late := w.seq > start
		w.mu.Unlock()
		if !late {
			return err
		}
		denied, _ = w.Wait(context.Background(), start, nil)
	}
	return errors.Join(denied, err)
}
