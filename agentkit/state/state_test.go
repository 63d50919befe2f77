package state_test

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/agentkit/protocol"
	"github.com/agentmesh-io/agentmesh/agentkit/state"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/internal/jsontest"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// sharedState opens the shared state of m's server on a new connection.
func (m *mesh) sharedState() *state.State {
	m.t.Helper()
	js, err := jetstream.New(m.conn())
	if err != nil {
		m.t.Fatal(err)
	}
	s, err := state.Open(ctx(m.t), js, subjects.Default, 1, true)
	if err != nil {
		m.t.Fatalf("Open: %v", err)
	}
	return s
}

type stateCounter struct {
	N int `json:"n"`
}

func TestState_CreateGetDelete(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	s := m.sharedState()
	c := ctx(t)

	if _, err := s.Get(c, state.EntityAgent, "a1"); !errors.Is(err, state.ErrNotFound) {
		t.Fatalf("Get of missing entry: %v, want ErrNotFound", err)
	}
	rev, err := s.Create(c, state.EntityAgent, "a1", map[string]string{"state": "IDLE"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Create(c, state.EntityAgent, "a1", map[string]string{"state": "BUSY"}); !errors.Is(err, state.ErrExists) {
		t.Fatalf("second Create: %v, want ErrExists", err)
	}
	e, err := s.Get(c, state.EntityAgent, "a1")
	if err != nil {
		t.Fatal(err)
	}
	if e.Kind != state.EntityAgent || e.ID != "a1" || e.Revision != rev || string(e.Value) != `{"state":"IDLE"}` || e.Updated.IsZero() {
		t.Fatalf("Get = %+v (value %s), want revision %d and the created value", e, e.Value, rev)
	}
	// The same id under another kind is another entry.
	if _, err := s.Get(c, state.EntityTask, "a1"); !errors.Is(err, state.ErrNotFound) {
		t.Fatalf("Get of other kind: %v, want ErrNotFound", err)
	}

	if err := s.Delete(c, state.EntityAgent, "a1"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(c, state.EntityAgent, "a1"); !errors.Is(err, state.ErrNotFound) {
		t.Fatalf("Get after Delete: %v, want ErrNotFound", err)
	}
	if err := s.Delete(c, state.EntityAgent, "a1"); !errors.Is(err, state.ErrNotFound) {
		t.Fatalf("second Delete: %v, want ErrNotFound", err)
	}
	// A deleted entry can be created again.
	if _, err := s.Create(c, state.EntityAgent, "a1", map[string]string{"state": "BUSY"}); err != nil {
		t.Fatalf("Create after Delete: %v", err)
	}

	// The key layout is part of the contract: <kind>.<id> in mesh_state.
	js, err := jetstream.New(m.conn())
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(c, "mesh_state")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Get(c, "agent.a1"); err != nil {
		t.Fatalf("key agent.a1: %v", err)
	}
	st, err := kv.Status(c)
	if err != nil {
		t.Fatal(err)
	}
	if st.History() != 16 {
		t.Errorf("bucket history = %d, want 16", st.History())
	}

	// A second Open binds to the existing bucket.
	if s2 := m.sharedState(); s2 == nil {
		t.Fatal("nil State")
	}
}

func TestState_InvalidArguments(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	s := m.sharedState()
	c := ctx(t)
	for _, tt := range []struct {
		name    string
		kind    state.EntityKind
		id      string
		wantErr error
	}{
		{name: "dot", kind: state.EntityTask, id: "a.b", wantErr: state.ErrInvalidID},
		{name: "wildcard", kind: state.EntityTask, id: "*", wantErr: state.ErrInvalidID},
		{name: "empty", kind: state.EntityTask, id: "", wantErr: state.ErrInvalidID},
		{name: "space", kind: state.EntityTask, id: "a b", wantErr: state.ErrInvalidID},
		{name: "too long", kind: state.EntityTask, id: strings.Repeat("a", 65), wantErr: state.ErrInvalidID},
		{name: "unknown kind", kind: "JOB", id: "t1", wantErr: state.ErrInvalid},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := s.Get(c, tt.kind, tt.id); !errors.Is(err, tt.wantErr) {
				t.Errorf("Get: %v, want %v", err, tt.wantErr)
			}
			if _, err := s.Create(c, tt.kind, tt.id, 1); !errors.Is(err, tt.wantErr) {
				t.Errorf("Create: %v, want %v", err, tt.wantErr)
			}
			if _, err := s.Update(c, tt.kind, tt.id, func(json.RawMessage) (any, error) { return 1, nil }); !errors.Is(err, tt.wantErr) {
				t.Errorf("Update: %v, want %v", err, tt.wantErr)
			}
			if err := s.Delete(c, tt.kind, tt.id); !errors.Is(err, tt.wantErr) {
				t.Errorf("Delete: %v, want %v", err, tt.wantErr)
			}
		})
	}
	if _, err := s.Task(c, "t.1"); !errors.Is(err, state.ErrInvalidID) {
		t.Errorf("Task: %v, want ErrInvalidID", err)
	}
	if _, err := s.UpdateTask(c, "t>", func(*state.TaskState) error { return nil }); !errors.Is(err, state.ErrInvalidID) {
		t.Errorf("UpdateTask: %v, want ErrInvalidID", err)
	}
	if _, err := s.Watch(c, "JOB"); !errors.Is(err, state.ErrInvalid) {
		t.Errorf("Watch: %v, want ErrInvalid", err)
	}
	if _, err := state.Open(c, nil, subjects.Default, 1, true); !errors.Is(err, state.ErrInvalid) {
		t.Errorf("Open(nil js): %v, want ErrInvalid", err)
	}
	js, err := jetstream.New(m.conn())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := state.Open(c, js, subjects.Default, -1, true); !errors.Is(err, state.ErrInvalid) {
		t.Errorf("Open(replicas -1): %v, want ErrInvalid", err)
	}
}

// incrementCounter adds one to the counter of kind/id through Update.
func incrementCounter(c context.Context, s *state.State, id string) error {
	_, err := s.Update(c, state.EntityResource, id, func(old json.RawMessage) (any, error) {
		var v stateCounter
		if old != nil {
			if err := json.Unmarshal(old, &v); err != nil {
				return nil, err
			}
		}
		v.N++
		return v, nil
	})
	return err
}

func TestState_UpdateRacingWritersLoseNothing(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	c := ctx(t)
	shared := m.sharedState()
	for _, tt := range []struct {
		name    string
		id      string
		writers []*state.State
	}{
		// Two goroutines on one State, then two States on two connections.
		{name: "one State", id: "c1", writers: []*state.State{shared, shared}},
		{name: "two connections", id: "c2", writers: []*state.State{m.sharedState(), m.sharedState()}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			id := tt.id
			const perWriter = 50
			var wg sync.WaitGroup
			errs := make(chan error, len(tt.writers)*perWriter)
			start := make(chan struct{})
			for _, s := range tt.writers {
				wg.Go(func() {
					<-start
					for range perWriter {
						errs <- incrementCounter(c, s, id)
					}
				})
			}
			close(start)
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Fatalf("Update: %v", err)
				}
			}
			e, err := shared.Get(c, state.EntityResource, id)
			if err != nil {
				t.Fatal(err)
			}
			var v stateCounter
			if err := e.Decode(&v); err != nil {
				t.Fatal(err)
			}
			if want := len(tt.writers) * perWriter; v.N != want {
				t.Fatalf("counter = %d after %d increments: updates were lost", v.N, want)
			}
		})
	}
}

