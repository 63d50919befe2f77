package agentkit_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
)

// hookLog records every hook event.
type hookLog struct {
	mu       sync.Mutex
	settles  []agentkit.SettleEvent
	pubs     []agentkit.PublishEvent
	requests []agentkit.RequestEvent
	breakers []agentkit.BreakerEvent
	started  []string
	stopped  []string
}

func (l *hookLog) OnNewAgent(a *agentkit.Agent) {
	l.mu.Lock()
	l.started = append(l.started, a.ID())
	l.mu.Unlock()
}
func (l *hookLog) OnAgentStopped(a *agentkit.Agent) {
	l.mu.Lock()
	l.stopped = append(l.stopped, a.ID())
	l.mu.Unlock()
}
func (l *hookLog) OnSettle(ev agentkit.SettleEvent) {
	l.mu.Lock()
	l.settles = append(l.settles, ev)
	l.mu.Unlock()
}
func (l *hookLog) OnPublish(ev agentkit.PublishEvent) {
	l.mu.Lock()
	l.pubs = append(l.pubs, ev)
	l.mu.Unlock()
}
func (l *hookLog) OnRequest(ev agentkit.RequestEvent) {
	l.mu.Lock()
	l.requests = append(l.requests, ev)
	l.mu.Unlock()
}
func (l *hookLog) OnBreakerChange(ev agentkit.BreakerEvent) {
	l.mu.Lock()
	l.breakers = append(l.breakers, ev)
	l.mu.Unlock()
}

// settle returns the settle event of action, if there is one.
func (l *hookLog) settle(action string) (agentkit.SettleEvent, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, ev := range l.settles {
		if ev.Action == action {
			return ev, true
		}
	}
	return agentkit.SettleEvent{}, false
}

// The settle hook hears what became of each received message, after the
// broker call, with what it needs to count and time it.
func TestHooks_Settle(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	log := &hookLog{}
	m.started("worker", map[string]agentkit.HandlerFunc{
		"work":   func(context.Context, *agentkit.Message) error { time.Sleep(10 * time.Millisecond); return nil },
		"refuse": func(context.Context, *agentkit.Message) error { return agentkit.Reject(wire.CodeInvalid, "no") },
		"fail":   func(context.Context, *agentkit.Message) error { return agentkit.Retry(errors.New("flaky"), time.Hour) },
		"boom":   func(context.Context, *agentkit.Message) error { panic("boom") },
	}, agentkit.WithHooks(log), agentkit.WithRegistration(false))
	orch := m.started("orch", nil, agentkit.WithRegistration(false))
	if _, err := orch.SendAndWait(ctx(t), "worker", "work", nil, agentkit.WithPriority(wire.PriorityHigh)); err != nil {
		t.Fatal(err)
	}
	for _, action := range []string{"refuse", "fail", "boom"} {
		if _, err := orch.Send(ctx(t), "worker", action, nil); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 10*time.Second, "four settles", func() bool {
		log.mu.Lock()
		defer log.mu.Unlock()
		return len(log.settles) >= 4
	})
	work, _ := log.settle("work")
	if work.Agent != "worker" || work.Outcome != agentkit.OutcomeAck || work.Priority != wire.PriorityHigh || work.Delivery != 1 ||
		work.StreamSeq == 0 || work.Elapsed < 10*time.Millisecond || work.Envelope == nil || work.Err != nil || work.BrokerErr != nil {
		t.Errorf("work: %+v", work)
	}
	refuse, _ := log.settle("refuse")
	if refuse.Outcome != agentkit.OutcomeTerm || refuse.Code != wire.CodeInvalid || refuse.Reason != "INVALID: no" || refuse.Err == nil {
		t.Errorf("refuse: %+v", refuse)
	}
	fail, _ := log.settle("fail")
	if fail.Outcome != agentkit.OutcomeNak || fail.Code != wire.CodeInternal || fail.Err == nil {
		t.Errorf("fail: %+v", fail)
	}
	boom, _ := log.settle("boom")
	if boom.Outcome != agentkit.OutcomeNak || !errors.Is(boom.Err, agentkit.ErrHandlerPanic) {
		t.Errorf("boom: %+v", boom)
	}
}

// The publish, request and breaker hooks hear sends, requests and the
// circuit opening; the lifecycle hooks hear the agent come and go.
func TestHooks_SendSide(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	log := &hookLog{}
	m.started("worker", map[string]agentkit.HandlerFunc{"work": func(context.Context, *agentkit.Message) error { return nil }},
		agentkit.WithRegistration(false))
	settings := agentkit.DefaultBreakerSettings()
	settings.FailureThreshold = 1
	orch := m.started("orch", nil, agentkit.WithHooks(log), agentkit.WithRegistration(false), agentkit.WithBreaker(settings))
	if _, err := orch.SendAndWait(ctx(t), "worker", "work", nil); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx(t), 300*time.Millisecond)
	defer cancel()
	if _, err := orch.Request(short, "absent", "work", nil); !errors.Is(err, agentkit.ErrTimeout) {
		t.Fatalf("request to an absent agent: %v, want ErrTimeout", err)
	}
	if _, err := orch.Request(ctx(t), "absent", "work", nil); !errors.Is(err, agentkit.ErrCircuitOpen) {
		t.Fatalf("request through the open circuit: %v, want ErrCircuitOpen", err)
	}
	orch.Stop()
	log.mu.Lock()
	defer log.mu.Unlock()
	if len(log.pubs) != 2 || log.pubs[0].Envelope.ReceiverID != "worker" || log.pubs[0].Err != nil || log.pubs[0].Batch {
		t.Errorf("publishes: %+v", log.pubs)
	}
	if len(log.requests) != 3 {
		t.Fatalf("requests: %+v", log.requests)
	}
	if r := log.requests[0]; r.To != "worker" || r.Reply == nil || r.Elapsed <= 0 || r.Err != nil || r.Refused {
		t.Errorf("answered request: %+v", r)
	}
	if r := log.requests[1]; r.To != "absent" || r.Reply != nil || !errors.Is(r.Err, agentkit.ErrTimeout) || r.Refused {
		t.Errorf("timed out request: %+v", r)
	}
	if r := log.requests[2]; !r.Refused || !errors.Is(r.Err, agentkit.ErrCircuitOpen) {
		t.Errorf("refused request: %+v", r)
	}
	if len(log.breakers) != 1 || log.breakers[0] != (agentkit.BreakerEvent{Agent: "orch", To: "absent", State: agentkit.BreakerOpen}) {
		t.Errorf("breaker changes: %+v", log.breakers)
	}
	if len(log.started) != 1 || len(log.stopped) != 1 {
		t.Errorf("new agent hooks %v, stopped hooks %v; want one each", log.started, log.stopped)
	}
}

func TestHooks_NotAHook(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	if _, err := agentkit.New(m.conn(), "a", agentkit.WithHooks(struct{}{})); !errors.Is(err, agentkit.ErrInvalidOption) {
		t.Fatalf("WithHooks(struct{}{}): %v, want ErrInvalidOption", err)
	}
}
