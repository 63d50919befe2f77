package agentkit

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/agentmesh-io/agentmesh/agentkit/wire"
)

// ErrTaskRecordDropped is reported to the error handler for an acked
// task.* message the agent did not record in its task's state: the
// tracker's queue was full (the state bucket is slower than the messages
// come), or Stop or Drain ended before its turn. [Stats] counts them.
var ErrTaskRecordDropped = errors.New("agentkit: task record dropped")

// taskQueueDepth is how many acked task messages may wait for their
// record. A full queue drops records instead of holding up the workers.
const taskQueueDepth = 1024

// WithTaskTracking says whether the agent records the task.* messages it
// acks in their task's state (true, the default; see [Agent.State]). The
// record is written after the message is acked and its ACK envelope sent,
// by a goroutine of the agent's own, never by a handler's worker: a task
// message costs its sender no more than any other. Turn it off when
// nothing reads the task state, or when the agent may not write mesh_state.
func WithTaskTracking(on bool) Option {
	return optionFunc(func(o *options) error { o.noTaskTracking = !on; return nil })
}

// taskTracker writes the task records of acked messages in the order they
// were acked, on one goroutine, off the handlers' workers.
type taskTracker struct {
	queue   chan *wire.Envelope
	quit    chan struct{} // closed when what is queued must be dropped
	done    sync.WaitGroup
	dropped atomic.Uint64
}

// startTracker starts the agent's task tracker, unless tracking is off.
func (a *Agent) startTracker() {
	if a.opts.noTaskTracking {
		return
	}
	t := &a.tracker
	t.queue, t.quit = make(chan *wire.Envelope, taskQueueDepth), make(chan struct{})
	t.done.Go(func() {
		for env := range t.queue {
			select {
			case <-t.quit:
				a.dropTaskRecord(env, "the agent stopped first")
				continue
			default:
			}
			a.trackTask(env)
		}
	})
}

// queueTask hands an acked message to the tracker if it may be a task's.
// It never blocks: with the queue full, the record is dropped.
func (a *Agent) queueTask(env *wire.Envelope) {
	t := &a.tracker
	if t.queue == nil || !strings.HasPrefix(env.Action, "task.") {
		return
	}
	select {
	case t.queue <- env:
	default:
		a.dropTaskRecord(env, fmt.Sprintf("%d records wait for the state bucket", taskQueueDepth))
	}
}

// dropTaskRecord reports env, whose task record is not written, and why.
func (a *Agent) dropTaskRecord(env *wire.Envelope, why string) {
	a.tracker.dropped.Add(1)
	a.asyncError(fmt.Errorf("%w: %s %s of %s: %s", ErrTaskRecordDropped, env.Action, env.MessageID, a.id, why))
}

// stopTracker writes the records still queued, once the workers have
// stopped (nothing queues any more), until ctx ends; what is left then is
// dropped. It returns when the tracker's goroutine has: a record being
// written finishes first, within the publish timeout.
func (a *Agent) stopTracker(ctx context.Context) {
	t := &a.tracker
	if t.queue == nil {
		return
	}
	close(t.queue)
	stop := context.AfterFunc(ctx, func() { close(t.quit) })
	t.done.Wait()
	stop()
}
