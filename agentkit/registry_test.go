package agentkit_test

import (
	"context"
	"errors"
	"slices"
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

const testHeartbeat = 400 * time.Millisecond

func findOne(t *testing.T, a *agentkit.Agent, id string) (registry.Agent, bool) {
	t.Helper()
	rec, ok := a.Registry().Get(id)
	return rec, ok
}

func TestRegistry_LifecycleAndDiscovery(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	noop := (&recorder{}).handle(nil)
	planner := m.started("planner_1", map[string]agentkit.HandlerFunc{"plan_workflow": noop, "validate_request": noop},
		agentkit.WithType("planner"), agentkit.WithVersion("1.2.0"), agentkit.WithDirector("director_1"), agentkit.WithHeartbeat(testHeartbeat))
	m.started("executor_1", map[string]agentkit.HandlerFunc{"execute_operation": noop},
		agentkit.WithType("executor"), agentkit.WithCapabilities(agentkit.Capability{Name: "database", Version: "2", Actions: []string{"execute_operation"}}),
		agentkit.WithHeartbeat(testHeartbeat))
	watcher := m.started("watcher", nil, agentkit.WithHeartbeat(testHeartbeat))
	reg := watcher.Registry()
	events := reg.Watch(ctx(t))

	eventually(t, 5*time.Second, "planner READY", func() bool {
		rec, ok := reg.Get("planner_1")
		return ok && rec.Status == agentkit.StatusReady
	})
	rec, _ := reg.Get("planner_1")
	if rec.Type != "planner" || rec.Version != "1.2.0" || rec.Director != "director_1" || rec.Instances != 1 ||
		len(rec.Capabilities) != 1 || rec.Capabilities[0].Name != "planner" || len(rec.Capabilities[0].Actions) != 2 {
		t.Fatalf("planner record = %+v", rec)
	}
	got, err := reg.Find(ctx(t), registry.Query{Capability: "database", Status: agentkit.StatusReady})
	if err != nil || len(got) != 1 || got[0].ID != "executor_1" {
		t.Fatalf("Find(database) = %+v, %v", got, err)
	}
	if got, _ := reg.Find(ctx(t), registry.Query{Type: "planner"}); len(got) != 1 || got[0].ID != "planner_1" {
		t.Fatalf("Find(type planner) = %+v", got)
	}

	// A second instance of the planner.
	m.started("planner_1", map[string]agentkit.HandlerFunc{"plan_workflow": noop, "validate_request": noop},
		agentkit.WithType("planner"), agentkit.WithHeartbeat(testHeartbeat))
	eventually(t, 5*time.Second, "two planner instances", func() bool {
		rec, _ := reg.Get("planner_1")
		return rec.Instances == 2
	})

	// A clean stop of the executor is STOPPED, seen by Watch too.
	exec2 := m.agent("executor_2", agentkit.WithHeartbeat(testHeartbeat))
	if err := exec2.Start(ctx(t)); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "executor_2 registered", func() bool { _, ok := reg.Get("executor_2"); return ok })
	exec2.Stop()
	eventually(t, 5*time.Second, "executor_2 STOPPED", func() bool {
		rec, _ := reg.Get("executor_2")
		return rec.Status == agentkit.StatusStopped
	})
	deadline := time.After(5 * time.Second)
	for stopped := false; !stopped; {
		select {
		case ev := <-events:
			stopped = ev.Agent.ID == "executor_2" && ev.Agent.Status == agentkit.StatusStopped
		case <-deadline:
			t.Fatal("Watch did not report executor_2 STOPPED")
		}
	}
	_ = planner
}

