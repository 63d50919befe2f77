package agentkit_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/registry"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// handling records, in the order handlers started, which instance ran
// which message of which task.
type handling struct {
	mu    sync.Mutex
	order []handled
}

type handled struct {
	instance, task string
	n              int
}

func (h *handling) handler(instance string) agentkit.HandlerFunc {
	return func(_ context.Context, msg *agentkit.Message) error {
		var n int
		if err := msg.DecodePayload(&n); err != nil {
			return err
		}
		h.mu.Lock()
		h.order = append(h.order, handled{instance, msg.TaskID, n})
		h.mu.Unlock()
		return nil
	}
}

func (h *handling) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.order)
}

// check fails t unless each of tasks × perTask messages ran exactly once
// and each task's ran in the order sent, across instances; it returns how
// many each instance ran.
func (h *handling) check(t *testing.T, tasks, perTask int) map[string]int {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	next := map[string]int{}
	by := map[string]int{}
	for _, x := range h.order {
		if x.n != next[x.task] {
			t.Fatalf("task %s: message %d ran (on %s) when %d was next: %v", x.task, x.n, x.instance, next[x.task], h.order)
		}
		next[x.task]++
		by[x.instance]++
	}
	for i := range tasks {
		if got := next[fmt.Sprint("t", i)]; got != perTask {
			t.Fatalf("task t%d: %d of %d messages ran", i, got, perTask)
		}
	}
	return by
}

