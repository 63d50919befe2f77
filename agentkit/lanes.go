package agentkit

import (
	"sync"
	"time"
)

// lanes serialises the messages of each task: the reader, which sees a
// consumer's messages in stream order, lets the first message of a task
// through and queues later ones in the task's lane; the worker that
// finishes a message takes the next one of its lane. Different tasks run
// concurrently. A message that is retried (NAK) is redelivered later by
// the broker, so order holds for first deliveries.
type lanes struct {
	mu sync.Mutex
	m  map[laneKey][]*delivery // queued messages; present while a message of the task runs
}

type laneKey struct {
	src  *source
	task string
}

// enter reports whether d may run now; if not, d is queued, and the lane
// keeps it alive.
func (l *lanes) enter(d *delivery) bool {
	k := laneKey{d.src, d.task}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.m == nil {
		l.m = map[laneKey][]*delivery{}
	}
	q, busy := l.m[k]
	if busy {
		l.m[k] = append(q, d)
		return false
	}
	l.m[k] = nil
	return true
}

// leave is called when d's handling is over; it returns the task's next
// message, or nil when the lane is empty (and closes it). The next message
// moves to its source's waiting set, which keeps it alive until its
// handler starts (see receiver.handle).
func (l *lanes) leave(d *delivery) *delivery {
	k := laneKey{d.src, d.task}
	l.mu.Lock()
	defer l.mu.Unlock()
	q := l.m[k]
	if len(q) == 0 {
		delete(l.m, k)
		return nil
	}
	next := q[0]
	q[0] = nil
	l.m[k] = q[1:]
	next.src.waiting.add(next) // before it leaves the lane, so the scanner never misses it
	return next
}

// keepAlive sends InProgress (via progress) for queued messages due one.
func (l *lanes) keepAlive(now time.Time, progress func(*delivery)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, q := range l.m {
		for _, d := range q {
			keepAlive(now, d, progress)
		}
	}
}

// empty reports whether no message is queued in a lane.
func (l *lanes) empty() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, q := range l.m {
		if len(q) > 0 {
			return false
		}
	}
	return true
}

// drop returns every queued message, emptying the lanes.
func (l *lanes) drop() []*delivery {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []*delivery
	for k, q := range l.m {
		out = append(out, q...)
		delete(l.m, k)
	}
	return out
}