// An agent that dies without stopping is UNAVAILABLE within 3 heartbeat
// intervals plus slack: its registry key expires by itself.
func TestRegistry_CrashedAgentBecomesUnavailable(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	watcher := m.started("watcher", nil, agentkit.WithHeartbeat(testHeartbeat))
	nc := m.conn()
	victim, err := agentkit.New(nc, "victim", agentkit.WithHeartbeat(testHeartbeat))
	if err != nil {
		t.Fatal(err)
	}
	if err := victim.Start(ctx(t)); err != nil {
		t.Fatal(err)
	}
	reg := watcher.Registry()
	eventually(t, 5*time.Second, "victim READY", func() bool {
		rec, ok := reg.Get("victim")
		return ok && rec.Status == agentkit.StatusReady
	})
	// Survives several heartbeats while alive.
	time.Sleep(3 * testHeartbeat)
	if rec, _ := reg.Get("victim"); rec.Status != agentkit.StatusReady {
		t.Fatalf("victim %s while heartbeating", rec.Status)
	}
	nc.Close() // crash: no Stop, no deregistration
	crashed := time.Now()
	// 3 intervals is the key TTL; the slack covers the server's expiry scan
	// (about a second) and one heartbeat already in flight.
	const slack = 2 * time.Second
	eventually(t, 3*testHeartbeat+slack, "victim UNAVAILABLE", func() bool {
		rec, _ := reg.Get("victim")
		return rec.Status == agentkit.StatusUnavailable
	})
	t.Logf("UNAVAILABLE %v after the crash (3 heartbeats = %v)", time.Since(crashed).Round(10*time.Millisecond), 3*testHeartbeat)
	if got, _ := reg.Find(ctx(t), registry.Query{Status: agentkit.StatusReady}); len(got) != 1 || got[0].ID != "watcher" {
		t.Fatalf("READY agents = %+v", got)
	}
	victim.Stop()
}

func TestBreaker_OpensFailsFastHalfOpensAndCloses(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	// The open-circuit checks below are a few calls that send nothing;
	// OpenTimeout leaves them seconds, far beyond a loaded machine's
	// stalls, before the circuit half-opens and a call becomes a trial.
	settings := agentkit.BreakerSettings{FailureThreshold: 5, OpenTimeout: 2 * time.Second, HalfOpenRequests: 3, NackThreshold: 3, TimeoutThreshold: 3}
	orch := m.started("orch", nil, agentkit.WithBreaker(settings), agentkit.WithHeartbeat(testHeartbeat))
	// The planner is down: requests time out. A request's deadline covers
	// its publish too, and one that ends before the stream confirms the
	// message fails here: a local failure, which the breaker rightly
	// counts neither way. The deadline doubles until requests reach the
	// stream, however long the loaded server takes to confirm.
	deadline := 100 * time.Millisecond
	for timeouts := 0; timeouts < 5; {
		c, cancel := context.WithTimeout(ctx(t), deadline)
		_, err := orch.Request(c, "planner", "plan", nil)
		cancel()
		switch {
		case errors.Is(err, agentkit.ErrTimeout):
			timeouts++
		case errors.Is(err, context.DeadlineExceeded) && !wire.IsRemote(err) && deadline < 10*time.Second:
			deadline *= 2
		default:
			t.Fatalf("request with a %v deadline: %v, want a timeout", deadline, err)
		}
	}
	if s := orch.BreakerState("planner"); s != agentkit.BreakerOpen {
		t.Fatalf("after 5 timeouts the circuit is %s", s)
	}
	// Failing fast: an error at once instead of waiting, with no
	// deadline, for an answer; and nothing sent, which the stream shows.
	const corr = "sent_while_open"
	_, err := orch.Request(ctx(t), "planner", "plan", nil, agentkit.WithCorrelationID(corr))
	var open *agentkit.CircuitOpenError
	if !errors.As(err, &open) || !errors.Is(err, agentkit.ErrCircuitOpen) || open.Agent != "planner" {
		t.Fatalf("open circuit: %v", err)
	}
	if _, err := orch.Send(ctx(t), "planner", "plan", nil, agentkit.WithCorrelationID(corr)); !errors.Is(err, agentkit.ErrCircuitOpen) {
		t.Fatalf("Send through an open circuit: %v", err)
	}
	if wf, err := orch.WorkflowStatus(ctx(t), corr); err != nil || len(wf.Messages) != 0 {
		t.Fatalf("through the open circuit: %+v, %v; want nothing sent", wf, err)
	}
	// The planner recovers; after the open timeout trial messages go
	// through at low priority and close the circuit. Its handler also
	// gets the requests that timed out (or failed locally) above, so
	// it never blocks on a full channel.
	var mu sync.Mutex
	var priorities []wire.Priority
	m.started("planner", map[string]agentkit.HandlerFunc{"plan": func(ctx context.Context, msg *agentkit.Message) error {
		mu.Lock()
		priorities = append(priorities, msg.Priority)
		mu.Unlock()
		return msg.Reply(ctx, "planned", nil)
	}}, agentkit.WithHeartbeat(testHeartbeat))
	eventually(t, settings.OpenTimeout+5*time.Second, "half-open", func() bool { return orch.BreakerState("planner") == agentkit.BreakerHalfOpen })
	for range 3 {
		if _, err := orch.Request(ctx(t), "planner", "plan", nil); err != nil {
			t.Fatalf("trial request: %v", err)
		}
	}
	if s := orch.BreakerState("planner"); s != agentkit.BreakerClosed {
		t.Fatalf("after 3 successful trials the circuit is %s", s)
	}
	mu.Lock()
	low := 0
	for _, p := range priorities {
		if p == wire.PriorityLow {
			low++
		}
	}
	mu.Unlock()
	if low < 3 {
		t.Fatalf("%d trial messages at low priority, want 3", low)
	}
	if got := orch.Breakers()["planner"]; got != agentkit.BreakerClosed {
		t.Fatalf("Breakers() = %v", orch.Breakers())
	}
}