// sendTasks sends messages from to n (excluded) of each of tasks tasks,
// task by task in turn, from one goroutine: the stream holds each task's
// messages in order.
func sendTasks(t *testing.T, sender *agentkit.Agent, tasks, from, to int) {
	t.Helper()
	for n := from; n < to; n++ {
		for i := range tasks {
			if _, err := sender.Send(ctx(t), "worker", "work", n, agentkit.WithTaskID(fmt.Sprint("t", i))); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// startHanging starts an instance of "worker" on a connection of its own
// whose handler hangs until the instance dies, counting the messages it
// took.
func startHanging(t *testing.T, m *mesh, opts ...agentkit.Option) (*nats.Conn, *agentkit.Agent, *atomic.Int32) {
	t.Helper()
	nc := m.conn()
	a, err := agentkit.New(nc, "worker", opts...)
	if err != nil {
		t.Fatal(err)
	}
	var took atomic.Int32
	a.HandleFunc("work", func(ctx context.Context, _ *agentkit.Message) error {
		took.Add(1)
		<-ctx.Done()
		return ctx.Err()
	})
	if err := a.Start(ctx(t)); err != nil {
		t.Fatal(err)
	}
	return nc, a, &took
}

// registryKV returns the registry's bucket on m.
func registryKV(t *testing.T, m *mesh) jetstream.KeyValue {
	t.Helper()
	js, err := jetstream.New(m.conn())
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx(t), subjects.Default.RegistryBucket())
	if err != nil {
		t.Fatal(err)
	}
	return kv
}

// Two instances of one agent take turns: the elder consumes, the other
// stands by and takes over once the elder has drained and stopped, so
// every message runs once and each task's messages run in order across
// both.
func TestTurns_OneInstanceConsumesAtATime(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	var h handling
	a := m.started("worker", map[string]agentkit.HandlerFunc{"work": h.handler("A")}, agentkit.WithConcurrency(4))
	b := m.started("worker", map[string]agentkit.HandlerFunc{"work": h.handler("B")}, agentkit.WithConcurrency(4))
	// Start waits a bounded time for the registry to show an instance its
	// own record; on a loaded machine its turn may be known a little later.
	eventually(t, 10*time.Second, "the elder consumes, the younger stands by", func() bool { return a.Consuming() && !b.Consuming() })
	sender := m.agent("sender")
	const tasks, perTask = 3, 40
	sendTasks(t, sender, tasks, 0, perTask/2)
	eventually(t, 10*time.Second, "the elder handles the first half", func() bool { return h.count() == tasks*perTask/2 })
	done := make(chan error, 1)
	go func() { done <- a.Drain(ctx(t)) }()
	sendTasks(t, sender, tasks, perTask/2, perTask)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the younger consumes once the elder stopped", b.Consuming)
	eventually(t, 10*time.Second, "every message handled", func() bool { return h.count() >= tasks*perTask })
	by := h.check(t, tasks, perTask)
	if by["A"] < tasks*perTask/2 || by["B"] == 0 {
		t.Fatalf("handled by instance: %v; want the first half or more on A, the rest on B", by)
	}
}

// An instance that dies without deregistering (its connection closes)
// stands in the way until the other instance takes it for gone; then the
// other consumes, and handles the messages the dead one held unacked too.
func TestTurns_StandbyTakesOverAfterCrash(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	var h handling
	opts := []agentkit.Option{agentkit.WithHeartbeat(400 * time.Millisecond), agentkit.WithPolicy(wire.PriorityNormal, fastPolicy(200*time.Millisecond, 200*time.Millisecond, 200*time.Millisecond))}
	connA, _, took := startHanging(t, m, opts...)
	b := m.started("worker", map[string]agentkit.HandlerFunc{"work": h.handler("B")}, opts...)
	if b.Consuming() {
		t.Fatal("the younger instance consumes while the elder lives")
	}
	sender := m.agent("sender")
	sendTasks(t, sender, 2, 0, 5)
	eventually(t, 10*time.Second, "the elder holds messages", func() bool { return took.Load() > 0 })
	connA.Close() // A can neither deregister nor renew its record
	eventually(t, 10*time.Second, "the younger consumes once the elder is gone", b.Consuming)
	sendTasks(t, sender, 2, 5, 10)
	eventually(t, 10*time.Second, "every message handled", func() bool { return h.count() >= 20 })
	h.mu.Lock()
	defer h.mu.Unlock()
	seen := map[handled]bool{}
	for _, x := range h.order {
		if seen[x] || x.instance != "B" {
			t.Fatalf("%v ran twice or on the dead instance: %v", x, h.order)
		}
		seen[x] = true
	}
}

// An instance whose record cannot be renewed stops fetching by itself
// after two heartbeats, before others could take it for gone, and resumes
// once a renewal succeeds; what was sent meanwhile is handled then.
func TestTurns_FencedWhileItsRecordGoesUnrenewed(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	var h handling
	a := m.started("worker", map[string]agentkit.HandlerFunc{"work": h.handler("A")}, agentkit.WithHeartbeat(400*time.Millisecond))
	js, err := jetstream.New(m.conn())
	if err != nil {
		t.Fatal(err)
	}
	setMaxMsgSize := func(n int32) {
		t.Helper()
		s, err := js.Stream(ctx(t), "KV_mesh_registry")
		if err != nil {
			t.Fatal(err)
		}
		cfg := s.CachedInfo().Config
		cfg.MaxMsgSize = n
		if _, err := js.UpdateStream(ctx(t), cfg); err != nil {
			t.Fatal(err)
		}
	}
	setMaxMsgSize(16) // every renewal is refused
	eventually(t, 10*time.Second, "the instance stands by", func() bool { return !a.Consuming() })
	sendTasks(t, m.agent("sender", agentkit.WithRegistration(false)), 1, 0, 5)
	if n := h.count(); n != 0 {
		t.Fatalf("a fenced instance handled %d messages", n)
	}
	setMaxMsgSize(-1)
	eventually(t, 10*time.Second, "the instance consumes again", a.Consuming)
	eventually(t, 10*time.Second, "every message handled", func() bool { return h.count() >= 5 })
	h.check(t, 1, 5)
}

// An instance whose record the registry dropped (here deleted behind its
// back) comes back as the youngest: the other instance takes over.
func TestTurns_DroppedRecordRejoinsAsYoungest(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	var h handling
	// A heartbeat of a second: an instance fences itself after two
	// unrenewed, which a loaded machine must not cause by itself.
	hb := agentkit.WithHeartbeat(time.Second)
	a := m.started("worker", map[string]agentkit.HandlerFunc{"work": h.handler("A")}, hb)
	b := m.started("worker", map[string]agentkit.HandlerFunc{"work": h.handler("B")}, hb)
	eventually(t, 10*time.Second, "the elder consumes, the younger stands by", func() bool { return a.Consuming() && !b.Consuming() })
	kv := registryKV(t, m)
	keys, err := kv.ListKeysFiltered(ctx(t), "agent.worker.*")
	if err != nil {
		t.Fatal(err)
	}
	var elder string // the key of the record stating the earliest start
	var elderSince time.Time
	for k := range keys.Keys() {
		e, err := kv.Get(ctx(t), k)
		if err != nil {
			t.Fatal(err)
		}
		var rec registry.Instance
		if err := json.Unmarshal(e.Value(), &rec); err != nil {
			t.Fatal(err)
		}
		if elder == "" || rec.Since.Before(elderSince) {
			elder, elderSince = k, rec.Since
		}
	}
	if err := kv.Delete(ctx(t), elder); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the younger consumes, the elder stands by", func() bool { return b.Consuming() && !a.Consuming() })
	// Until both saw the dropped record, both consumed (the registry
	// failed them), and the elder's last pull may still bring it a
	// message of the first round: only the second, sent once the first
	// is handled, must all go to the younger.
	sender := m.agent("sender", agentkit.WithRegistration(false))
	sendTasks(t, sender, 1, 0, 5)
	eventually(t, 10*time.Second, "the first round handled", func() bool { return h.count() >= 5 })
	sendTasks(t, sender, 1, 5, 10)
	eventually(t, 10*time.Second, "every message handled", func() bool { return h.count() >= 10 })
	h.mu.Lock()
	defer h.mu.Unlock()
	ran, next := map[int]bool{}, 5
	for _, x := range h.order {
		if ran[x.n] {
			t.Fatalf("message %d ran twice: %v", x.n, h.order)
		}
		ran[x.n] = true
		if x.n >= 5 {
			if x.instance != "B" || x.n != next {
				t.Fatalf("second round: message %d ran on %s when %d was next on B: %v", x.n, x.instance, next, h.order)
			}
			next++
		}
	}
	if len(ran) != 10 {
		t.Fatalf("%d of 10 messages ran: %v", len(ran), h.order)
	}
}

// An instance whose connection is gone (here closed; a crash looks the
// same to the server) answers no probe: the standby expires its record
// early, a heartbeat after, instead of waiting out the record's TTL, and
// reclaims the messages it held instead of waiting out their ack timeout
// (ten minutes here).
func TestTurns_GoneElderIsProbedAndItsMessagesReclaimed(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	var h handling
	long := agentkit.DeliveryPolicy{BackOff: []time.Duration{10 * time.Minute}, MaxDeliver: 2, ProcessingLimit: time.Hour, Prefetch: 16, MaxAckPending: 1000}
	// The default heartbeat: the record's TTL (15s) leaves the probes'
	// judgement (after 5s) a wide margin on a loaded machine.
	opts := []agentkit.Option{agentkit.WithPolicy(wire.PriorityNormal, long)}
	connA, a, took := startHanging(t, m, opts...)
	b := m.started("worker", map[string]agentkit.HandlerFunc{"work": h.handler("B")}, opts...)
	eventually(t, 10*time.Second, "the elder consumes, the younger stands by", func() bool { return a.Consuming() && !b.Consuming() })
	sendTasks(t, m.agent("sender", agentkit.WithRegistration(false)), 1, 0, 3)
	eventually(t, 10*time.Second, "the elder holds messages", func() bool { return took.Load() > 0 })
	held := took.Load()
	connA.Close() // A can neither deregister, renew its record nor answer probes
	eventually(t, 30*time.Second, "the younger consumes", b.Consuming)
	eventually(t, 30*time.Second, "every message handled", func() bool { return h.count() >= 3 })
	h.check(t, 1, 3)

	// The elder's record was expired by the standby (a purge), not by
	// its TTL, which leaves no marker in the registry's bucket.
	kv := registryKV(t, m)
	w, err := kv.Watch(ctx(t), "agent.worker.*", jetstream.IncludeHistory())
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	last := map[string]jetstream.KeyValueOp{}
	for e := range w.Updates() {
		if e == nil {
			break // the history is read
		}
		last[e.Key()] = e.Operation()
	}
	purged := 0
	for _, op := range last {
		if op == jetstream.KeyValuePurge {
			purged++
		}
	}
	if purged != 1 {
		t.Fatalf("records' last operations %v; want the elder's purged by the standby", last)
	}
	t.Logf("the elder held %d of 3 messages when it went; the standby handled all 3", held)
}

// A standby does not expire an elder that answers its probes, though
// its record goes unrenewed: a live instance whose renewals do not land
// (the registry's trouble, not its own) keeps its turn until its TTL.
func TestTurns_AnsweringElderIsNotExpired(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	// The elder is the test: a record stating an early start and that it
	// answers probes, put once with a TTL of 10s, and a subscriber
	// answering on its probe subject.
	nc := m.conn()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	view, err := registry.Open(ctx(t), js, subjects.Default, 1, true)
	if err != nil {
		t.Fatal(err)
	}
	defer view.Close()
	probe, err := subjects.Default.Probe("worker", "elder")
	if err != nil {
		t.Fatal(err)
	}
	var probed atomic.Int32
	if _, err := nc.Subscribe(probe, func(msg *nats.Msg) { probed.Add(1); _ = msg.Respond(nil) }); err != nil {
		t.Fatal(err)
	}
	const ttl = 10 * time.Second
	put := time.Now()
	elder := registry.Instance{ID: "worker", Instance: "elder", Status: registry.StatusReady, Since: put.Add(-time.Hour), Probe: true}
	if err := view.Register(ctx(t), elder, ttl); err != nil {
		t.Fatal(err)
	}
	var h handling
	b := m.started("worker", map[string]agentkit.HandlerFunc{"work": h.handler("B")})
	// The standby's probes would have found a silent elder gone a third
	// of the TTL after the put; watch until 8s after it.
	for time.Since(put) < ttl*8/10 {
		if b.Consuming() {
			t.Fatalf("the standby took the turn from an elder answering its probes, %v after the elder's record was put", time.Since(put))
		}
		time.Sleep(100 * time.Millisecond)
	}
	if probed.Load() == 0 {
		t.Fatal("the standby never probed its elder")
	}
	eventually(t, 20*time.Second, "the standby consumes once the elder's record expired", b.Consuming)
}
