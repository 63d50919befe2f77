// Package demo runs the demo agents of `agentmesh demo`: the complete
// communication flow (an orchestrator has a planner plan the
// update of CUST001's credit limit, executors carry the plan out and a
// validator checks it) and a second workflow that goes wrong on purpose
// (a busy executor NACKs and is retried with backoff, then succeeds; a
// hung executor never acks and exhausts its delivery attempts).
//
// Every agent is an agentkit agent on a connection of its own, so the
// demo exercises the same paths as agents in separate processes. The
// package never prints and never dials: the caller passes a connect
// function and renders the returned [Workflow] values.
package demo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// The demo agents' ids.
const (
	Orchestrator  = "orch_1"
	Planner       = "planner_1"
	Executor      = "executor_1"
	Validator     = "validator_1"
	Director      = "director"
	BusyExecutor  = "executor_busy"
	StuckExecutor = "executor_hung"
)

// Policy is the demo's delivery policy for high and normal priority: short
// ack timeouts so the failing workflow ends in seconds. Three attempts:
// 250ms, 500ms, 1s.
var Policy = agentkit.DeliveryPolicy{
	BackOff:         []time.Duration{250 * time.Millisecond, 500 * time.Millisecond, time.Second},
	MaxDeliver:      3,
	ProcessingLimit: 10 * time.Second,
	Prefetch:        8,
	MaxAckPending:   1000,
}

// Config configures the demo mesh.
type Config struct {
	// Connect opens the connection of one agent; name is the agent id.
	// Required. The demo closes the connections it opened on Stop.
	Connect func(ctx context.Context, name string) (*nats.Conn, error)
	// Options are applied to every agent before the demo's own (scheme,
	// replicas, ...). The demo then sets Policy for high and normal.
	Options []agentkit.Option
	// Scheme must match the scheme in Options. Default: subjects.Default.
	Scheme subjects.Scheme
	// BusyAttempts is how many deliveries the busy executor NACKs before
	// it succeeds; it must be below Policy.MaxDeliver. Default: 2.
	BusyAttempts int
	// EscalationWait is how long RunFailure waits for the director to
	// receive the escalation when ExpectEscalation is set. Default: 15s.
	EscalationWait time.Duration
	// ExpectEscalation says an ack monitor is running, so the hung
	// executor's exhausted message must reach the director as an
	// escalation. Without a monitor nobody escalates, and the demo does
	// not pretend to. Default: false.
	ExpectEscalation bool
	// Logger receives the agents' logs. Default: discard.
	Logger *slog.Logger
}