// Failures on the sender's side (here a cancelled context) say nothing
// about the destination: they neither reset the run of timeouts nor pass
// or fail a trial, and a trial they end frees its slot.
func TestBreaker_LocalFailuresCountNeitherWay(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	settings := agentkit.BreakerSettings{FailureThreshold: 2, OpenTimeout: 200 * time.Millisecond, HalfOpenRequests: 1, NackThreshold: 3, TimeoutThreshold: 3}
	orch := m.started("orch", nil, agentkit.WithBreaker(settings), agentkit.WithRegistration(false))
	cancelled, cancel := context.WithCancel(ctx(t))
	cancel()
	request := func(c context.Context) error { _, err := orch.Request(c, "dead", "work", nil); return err }
	timeOut := func(what string) {
		t.Helper()
		c, cancel := context.WithTimeout(ctx(t), 100*time.Millisecond)
		defer cancel()
		if err := request(c); !errors.Is(err, agentkit.ErrTimeout) {
			t.Fatalf("%s: %v, want ErrTimeout", what, err)
		}
	}
	cancelledRequest := func(what string) {
		t.Helper()
		if err := request(cancelled); !errors.Is(err, context.Canceled) || errors.Is(err, agentkit.ErrTimeout) {
			t.Fatalf("%s: %v, want context.Canceled", what, err)
		}
	}
	timeOut("first timeout")
	cancelledRequest("cancelled between two timeouts")
	timeOut("second timeout")
	if s := orch.BreakerState("dead"); s != agentkit.BreakerOpen {
		t.Fatalf("after timeout, cancel, timeout with FailureThreshold 2 the circuit is %s", s)
	}
	eventually(t, 5*time.Second, "half-open", func() bool { return orch.BreakerState("dead") == agentkit.BreakerHalfOpen })
	cancelledRequest("cancelled trial")
	if s := orch.BreakerState("dead"); s != agentkit.BreakerHalfOpen {
		t.Fatalf("after a cancelled trial the circuit is %s, want half-open", s)
	}
	timeOut("the next trial, in the slot the cancelled one freed")
	if s := orch.BreakerState("dead"); s != agentkit.BreakerOpen {
		t.Fatalf("after a timed-out trial the circuit is %s", s)
	}
}

