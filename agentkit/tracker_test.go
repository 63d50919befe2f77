package agentkit_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/protocol"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// errLog collects what an agent's error handler hears.
type errLog struct {
	mu   sync.Mutex
	errs []error
}

func (l *errLog) handle(err error) { l.mu.Lock(); l.errs = append(l.errs, err); l.mu.Unlock() }

// count returns how many errors match target (nil: all).
func (l *errLog) count(target error) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, err := range l.errs {
		if target == nil || errors.Is(err, target) {
			n++
		}
	}
	return n
}

// unackedState creates the state bucket with a stream that stores writes
// but never acknowledges them: every write waits out its publish timeout.
func unackedState(t *testing.T, m *mesh) {
	t.Helper()
	js, err := jetstream.New(m.conn())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateKeyValue(ctx(t), jetstream.KeyValueConfig{Bucket: subjects.Default.StateBucket(), History: 16}); err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx(t), "KV_"+subjects.Default.StateBucket())
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.NoAck = true
	if _, err := js.UpdateStream(ctx(t), cfg); err != nil {
		t.Fatal(err)
	}
}

// taskUpdate sends a task.update of task with SendAndWait.
func taskUpdate(t *testing.T, from *agentkit.Agent, to, task string) {
	t.Helper()
	if _, err := from.SendAndWait(ctx(t), to, protocol.ActionTaskUpdate, protocol.TaskUpdate{TaskID: task, Status: protocol.TaskInProgress, Progress: 0.5},
		agentkit.WithTaskID(task)); err != nil {
		t.Fatal(err)
	}
}

// The ACK of a task message reaches its sender while the task's record
// is still being written: here the state bucket never acknowledges the
// write, which waits out the publish timeout, and the ACK comes first.
// The record is stored all the same.
func TestTaskTracking_AckBeforeRecord(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	unackedState(t, m)
	errs := &errLog{}
	noop := func(context.Context, *agentkit.Message) error { return nil }
	m.started("worker", map[string]agentkit.HandlerFunc{protocol.ActionTaskUpdate: noop}, agentkit.WithRegistration(false),
		agentkit.WithErrorHandler(errs.handle), agentkit.WithPublishTimeout(5*time.Second))
	orch := m.started("orch", nil, agentkit.WithRegistration(false))
	taskUpdate(t, orch, "worker", "t1")
	if n := errs.count(nil); n != 0 {
		t.Fatalf("the ACK came after the record's write failed: %v", errs.errs)
	}
	state, err := orch.State(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "t1 recorded", func() bool {
		task, err := state.Task(ctx(t), "t1")
		return err == nil && len(task.History) == 1
	})
	eventually(t, 10*time.Second, "the write's missing ack reported", func() bool { return errs.count(nil) > 0 })
}

// Drain returns once the records of the task messages it acked are
// written.
func TestTaskTracking_DrainFlushes(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	noop := func(context.Context, *agentkit.Message) error { return nil }
	worker := m.started("worker", map[string]agentkit.HandlerFunc{protocol.ActionTaskUpdate: noop}, agentkit.WithRegistration(false))
	orch := m.started("orch", nil, agentkit.WithRegistration(false))
	const n = 20
	for i := range n {
		taskUpdate(t, orch, "worker", fmt.Sprintf("t%d", i))
	}
	if err := worker.Drain(ctx(t)); err != nil {
		t.Fatal(err)
	}
	state, err := orch.State(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if task, err := state.Task(ctx(t), fmt.Sprintf("t%d", i)); err != nil || len(task.History) != 1 {
			t.Errorf("t%d after Drain: %+v, %v", i, task, err)
		}
	}
	if d := worker.Stats().TaskRecordsDropped; d != 0 {
		t.Errorf("%d task records dropped", d)
	}
}

// With task tracking off, acked task messages write nothing: the state
// bucket is not even created.
func TestTaskTracking_Off(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	noop := func(context.Context, *agentkit.Message) error { return nil }
	worker := m.started("worker", map[string]agentkit.HandlerFunc{protocol.ActionTaskUpdate: noop},
		agentkit.WithRegistration(false), agentkit.WithTaskTracking(false))
	orch := m.started("orch", nil, agentkit.WithRegistration(false))
	taskUpdate(t, orch, "worker", "t1")
	if err := worker.Drain(ctx(t)); err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(m.conn())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.KeyValue(ctx(t), subjects.Default.StateBucket()); !errors.Is(err, jetstream.ErrBucketNotFound) {
		t.Fatalf("state bucket after a task message with tracking off: %v, want none", err)
	}
}

// When the state bucket falls behind, the workers do not wait for it:
// records beyond the tracker's queue are dropped, counted and reported,
// and so are those Stop leaves unwritten.
func TestTaskTracking_QueueFull(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	unackedState(t, m)
	errs := &errLog{}
	noop := func(context.Context, *agentkit.Message) error { return nil }
	worker := m.started("worker", map[string]agentkit.HandlerFunc{protocol.ActionTaskUpdate: noop}, agentkit.WithRegistration(false),
		agentkit.WithErrorHandler(errs.handle), agentkit.WithPublishTimeout(time.Second))
	orch := m.agent("orch", agentkit.WithRegistration(false))
	const n = 1100 // more than the tracker's queue holds
	envs := make([]*wire.Envelope, n)
	for i := range envs {
		task := fmt.Sprintf("t%d", i)
		e, err := orch.NewRequest(ctx(t), "worker", protocol.ActionTaskUpdate, protocol.TaskUpdate{TaskID: task, Status: protocol.TaskInProgress},
			agentkit.WithTaskID(task), agentkit.WithMessageType(wire.TypeNotification))
		if err != nil {
			t.Fatal(err)
		}
		envs[i] = e
	}
	if err := orch.SendBatch(ctx(t), envs); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "every message acked", func() bool { return worker.Stats().Outcomes[agentkit.OutcomeAck] == n })
	if d := worker.Stats().TaskRecordsDropped; d == 0 {
		t.Fatal("no task record dropped with the queue full")
	}
	worker.Stop()
	d := worker.Stats().TaskRecordsDropped
	if d < n/2 || d > n { // the state bucket takes one a second
		t.Errorf("%d of %d task records dropped", d, n)
	}
	if got := errs.count(agentkit.ErrTaskRecordDropped); uint64(got) != d {
		t.Errorf("%d drops reported, %d counted", got, d)
	}
}