func (c *Config) setDefaults() {
	if c.Scheme.Prefix() == "" {
		c.Scheme = subjects.Default
	}
	if c.BusyAttempts == 0 {
		c.BusyAttempts = 2
	}
	if c.EscalationWait == 0 {
		c.EscalationWait = 15 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Validate reports whether c is usable.
func (c *Config) Validate() error {
	switch {
	case c.Connect == nil:
		return errors.New("demo: Config.Connect is required")
	case c.BusyAttempts < 0 || c.BusyAttempts >= Policy.MaxDeliver:
		return fmt.Errorf("demo: BusyAttempts %d must be 0 to %d", c.BusyAttempts, Policy.MaxDeliver-1)
	}
	return nil
}

// Mesh is the running demo agents.
type Mesh struct {
	cfg    Config
	conns  []*nats.Conn
	agents map[string]*agentkit.Agent
	order  []string
	js     jetstream.JetStream

	db *customers

	hungStop chan struct{}
	hungDone sync.WaitGroup

	mu          sync.Mutex
	directorLog []*wire.Envelope
	directorCh  chan struct{} // signalled on every director message
}

// Start connects and starts every demo agent. It starts goroutines (the
// agents' and the hung executor's reader); stop them with [Mesh.Stop].
func Start(ctx context.Context, cfg Config) (*Mesh, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	m := &Mesh{cfg: cfg, agents: map[string]*agentkit.Agent{}, db: newCustomers(), directorCh: make(chan struct{}, 1), hungStop: make(chan struct{})}
	ok := false
	defer func() {
		if !ok {
			sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			m.Stop(sctx)
		}
	}()
	type spec struct {
		id, typ  string
		handlers map[string]agentkit.HandlerFunc
	}
	specs := []spec{
		{Director, "director", map[string]agentkit.HandlerFunc{
			"workflow_complete": m.director, "workflow_failed": m.director, "escalation": m.director,
		}},
		{Planner, "planner", map[string]agentkit.HandlerFunc{"plan_workflow": m.plan}},
		{Executor, "executor", map[string]agentkit.HandlerFunc{"execute_operation": m.execute}},
		{Validator, "validator", map[string]agentkit.HandlerFunc{"validate": m.validate}},
		{BusyExecutor, "executor", map[string]agentkit.HandlerFunc{"execute_operation": m.busyExecute}},
		{StuckExecutor, "executor", nil},
		{Orchestrator, "orchestrator", nil},
	}
	for _, s := range specs {
		nc, err := cfg.Connect(ctx, s.id)
		if err != nil {
			return nil, fmt.Errorf("demo: connect %s: %w", s.id, err)
		}
		m.conns = append(m.conns, nc)
		if m.js == nil {
			if m.js, err = jetstream.New(nc); err != nil {
				return nil, fmt.Errorf("demo: jetstream: %w", err)
			}
		}
		opts := append(slices.Clone(cfg.Options),
			agentkit.WithType(s.typ),
			agentkit.WithDirector(Director),
			agentkit.WithLogger(cfg.Logger.With("agent", s.id)),
			agentkit.WithPolicy(wire.PriorityHigh, Policy),
			agentkit.WithPolicy(wire.PriorityNormal, Policy),
		)
		a, err := agentkit.New(nc, s.id, opts...)
		if err != nil {
			return nil, fmt.Errorf("demo: agent %s: %w", s.id, err)
		}
		for action, h := range s.handlers {
			if err := a.Handle(action, h); err != nil {
				return nil, err
			}
		}
		if err := a.Start(ctx); err != nil {
			return nil, fmt.Errorf("demo: start %s: %w", s.id, err)
		}
		m.agents[s.id] = a
		m.order = append(m.order, s.id)
	}
	// The hung executor: its consumers exist (agentkit provisioned them),
	// but the process behind them pulls messages and never answers, like
	// an agent stuck in a loop. Stop the agentkit runtime and read raw.
	m.agents[StuckExecutor].Stop()
	if err := m.startHung(ctx); err != nil {
		return nil, err
	}
	ok = true
	return m, nil
}

// startHung pulls the hung executor's high-priority consumer and drops
// every message without acking it.
func (m *Mesh) startHung(ctx context.Context) error {
	name, _ := m.cfg.Scheme.Consumer(StuckExecutor, string(wire.PriorityHigh))
	cons, err := m.js.Consumer(ctx, m.cfg.Scheme.Stream(), name)
	if err != nil {
		return fmt.Errorf("demo: hung executor consumer: %w", err)
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(4))
	if err != nil {
		return fmt.Errorf("demo: hung executor: %w", err)
	}
	m.hungDone.Go(func() {
		for {
			if _, err := it.Next(); err != nil {
				if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
					return
				}
			}
		}
	})
	m.hungDone.Go(func() {
		<-m.hungStop
		it.Stop()
	})
	return nil
}

// Agent returns the demo agent with id, or nil.
func (m *Mesh) Agent(id string) *agentkit.Agent { return m.agents[id] }

// AgentIDs returns the demo agents' ids in start order.
func (m *Mesh) AgentIDs() []string { return slices.Clone(m.order) }

// Stop stops every agent (draining in-flight work until ctx ends) and
// closes the demo's connections. It is safe to call more than once.
func (m *Mesh) Stop(ctx context.Context) error {
	var errs []error
	for i := len(m.order) - 1; i >= 0; i-- {
		if err := m.agents[m.order[i]].Drain(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	select {
	case <-m.hungStop:
	default:
		close(m.hungStop)
	}
	m.hungDone.Wait()
	for _, nc := range m.conns {
		nc.Close()
	}
	m.conns = nil
	return errors.Join(errs...)
}

// DirectorLog returns the envelopes the director has received.
func (m *Mesh) DirectorLog() []*wire.Envelope {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.directorLog)
}

func (m *Mesh) director(ctx context.Context, msg *agentkit.Message) error {
	m.mu.Lock()
	m.directorLog = append(m.directorLog, msg.Envelope)
	m.mu.Unlock()
	select {
	case m.directorCh <- struct{}{}:
	default:
	}
	return nil
}

// waitDirector waits until the director has received a message matching f.
func (m *Mesh) waitDirector(ctx context.Context, f func(*wire.Envelope) bool) (*wire.Envelope, error) {
	for {
		for _, e := range m.DirectorLog() {
			if f(e) {
				return e, nil
			}
		}
		select {
		case <-m.directorCh:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// Step is one request of a workflow and how it ended.
type Step struct {
	// To and Action say what was asked of whom.
	To, Action string
	// TaskID is the plan's task, if any.
	TaskID string
	// Outcome is the answer's action and status, or the error.
	Outcome string
	// Took is the time from send to answer.
	Took time.Duration
	// OK says whether the step ended as the demo expects (for the failing
	// workflow, failing is expected).
	OK bool
}

// Workflow is one demo workflow's run.
type Workflow struct {
	// Name says what the workflow demonstrates.
	Name string
	// WorkflowID and Correlation identify its messages in the stream.
	WorkflowID, Correlation string
	// Steps are its requests in order.
	Steps []Step
	// Expected describes the expected ending; OK says whether it happened.
	Expected string
	OK       bool
	// Notes are observations (attempts, escalation) worth printing.
	Notes []string
	// Took is the workflow's duration.
	Took time.Duration
}

func newIDs(kind string) (wf, corr string) {
	id := uuid.NewString()[:8]
	return "wf_" + kind + "_" + id, wire.NewCorrelationID("demo_"+kind, id, time.Now())
}

// RunCreditLimit runs the complete communication flow: plan_workflow
// → plan_complete; for each task of the plan execute_operation →
// execution_complete or validate → validation_result; then
// workflow_complete to the director.
func (m *Mesh) RunCreditLimit(ctx context.Context) (*Workflow, error) {
	orch := m.agents[Orchestrator]
	wfID, corr := newIDs("credit")
	w := &Workflow{Name: "credit limit update", WorkflowID: wfID, Correlation: corr,
		Expected: "every step succeeds and CUST001's credit limit is 100000"}
	start := time.Now()
	common := []agentkit.SendOption{agentkit.WithWorkflowID(wfID), agentkit.WithCorrelationID(corr), agentkit.WithPriority(wire.PriorityHigh)}
	ask := func(to, action, task string, payload any) (*wire.Envelope, *Step) {
		opts := slices.Clone(common)
		if task != "" {
			opts = append(opts, agentkit.WithTaskID(task))
		}
		t0 := time.Now()
		reply, err := orch.Request(ctx, to, action, payload, opts...)
		st := Step{To: to, Action: action, TaskID: task, Took: time.Since(t0)}
		if err != nil {
			st.Outcome = err.Error()
		} else {
			st.Outcome = reply.Action + " " + reply.Status
			st.OK = reply.Status == wire.StatusSuccess
		}
		w.Steps = append(w.Steps, st)
		return reply, &w.Steps[len(w.Steps)-1]
	}
	reply, st := ask(Planner, "plan_workflow", "", map[string]any{
		"operation": "update", "target_customer_id": "CUST001", "parameters": map[string]int{"credit_limit": 100000},
	})
	if !st.OK {
		return m.finish(ctx, w, start, false)
	}
	var plan planPayload
	if err := reply.DecodePayload(&plan); err != nil {
		return nil, fmt.Errorf("demo: plan: %w", err)
	}
	allOK := true
	for _, t := range plan.Tasks {
		switch t.AgentType {
		case "executor":
			_, st = ask(Executor, "execute_operation", t.TaskID, map[string]any{
				"operation": t.Operation, "customer_id": "CUST001", "credit_limit": 100000,
			})
		case "validator":
			reply, st = ask(Validator, "validate", t.TaskID, map[string]any{"customer_id": "CUST001", "expect": map[string]int{"credit_limit": 100000}})
			if st.OK {
				var v struct {
					Valid bool `json:"valid"`
				}
				if reply.DecodePayload(&v) == nil && !v.Valid {
					st.OK = false
				}
			}
		}
		allOK = allOK && st.OK
		if !st.OK {
			break
		}
	}
	return m.finish(ctx, w, start, allOK && m.db.creditLimit("CUST001") == 100000)
}

// finish tells the director how the workflow ended.
func (m *Mesh) finish(ctx context.Context, w *Workflow, start time.Time, ok bool) (*Workflow, error) {
	action := "workflow_complete"
	if !ok {
		action = "workflow_failed"
	}
	_, err := m.agents[Orchestrator].Send(ctx, Director, action, map[string]any{"workflow_id": w.WorkflowID, "steps": len(w.Steps)},
		agentkit.WithWorkflowID(w.WorkflowID), agentkit.WithCorrelationID(w.Correlation),
		agentkit.WithMessageType(wire.TypeNotification), agentkit.WithPriority(wire.PriorityHigh))
	if err != nil {
		return nil, fmt.Errorf("demo: %s: %w", action, err)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := m.waitDirector(wctx, func(e *wire.Envelope) bool { return e.WorkflowID == w.WorkflowID && e.Action == action }); err != nil {
		return nil, fmt.Errorf("demo: director did not receive %s: %w", action, err)
	}
	w.Steps = append(w.Steps, Step{To: Director, Action: action, Outcome: "delivered", OK: true})
	w.OK = ok
	w.Took = time.Since(start)
	return w, nil
}

// RunFailure runs the workflow that goes wrong on purpose: the busy
// executor NACKs (agentkit.Busy) BusyAttempts times and succeeds on the
// next delivery; the hung executor never acks, so the broker redelivers
// after each ack timeout until Policy.MaxDeliver attempts are used up and
// emits a MAX_DELIVERIES advisory. With ExpectEscalation the director must
// then receive the monitor's escalation.
func (m *Mesh) RunFailure(ctx context.Context) (*Workflow, error) {
	orch := m.agents[Orchestrator]
	wfID, corr := newIDs("failure")
	w := &Workflow{Name: "busy and hung executors", WorkflowID: wfID, Correlation: corr,
		Expected: fmt.Sprintf("the busy executor succeeds on delivery %d; the hung executor's task exhausts %d deliveries",
			m.cfg.BusyAttempts+1, Policy.MaxDeliver)}
	if m.cfg.ExpectEscalation {
		w.Expected += " and is escalated to " + Director
	}
	start := time.Now()
	common := []agentkit.SendOption{agentkit.WithWorkflowID(wfID), agentkit.WithCorrelationID(corr), agentkit.WithPriority(wire.PriorityHigh)}

	// 1. Busy executor: NACKed, retried on the backoff, then done.
	t0 := time.Now()
	reply, err := orch.Request(ctx, BusyExecutor, "execute_operation", map[string]any{"operation": "update", "customer_id": "CUST002", "credit_limit": 5000},
		append(slices.Clone(common), agentkit.WithTaskID("t1"))...)
	st := Step{To: BusyExecutor, Action: "execute_operation", TaskID: "t1", Took: time.Since(t0)}
	if err != nil {
		st.Outcome = err.Error()
	} else {
		var r struct {
			Attempt uint64 `json:"attempt"`
		}
		_ = reply.DecodePayload(&r)
		st.Outcome = fmt.Sprintf("%s %s on delivery %d", reply.Action, reply.Status, r.Attempt)
		st.OK = reply.Status == wire.StatusSuccess && r.Attempt == uint64(m.cfg.BusyAttempts+1)
	}
	w.Steps = append(w.Steps, st)

	// 2. Hung executor: watch for the broker giving up on it.
	consumer, _ := m.cfg.Scheme.Consumer(StuckExecutor, string(wire.PriorityHigh))
	advSubject, err := subjects.EventSubject(subjects.EventMaxDeliveries, m.cfg.Scheme.Stream(), consumer)
	if err != nil {
		return nil, err
	}
	adv := make(chan *nats.Msg, 16)
	sub, err := m.conns[0].ChanSubscribe(advSubject, adv)
	if err != nil {
		return nil, fmt.Errorf("demo: watch %s: %w", advSubject, err)
	}
	defer sub.Unsubscribe()
	if err := m.conns[0].Flush(); err != nil {
		return nil, fmt.Errorf("demo: watch %s: %w", advSubject, err)
	}
	var total time.Duration
	for i := range Policy.MaxDeliver {
		total += Policy.BackOff[min(i, len(Policy.BackOff)-1)]
	}
	t0 = time.Now()
	env, err := orch.NewRequest(ctx, StuckExecutor, "execute_operation", map[string]any{"operation": "update", "customer_id": "CUST003", "credit_limit": 7000},
		append(slices.Clone(common), agentkit.WithTaskID("t2"))...)
	if err != nil {
		return nil, err
	}
	if err := orch.SendEnvelope(ctx, env); err != nil {
		return nil, fmt.Errorf("demo: send to %s: %w", StuckExecutor, err)
	}
	st = Step{To: StuckExecutor, Action: "execute_operation", TaskID: "t2"}
	wctx, cancel := context.WithTimeout(ctx, total+10*time.Second)
	defer cancel()
	seq, deliveries, err := waitMaxDeliveries(wctx, adv, env.MessageID, m.js, m.cfg.Scheme.Stream())
	st.Took = time.Since(t0)
	if err != nil {
		st.Outcome = "no MAX_DELIVERIES advisory: " + err.Error()
	} else {
		st.Outcome = fmt.Sprintf("no ack after %d deliveries: MAX_DELIVERIES (stream seq %d)", deliveries, seq)
		st.OK = deliveries == Policy.MaxDeliver
	}
	w.Steps = append(w.Steps, st)
	allOK := w.Steps[0].OK && st.OK

	// 3. Escalation: the monitor's job, never faked here.
	if m.cfg.ExpectEscalation {
		ectx, cancel := context.WithTimeout(ctx, m.cfg.EscalationWait)
		defer cancel()
		t0 = time.Now()
		e, err := m.waitDirector(ectx, func(e *wire.Envelope) bool {
			return e.Action == "escalation" && (e.Correlation == corr || e.WorkflowID == wfID || containsID(e.Payload, env.MessageID))
		})
		st := Step{To: Director, Action: "escalation", Took: time.Since(t0)}
		if err != nil {
			st.Outcome = "no escalation from the ack monitor: " + err.Error()
		} else {
			st.Outcome = "received from " + e.SenderID
			st.OK = true
		}
		w.Steps = append(w.Steps, st)
		allOK = allOK && st.OK
	} else {
		w.Notes = append(w.Notes, "no ack monitor running: the exhausted message is not escalated to the director (start the monitor to see it)")
	}
	// The workflow failed as planned; "OK" means it failed the expected way.
	res, err := m.finish(ctx, w, start, false)
	if err != nil {
		return nil, err
	}
	res.OK = allOK
	return res, nil
}

func containsID(payload json.RawMessage, id string) bool {
	var p struct {
		MessageID string `json:"message_id"`
	}
	return json.Unmarshal(payload, &p) == nil && p.MessageID == id
}

// waitMaxDeliveries waits for the MAX_DELIVERIES advisory of the message
// with id and returns its stream sequence and delivery count.
func waitMaxDeliveries(ctx context.Context, adv <-chan *nats.Msg, id string, js jetstream.JetStream, stream string) (uint64, int, error) {
	for {
		select {
		case msg := <-adv:
			var a struct {
				StreamSeq  uint64 `json:"stream_seq"`
				Deliveries int    `json:"deliveries"`
			}
			if err := json.Unmarshal(msg.Data, &a); err != nil {
				continue
			}
			st, err := js.Stream(ctx, stream)
			if err != nil {
				continue
			}
			raw, err := st.GetMsg(ctx, a.StreamSeq)
			if err != nil || raw.Header.Get(wire.HeaderMsgID) != id {
				continue
			}
			return a.StreamSeq, a.Deliveries, nil
		case <-ctx.Done():
			return 0, 0, ctx.Err()
		}
	}
}

// Stats is one agent's received-message counters and, per priority, the
// server's view of its consumer.
type Stats struct {
	Agent      string
	Outcomes   map[agentkit.Outcome]uint64
	Priorities []PriorityStats
}

// PriorityStats is one consumer's delivery figures.
type PriorityStats struct {
	Priority    wire.Priority
	Delivered   uint64 // deliveries made, redeliveries included
	Redelivered int    // messages currently counted as redelivered
	AckPending  int
	Pending     uint64
	AckFloor    uint64 // consumer sequence acknowledged up to
}

// Stats returns every demo agent's counters, with the consumer info of
// each priority that has seen any delivery.
func (m *Mesh) Stats(ctx context.Context) []Stats {
	var out []Stats
	for _, id := range m.order {
		a := m.agents[id]
		s := Stats{Agent: id, Outcomes: a.Stats().Outcomes}
		for _, p := range wire.Priorities {
			name, _ := m.cfg.Scheme.Consumer(id, string(p))
			cons, err := m.js.Consumer(ctx, m.cfg.Scheme.Stream(), name)
			if err != nil {
				continue
			}
			info, err := cons.Info(ctx)
			if err != nil || info.Delivered.Consumer == 0 {
				continue
			}
			s.Priorities = append(s.Priorities, PriorityStats{Priority: p, Delivered: info.Delivered.Consumer,
				Redelivered: info.NumRedelivered, AckPending: info.NumAckPending, Pending: info.NumPending, AckFloor: info.AckFloor.Consumer})
		}
		out = append(out, s)
	}
	return out
}