func TestBreaker_ThreeNacksMarkDegraded(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	var reject atomic.Bool
	reject.Store(true)
	m.started("flaky", map[string]agentkit.HandlerFunc{"work": func(ctx context.Context, msg *agentkit.Message) error {
		if reject.Load() {
			return agentkit.Reject(wire.CodeInvalid, "no")
		}
		return msg.Reply(ctx, "done", nil)
	}}, agentkit.WithConcurrency(1), agentkit.WithHeartbeat(testHeartbeat))
	orch := m.started("orch", nil, agentkit.WithHeartbeat(testHeartbeat))
	for range 3 {
		if _, err := orch.Request(ctx(t), "flaky", "work", nil); !wire.IsRemote(err) {
			t.Fatalf("want a NACK, got %v", err)
		}
	}
	reg := orch.Registry()
	eventually(t, 5*time.Second, "flaky degraded", func() bool {
		rec, _ := reg.Get("flaky")
		return rec.Degraded && rec.DegradedBy == "orch"
	})
	reject.Store(false)
	// Another sender's success clears it too: orch may be gone by then.
	other := m.started("other", nil, agentkit.WithHeartbeat(testHeartbeat))
	eventually(t, 5*time.Second, "other sees flaky degraded", func() bool {
		rec, _ := other.Registry().Get("flaky")
		return rec.Degraded
	})
	if _, err := other.Request(ctx(t), "flaky", "work", nil); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "flaky healthy again", func() bool {
		rec, _ := reg.Get("flaky")
		return !rec.Degraded
	})
	// orch's run of NACKs goes on past the threshold: it marks again.
	reject.Store(true)
	if _, err := orch.Request(ctx(t), "flaky", "work", nil); !wire.IsRemote(err) {
		t.Fatalf("want a NACK, got %v", err)
	}
	eventually(t, 5*time.Second, "flaky degraded again", func() bool {
		rec, _ := reg.Get("flaky")
		return rec.Degraded && rec.DegradedBy == "orch"
	})
}

// A restarted agent clears a degraded mark left from before.
func TestBreaker_RestartClearsDegraded(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	orch := m.started("orch", nil, agentkit.WithHeartbeat(testHeartbeat))
	reg := orch.Registry()
	m.started("flaky", nil, agentkit.WithHeartbeat(testHeartbeat)).Stop()
	if err := reg.MarkDegraded(ctx(t), "flaky", "someone_gone", "3 consecutive NACKs", true); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the stopped flaky marked", func() bool { rec, _ := reg.Get("flaky"); return rec.Degraded })
	m.started("flaky", nil, agentkit.WithHeartbeat(testHeartbeat))
	eventually(t, 5*time.Second, "the mark cleared by the restart", func() bool {
		rec, ok := reg.Get("flaky")
		return ok && !rec.Degraded && rec.Instances == 1
	})
}

// The registry view outlives the context Start was given ("ctx bounds
// only the provisioning"): it kept watching only until that ctx ended.
func TestRegistry_WatchOutlivesStartContext(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	observer := m.agent("observer", agentkit.WithHeartbeat(testHeartbeat))
	startCtx, cancel := context.WithTimeout(ctx(t), 10*time.Second)
	if err := observer.Start(startCtx); err != nil {
		t.Fatal(err)
	}
	cancel()
	late := m.started("late", nil, agentkit.WithHeartbeat(testHeartbeat))
	reg := observer.Registry()
	eventually(t, 5*time.Second, "late READY in the observer's view", func() bool {
		rec, ok := reg.Get("late")
		return ok && rec.Status == agentkit.StatusReady
	})
	late.Stop()
	eventually(t, 5*time.Second, "late STOPPED in the observer's view", func() bool {
		rec, ok := reg.Get("late")
		return ok && rec.Status == agentkit.StatusStopped
	})
}

// An agent draining longer than its key's TTL keeps heartbeating as
// STOPPING: it never reads UNAVAILABLE, and ends STOPPED.
func TestRegistry_LongDrainStaysStopping(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	observer := m.started("observer", nil, agentkit.WithHeartbeat(testHeartbeat))
	events := observer.Registry().Watch(ctx(t))
	statuses := make(chan []agentkit.AgentStatus, 1)
	go func() { // slow's statuses, up to STOPPED
		var seen []agentkit.AgentStatus
		defer func() { statuses <- seen }()
		for ev := range events {
			if ev.Agent.ID != "slow" {
				continue
			}
			if seen = append(seen, ev.Agent.Status); ev.Agent.Status == agentkit.StatusStopped {
				return
			}
		}
	}()
	started := make(chan struct{})
	slow := m.started("slow", map[string]agentkit.HandlerFunc{"work": func(context.Context, *agentkit.Message) error {
		close(started)
		time.Sleep(8 * testHeartbeat) // well past the key's TTL of 3 beats
		return nil
	}}, agentkit.WithHeartbeat(testHeartbeat))
	if _, err := observer.Send(ctx(t), "slow", "work", nil); err != nil {
		t.Fatal(err)
	}
	<-started
	if err := slow.Drain(ctx(t)); err != nil {
		t.Fatal(err)
	}
	seen := <-statuses
	if slices.Contains(seen, agentkit.StatusUnavailable) || !slices.Contains(seen, agentkit.StatusStopping) || seen[len(seen)-1] != agentkit.StatusStopped {
		t.Fatalf("slow's statuses while draining: %v; want STOPPING, never UNAVAILABLE", seen)
	}
}