func TestState_UpdateFnErrorAborts(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	s := m.sharedState()
	c := ctx(t)
	boom := errors.New("boom")
	_, err := s.Update(c, state.EntityPolicy, "p1", func(old json.RawMessage) (any, error) {
		if old != nil {
			t.Errorf("old = %s, want nil for a missing entry", old)
		}
		return nil, boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("Update: %v, want the fn's error", err)
	}
	if _, err := s.Get(c, state.EntityPolicy, "p1"); !errors.Is(err, state.ErrNotFound) {
		t.Fatalf("Get after aborted Update: %v, want ErrNotFound", err)
	}

	policy := state.PolicyState{Version: "1", EnabledChains: []string{"review"}, BudgetLimits: state.PolicyBudgetLimits{Total: 10}}
	e, err := s.Update(c, state.EntityPolicy, "p1", func(json.RawMessage) (any, error) { return policy, nil })
	if err != nil {
		t.Fatal(err)
	}
	got, err := s.Get(c, state.EntityPolicy, "p1")
	if err != nil {
		t.Fatal(err)
	}
	if got.Revision != e.Revision || string(got.Value) != string(e.Value) {
		t.Fatalf("Get = rev %d %s, Update returned rev %d %s", got.Revision, got.Value, e.Revision, e.Value)
	}
}

// nextChange receives one change or fails after 10s.
func nextChange(t *testing.T, ch <-chan state.StateChange) state.StateChange {
	t.Helper()
	select {
	case c, ok := <-ch:
		if !ok {
			t.Fatal("watch channel closed")
		}
		return c
	case <-time.After(10 * time.Second):
		t.Fatal("no state change within 10s")
	}
	return state.StateChange{}
}

func TestState_Watch(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	s := m.sharedState()
	c := ctx(t)

	// Existing values are not replayed, and an existing key's first put
	// seen by the watch is an UPDATE.
	if _, err := s.Create(c, state.EntityTask, "old", stateCounter{N: 1}); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(c)
	tasks, err := s.Watch(wctx, state.EntityTask)
	if err != nil {
		t.Fatal(err)
	}
	all, err := s.Watch(wctx)
	if err != nil {
		t.Fatal(err)
	}

	r1, err := s.Create(c, state.EntityTask, "t1", stateCounter{N: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Create(c, state.EntityAgent, "a1", stateCounter{N: 7}); err != nil { // filtered out of tasks
		t.Fatal(err)
	}
	e2, err := s.Update(c, state.EntityTask, "t1", func(json.RawMessage) (any, error) { return stateCounter{N: 2}, nil })
	if err != nil {
		t.Fatal(err)
	}
	e3, err := s.Update(c, state.EntityTask, "old", func(json.RawMessage) (any, error) { return stateCounter{N: 2}, nil })
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(c, state.EntityTask, "t1"); err != nil {
		t.Fatal(err)
	}
	r5, err := s.Create(c, state.EntityTask, "t1", stateCounter{N: 3}) // after a delete: CREATE again
	if err != nil {
		t.Fatal(err)
	}

	want := []struct {
		op    string
		id    string
		value string
	}{
		{state.ChangeCreate, "t1", `{"n":1}`},
		{state.ChangeUpdate, "t1", `{"n":2}`},
		{state.ChangeUpdate, "old", `{"n":2}`},
		{state.ChangeDelete, "t1", ``},
		{state.ChangeCreate, "t1", `{"n":3}`},
	}
	var last uint64
	for i, w := range want {
		got := nextChange(t, tasks)
		if got.Operation != w.op || got.Kind != state.EntityTask || got.ID != w.id || string(got.Value) != w.value {
			t.Fatalf("change %d = %s %s %s %s, want %s TASK %s %s", i, got.Operation, got.Kind, got.ID, got.Value, w.op, w.id, w.value)
		}
		if got.Revision <= last || got.Timestamp.IsZero() {
			t.Fatalf("change %d: revision %d after %d, timestamp %v", i, got.Revision, last, got.Timestamp)
		}
		last = got.Revision
		switch i {
		case 0:
			if got.Revision != r1 {
				t.Errorf("CREATE revision %d, Create returned %d", got.Revision, r1)
			}
		case 1:
			if got.Revision != e2.Revision {
				t.Errorf("UPDATE revision %d, Update returned %d", got.Revision, e2.Revision)
			}
		case 2:
			if got.Revision != e3.Revision {
				t.Errorf("UPDATE revision %d, Update returned %d", got.Revision, e3.Revision)
			}
		case 4:
			if got.Revision != r5 {
				t.Errorf("re-CREATE revision %d, Create returned %d", got.Revision, r5)
			}
		}
	}

	// The unfiltered watch sees the agent entry too, between the two task changes.
	var kinds []state.EntityKind
	for range 6 {
		kinds = append(kinds, nextChange(t, all).Kind)
	}
	if kinds[1] != state.EntityAgent {
		t.Errorf("unfiltered watch kinds = %v, want AGENT second", kinds)
	}

	// The change encodes as the protocol's StateUpdate.
	b, err := json.Marshal(state.StateChange{Operation: state.ChangeCreate, Kind: state.EntityTask, ID: "t1", Value: json.RawMessage(`{}`), Revision: 1})
	if err != nil {
		t.Fatal(err)
	}
	jsontest.Keys(t, b, "operation", "entity_type", "entity_id", "changes", "version", "timestamp")

	cancel()
	for _, ch := range []<-chan state.StateChange{tasks, all} {
		eventually(t, 10*time.Second, "watch channel closed after cancel", func() bool {
			select {
			case _, ok := <-ch:
				return !ok
			default:
				return false
			}
		})
	}
}

func TestState_UpdateTask(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	s := m.sharedState()
	c := ctx(t)

	if _, err := s.Task(c, "t1"); !errors.Is(err, state.ErrNotFound) {
		t.Fatalf("Task of a missing task: %v, want ErrNotFound", err)
	}
	created, err := s.UpdateTask(c, "t1", func(ts *state.TaskState) error {
		if ts.ID != "t1" || ts.Status != protocol.TaskPending || ts.CreatedAt.IsZero() {
			t.Errorf("new task = %+v, want pending t1 with CreatedAt", ts)
		}
		ts.Context = &protocol.TaskContext{TaskID: "t1", TaskType: "analysis", Priority: wire.PriorityHigh}
		ts.History = append(ts.History, protocol.TaskEvent{EventType: "created", AgentID: "planner", Timestamp: time.Now()})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	// Two writers append history concurrently: both events land.
	var wg sync.WaitGroup
	for _, agent := range []string{"exec_a", "exec_b"} {
		wg.Go(func() {
			for i := range 10 {
				_, err := s.UpdateTask(c, "t1", func(ts *state.TaskState) error {
					ts.Status = protocol.TaskInProgress
					ts.AssignedAgent = agent
					ts.History = append(ts.History, protocol.TaskEvent{EventType: "progress", AgentID: agent, Details: map[string]any{"i": i}})
					return nil
				})
				if err != nil {
					t.Errorf("UpdateTask: %v", err)
				}
			}
		})
	}
	wg.Wait()

	done, err := s.UpdateTask(c, "t1", func(ts *state.TaskState) error {
		ts.ID = "renamed" // restored by UpdateTask
		ts.Status = protocol.TaskCompleted
		ts.Result = json.RawMessage(`{"ok":true}`)
		ts.History = append(ts.History, protocol.TaskEvent{EventType: "completed"})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	got, err := s.Task(c, "t1")
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != "t1" || got.Status != protocol.TaskCompleted || string(got.Result) != `{"ok":true}` || !got.Status.Terminal() {
		t.Fatalf("Task = %+v", got)
	}
	if !got.CreatedAt.Equal(created.CreatedAt) || !got.UpdatedAt.Equal(done.UpdatedAt) || got.UpdatedAt.Before(got.CreatedAt) {
		t.Errorf("CreatedAt %v UpdatedAt %v, want created %v updated %v", got.CreatedAt, got.UpdatedAt, created.CreatedAt, done.UpdatedAt)
	}
	if len(got.History) != 22 || got.History[0].EventType != "created" || got.History[21].EventType != "completed" {
		t.Fatalf("history has %d events (%v), want created, 20 progress, completed", len(got.History), got.History)
	}
	perAgent := map[string]int{}
	for _, ev := range got.History[1:21] {
		perAgent[ev.AgentID]++
	}
	if perAgent["exec_a"] != 10 || perAgent["exec_b"] != 10 {
		t.Errorf("progress events per agent = %v, want 10 each", perAgent)
	}

	// An invalid status is refused and nothing is written.
	if _, err := s.UpdateTask(c, "t1", func(ts *state.TaskState) error { ts.Status = "done"; return nil }); !errors.Is(err, state.ErrInvalid) {
		t.Fatalf("UpdateTask with status done: %v, want ErrInvalid", err)
	}
	// fn's error aborts.
	boom := errors.New("boom")
	if _, err := s.UpdateTask(c, "t1", func(*state.TaskState) error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("UpdateTask: %v, want fn's error", err)
	}
	again, err := s.Task(c, "t1")
	if err != nil {
		t.Fatal(err)
	}
	if again.Status != protocol.TaskCompleted || !again.UpdatedAt.Equal(got.UpdatedAt) {
		t.Errorf("task changed by refused updates: %+v", again)
	}

	// The stored JSON uses the protocol's TaskState names.
	e, err := s.Get(c, state.EntityTask, "t1")
	if err != nil {
		t.Fatal(err)
	}
	jsontest.Keys(t, e.Value, "id", "status", "assigned_agent", "created_at", "updated_at", "context", "result", "history")
}

func TestState_EnumsValid(t *testing.T) {
	t.Parallel()
	for _, k := range state.EntityKinds {
		if !k.Valid() {
			t.Errorf("%s not valid", k)
		}
	}
	for _, s := range protocol.TaskStatuses {
		if !s.Valid() {
			t.Errorf("%s not valid", s)
		}
	}
	if state.EntityKind("task").Valid() || protocol.TaskStatus("PENDING").Valid() || protocol.TaskPending.Terminal() {
		t.Error("wrong spelling accepted, or pending terminal")
	}
}

// TestState_JSONFieldNames checks the field names of the shared state's
// entities, the protocol payloads they embed included, and
// that they survive a round trip.
func TestState_JSONFieldNames(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 1, 10, 14, 30, 0, 0, time.UTC)
	later := at.Add(time.Hour)
	taskCtx := protocol.TaskContext{TaskID: "t1", TaskType: "analysis", Priority: wire.PriorityHigh, Metadata: map[string]any{"k": "v"}, Dependencies: []string{"t0"}, History: []protocol.TaskEvent{{Timestamp: at, EventType: "created", AgentID: "a", Details: map[string]any{"x": "y"}}}}
	report := protocol.ErrorReport{ErrorID: "e1", AgentID: "a", TaskID: "t1", ErrorType: protocol.ErrorTypeTimeout, Severity: protocol.SeverityHigh, Message: "slow",
		StackTrace: "main.go:1", Context: map[string]any{"input_data": "x", "configuration": "y", "environment": "z"},
		RecoveryAttempts: []protocol.RecoveryAttempt{{AttemptNumber: 1, Timestamp: at, Strategy: "retry", Outcome: protocol.RecoveryFailure, Details: "again"}},
		SuggestedActions: []string{"raise timeout"}}
	taskContextKeys := []string{"task_id", "task_type", "priority", "metadata", "dependencies", "history"}
	taskEventKeys := []string{"timestamp", "event_type", "agent_id", "details"}
	for _, tt := range []struct {
		name   string
		give   any
		keys   []string
		nested map[string][]string // member → its keys (first element of arrays)
	}{
		{
			name: "TaskState",
			give: state.TaskState{ID: "t1", Status: protocol.TaskFailed, AssignedAgent: "a", CreatedAt: at, UpdatedAt: later, Context: &taskCtx,
				Result: json.RawMessage(`1`), Error: &report, History: taskCtx.History},
			keys:   []string{"id", "status", "assigned_agent", "created_at", "updated_at", "context", "result", "error", "history"},
			nested: map[string][]string{"context": taskContextKeys, "history": taskEventKeys},
		},
		{
			name: "ResourceAllocation",
			give: state.ResourceAllocation{AgentID: "a", ResourceType: "tokens", Allocated: 10, Consumed: 5, Limit: 20, ExpiresAt: &later},
			keys: []string{"agent_id", "resource_type", "allocated", "consumed", "limit", "expires_at"},
		},
		{
			name: "PolicyState",
			give: state.PolicyState{Version: "1", EnabledChains: []string{"c"}},
			keys: []string{"version", "enabled_chains", "risk_thresholds", "budget_limits", "circuit_breaker_config"},
			nested: map[string][]string{
				"risk_thresholds":        {"low", "high"},
				"budget_limits":          {"per_task", "per_agent", "total"},
				"circuit_breaker_config": {"error_threshold", "timeout_ms", "reset_timeout_ms"},
			},
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b := jsontest.Marshal(t, tt.give)
			jsontest.Keys(t, b, tt.keys...)
			for member, keys := range tt.nested {
				jsontest.Keys(t, jsontest.Member(t, b, member), keys...)
			}
			// Round trip: decoding and encoding again gives the same JSON.
			back := reflect.New(reflect.TypeOf(tt.give))
			if err := json.Unmarshal(b, back.Interface()); err != nil {
				t.Fatal(err)
			}
			if again := jsontest.Marshal(t, back.Elem().Interface()); string(again) != string(b) {
				t.Errorf("round trip changed the JSON\n got %s\nwant %s", again, b)
			}
		})
	}
}

// TestEntityKinds_Valid checks the entity kinds and that each
// is Valid.
func TestEntityKinds_Valid(t *testing.T) {
	t.Parallel()
	var got []string
	for _, k := range state.EntityKinds {
		got = append(got, string(k))
		if !k.Valid() {
			t.Errorf("EntityKinds %s not Valid", k)
		}
	}
	if want := []string{"TASK", "AGENT", "RESOURCE", "POLICY"}; !slices.Equal(got, want) {
		t.Errorf("EntityKinds = %v, want %v", got, want)
	}
}