// An agent that times out three requests in a row is marked
// UNAVAILABLE though it still heartbeats; discovery passes it over until it
// answers again.
func TestBreaker_ThreeTimeoutsMarkUnavailable(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	var silent atomic.Bool
	silent.Store(true)
	release := make(chan struct{})
	m.started("mute", map[string]agentkit.HandlerFunc{"work": func(ctx context.Context, msg *agentkit.Message) error {
		if silent.Load() {
			select {
			case <-release:
				return nil // too late: the requests timed out
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return msg.Reply(ctx, "done", nil)
	}}, agentkit.WithConcurrency(4), agentkit.WithHeartbeat(testHeartbeat), agentkit.WithCapabilities(agentkit.Capability{Name: "work"}))
	orch := m.started("orch", nil, agentkit.WithHeartbeat(testHeartbeat))
	reg := orch.Registry()
	ready := func() bool {
		recs, err := reg.Find(ctx(t), registry.Query{Capability: "work", Status: agentkit.StatusReady})
		return err == nil && len(recs) == 1
	}
	eventually(t, 5*time.Second, "mute registered READY", ready)
	for i := range 3 {
		c, cancel := context.WithTimeout(ctx(t), 200*time.Millisecond)
		_, err := orch.Request(c, "mute", "work", nil)
		cancel()
		if !errors.Is(err, agentkit.ErrTimeout) {
			t.Fatalf("request %d: %v, want ErrTimeout", i+1, err)
		}
		if i < 2 {
			if rec, _ := reg.Get("mute"); rec.Status == agentkit.StatusUnavailable {
				t.Fatalf("UNAVAILABLE after %d timeouts, want 3", i+1)
			}
		}
	}
	eventually(t, 5*time.Second, "mute UNAVAILABLE", func() bool {
		rec, _ := reg.Get("mute")
		return rec.Status == agentkit.StatusUnavailable && rec.UnavailableBy == "orch" && rec.UnavailableReason == "3 consecutive timeouts"
	})
	if ready() {
		t.Fatal("Find still returns mute as READY")
	}
	close(release)
	silent.Store(false)
	if _, err := orch.Request(ctx(t), "mute", "work", nil); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "mute READY again", ready)
	if rec, _ := reg.Get("mute"); rec.UnavailableBy != "" {
		t.Fatalf("mark kept after an answer: %+v", rec)
	}
}

// A handler that cannot do the work reroutes it; the agent with the
// capability completes it, the original requester gets the answer, and
// WorkflowStatus reads the conversation as completed.
func TestReroute_HandedOffTaskCompletes(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	m.started("generalist", map[string]agentkit.HandlerFunc{"translate": func(context.Context, *agentkit.Message) error {
		return agentkit.Reroute("translation")
	}}, agentkit.WithHeartbeat(testHeartbeat))
	m.started("translator", map[string]agentkit.HandlerFunc{"translate": func(ctx context.Context, msg *agentkit.Message) error {
		if msg.Metadata[wire.MetaHandoffFrom] != "generalist" || msg.Metadata[wire.MetaOriginSender] != "orch" {
			return agentkit.Reject(wire.CodeInvalid, "handoff not recorded")
		}
		return msg.Reply(ctx, "translated", map[string]string{"text": "bonjour"})
	}}, agentkit.WithCapabilities(agentkit.Capability{Name: "translation", Actions: []string{"translate"}}), agentkit.WithHeartbeat(testHeartbeat))
	orch := m.started("orch", nil, agentkit.WithHeartbeat(testHeartbeat))
	eventually(t, 5*time.Second, "translator discoverable", func() bool {
		got, _ := orch.Registry().Find(ctx(t), registry.Query{Capability: "translation", Status: agentkit.StatusReady})
		return len(got) == 1
	})
	reply, err := orch.Request(ctx(t), "generalist", "translate", map[string]string{"text": "hello"}, agentkit.WithCorrelationID("corr_tr"), agentkit.WithTaskID("t_tr"))
	if err != nil {
		t.Fatal(err)
	}
	if reply.SenderID != "translator" || reply.Correlation != "corr_tr" || reply.TaskID != "t_tr" || string(reply.Payload) != `{"text":"bonjour"}` {
		t.Fatalf("reply = %+v", reply)
	}
	// In the workflow the request and its forward are both answered (the
	// reply names the original), so the conversation is completed.
	wf, err := orch.WorkflowStatus(ctx(t), "corr_tr")
	if err != nil {
		t.Fatal(err)
	}
	if len(wf.Messages) != 3 || wf.Outcome != agentkit.WorkflowCompleted {
		t.Fatalf("outcome %s, messages %+v", wf.Outcome, wf.Messages)
	}
	for _, msg := range wf.Messages[:2] { // the request and its forward
		if msg.Outcome != "answered" {
			t.Fatalf("%s %s → %s: outcome %q, want answered", msg.Type, msg.Sender, msg.Receiver, msg.Outcome)
		}
	}
	// Nobody has the capability: the requester hears CAPABILITY_MISSING.
	m.started("lonely", map[string]agentkit.HandlerFunc{"sing": func(context.Context, *agentkit.Message) error {
		return agentkit.Reroute("singing")
	}}, agentkit.WithHeartbeat(testHeartbeat))
	_, err = orch.Request(ctx(t), "lonely", "sing", nil)
	if agentkit.CodeOf(err) != wire.CodeCapabilityMissing {
		t.Fatalf("reroute with no candidate: %v", err)
	}
}

// A message rerouted twice (redelivered, or stored twice under one
// message_id) is forwarded under the same id both times, so the stream
// keeps one forward and the other agent handles it once.
func TestReroute_RepeatedRerouteForwardsOnce(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	generalist := m.started("generalist", map[string]agentkit.HandlerFunc{"translate": func(context.Context, *agentkit.Message) error {
		return agentkit.Reroute("translation")
	}}, agentkit.WithHeartbeat(testHeartbeat))
	var rec recorder
	translator := m.started("translator", map[string]agentkit.HandlerFunc{"translate": rec.handle(nil)},
		agentkit.WithCapabilities(agentkit.Capability{Name: "translation", Actions: []string{"translate"}}), agentkit.WithHeartbeat(testHeartbeat))
	eventually(t, 5*time.Second, "translator discoverable", func() bool {
		got, _ := generalist.Registry().Find(ctx(t), registry.Query{Capability: "translation", Status: agentkit.StatusReady})
		return len(got) == 1
	})
	e := wire.NewEnvelope(wire.TypeRequest, "orch", "translate")
	e.ReceiverID = "generalist"
	data, err := e.Encode()
	if err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(m.conn())
	for range 2 { // two stream messages, one envelope
		msg := &nats.Msg{Subject: "mesh.agent.generalist.normal.orch", Data: data, Header: nats.Header{jetstream.MsgIDHeader: {wire.NewMessageID()}}}
		if _, err := js.PublishMsg(ctx(t), msg); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 5*time.Second, "both rerouted", func() bool { return generalist.Stats().Outcomes[agentkit.OutcomeReroute] == 2 })
	eventually(t, 5*time.Second, "translator done", func() bool {
		info, err := translator.ConsumerInfo(ctx(t), wire.PriorityNormal)
		return err == nil && info.NumPending == 0 && info.NumAckPending == 0 && info.Delivered.Stream > 0
	})
	if n := rec.count(); n != 1 {
		t.Fatalf("translator handled the rerouted message %d times, want 1", n)
	}
}

// A send to an agent whose circuit is open falls back to another READY
// agent with the capability when the caller allows it.
func TestFallback_OpenCircuitRoutesToPeer(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	settings := agentkit.BreakerSettings{FailureThreshold: 1, OpenTimeout: time.Minute, HalfOpenRequests: 1, NackThreshold: 3, TimeoutThreshold: 3}
	orch := m.started("orch", nil, agentkit.WithBreaker(settings), agentkit.WithHeartbeat(testHeartbeat))
	m.started("planner_2", map[string]agentkit.HandlerFunc{"plan": func(ctx context.Context, msg *agentkit.Message) error {
		return msg.Reply(ctx, "planned", map[string]string{"by": "planner_2", "from": msg.Metadata[wire.MetaHandoffFrom]})
	}}, agentkit.WithCapabilities(agentkit.Capability{Name: "planning"}), agentkit.WithHeartbeat(testHeartbeat))
	c, cancel := context.WithTimeout(ctx(t), 100*time.Millisecond)
	_, err := orch.Request(c, "planner_1", "plan", nil) // planner_1 is down
	cancel()
	if !errors.Is(err, agentkit.ErrTimeout) || orch.BreakerState("planner_1") != agentkit.BreakerOpen {
		t.Fatalf("err %v, circuit %s", err, orch.BreakerState("planner_1"))
	}
	eventually(t, 5*time.Second, "planner_2 discoverable", func() bool {
		got, _ := orch.Registry().Find(ctx(t), registry.Query{Capability: "planning"})
		return len(got) == 1
	})
	reply, err := orch.Request(ctx(t), "planner_1", "plan", nil, agentkit.WithFallback("planning"))
	if err != nil {
		t.Fatal(err)
	}
	if string(reply.Payload) != `{"by":"planner_2","from":"planner_1"}` {
		t.Fatalf("reply = %s", reply.Payload)
	}
	if _, err := orch.Request(ctx(t), "planner_1", "plan", nil, agentkit.WithFallback("juggling")); !errors.Is(err, agentkit.ErrNoFallback) || !errors.Is(err, agentkit.ErrCircuitOpen) {
		t.Fatalf("no candidate: %v", err)
	}
}

// A restarted agent whose newest instance crashed is UNAVAILABLE, also to
// a registry that loads the bucket afterwards (the CLI's `agents`): the
// crashed instance's key holds the server's expiry marker, newer than the
// deregistration of the instance before it that stopped cleanly.
func TestRegistry_CrashAfterCleanStopIsUnavailableOnLoad(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	watcher := m.started("watcher", nil, agentkit.WithHeartbeat(testHeartbeat))
	reg := watcher.Registry()

	first := m.agent("victim", agentkit.WithHeartbeat(testHeartbeat))
	if err := first.Start(ctx(t)); err != nil {
		t.Fatal(err)
	}
	first.Stop()
	eventually(t, 5*time.Second, "first instance STOPPED", func() bool {
		rec, _ := reg.Get("victim")
		return rec.Status == agentkit.StatusStopped
	})

	nc := m.conn()
	second, err := agentkit.New(nc, "victim", agentkit.WithHeartbeat(testHeartbeat))
	if err != nil {
		t.Fatal(err)
	}
	if err := second.Start(ctx(t)); err != nil {
		t.Fatal(err)
	}
	defer second.Stop()
	eventually(t, 5*time.Second, "second instance READY", func() bool {
		rec, _ := reg.Get("victim")
		return rec.Status == agentkit.StatusReady
	})
	nc.Close() // crash: no Stop, no deregistration
	eventually(t, 3*testHeartbeat+2*time.Second, "watched cache UNAVAILABLE", func() bool {
		rec, _ := reg.Get("victim")
		return rec.Status == agentkit.StatusUnavailable
	})

	js, err := jetstream.New(m.conn())
	if err != nil {
		t.Fatal(err)
	}
	loaded, err := registry.Open(ctx(t), js, subjects.Default, 1, false)
	if err != nil {
		t.Fatal(err)
	}
	defer loaded.Close()
	if rec, ok := loaded.Get("victim"); !ok || rec.Status != agentkit.StatusUnavailable {
		t.Fatalf("loaded registry: victim %s (found %v), want UNAVAILABLE", rec.Status, ok)
	}
	got, err := loaded.Find(ctx(t), registry.Query{Status: agentkit.StatusUnavailable})
	if err != nil || len(got) != 1 || got[0].ID != "victim" {
		t.Fatalf("Find(UNAVAILABLE) = %+v, %v", got, err)
	}
	// It keeps saying so for as long as the bucket keeps the expiry
	// marker: days, so an operator who looks later still sees the crash.
	kv, err := js.KeyValue(ctx(t), subjects.Default.RegistryBucket())
	if err != nil {
		t.Fatal(err)
	}
	st, err := kv.Status(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if st.LimitMarkerTTL() < 24*time.Hour {
		t.Fatalf("the registry keeps expiry markers %v, want at least a day", st.LimitMarkerTTL())
	}
}
