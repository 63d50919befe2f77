// Package metrics exports the Prometheus metrics of agentkit agents. It is
// a set of agentkit hooks: agents that are not given one pay nothing, and
// programs that do not import it do not link Prometheus.
//
//	m, err := metrics.New(prometheus.DefaultRegisterer)
//	a, err := agentkit.New(nc, "planner_1", agentkit.WithHooks(m))
//
// The series, labelled by agent ids, topics, message types, error codes,
// priorities and outcomes (bounded by the mesh's size, never by message or
// correlation ids):
//
//	agent_messages_total{source,dest,type}         envelopes the stream stored, by destination (agent id, topic:<name> or *)
//	agent_request_duration_seconds{source,dest}    Request and SendAndWait: from sending to the reply
//	agent_errors_total{source,error_type}          publish, timeout, circuit_open, invalid, or the code of a NACK or failed handler
//	agent_queue_size{agent_id}                     pending plus unacknowledged messages over the agent's consumers
//	agent_prefetch{agent_id,priority}              messages buffered ahead of the workers ([agentkit.Stats] Prefetch)
//	agent_breaker_state{source,dest}               0 closed, 1 half-open, 2 open
//	agent_outcomes_total{agent_id,outcome}         received messages by outcome ([agentkit.Stats] Outcomes)
//	agent_batch_messages_total{source,publish}     SendBatch messages stored, fast (a fast batch) or single
//
// agent_outcomes_total, agent_queue_size and agent_prefetch are read from
// the agents when Prometheus gathers: agent_queue_size asks the server for
// each started agent's consumers then, and is left out for an agent whose
// server does not answer within 2 seconds. A stopped agent's gauges go
// (frozen, they would read as its state); its counters stay.
package metrics

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
)

// queueTimeout bounds the consumer lookups of one agent_queue_size read.
const queueTimeout = 2 * time.Second

// Metrics is a Prometheus collector fed by the hooks of the agents it is
// attached to with [agentkit.WithHooks]. Agents (of one id or many) may
// share one. Its methods are safe for concurrent use.
type Metrics struct {
	messages *prometheus.CounterVec
	duration *prometheus.HistogramVec
	errors   *prometheus.CounterVec
	breaker  *prometheus.GaugeVec
	batched  *prometheus.CounterVec
	outcomes *prometheus.Desc
	queue    *prometheus.Desc
	prefetch *prometheus.Desc

	mu      sync.Mutex
	agents  map[string][]*agentkit.Agent           // live agents by id: instances of one id share series
	retired map[string]map[agentkit.Outcome]uint64 // the outcomes of stopped agents, by id
}

// New returns the collector registered on reg. A reg that already holds
// one (another part of the program called New first) returns that one, so
// agents of one process may share a registerer.
func New(reg prometheus.Registerer) (*Metrics, error) {
	if reg == nil {
		return nil, fmt.Errorf("%w: nil prometheus.Registerer", agentkit.ErrInvalidOption)
	}
	m := &Metrics{
		messages: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "agent_messages_total",
			Help: "Messages sent, by sender, destination (agent id, topic:<name> or *) and message type."}, []string{"source", "dest", "type"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "agent_request_duration_seconds",
			Help: "Time from sending a request (Request, SendAndWait) to its reply.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 18)},
			[]string{"source", "dest"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "agent_errors_total",
			Help: "Errors seen by an agent, by kind: publish, timeout, circuit_open, invalid, or the error code of a NACK or failed handler."},
			[]string{"source", "error_type"}),
		breaker: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "agent_breaker_state",
			Help: "Circuit to a destination: 0 closed, 1 half-open, 2 open."}, []string{"source", "dest"}),
		batched: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "agent_batch_messages_total",
			Help: "Messages SendBatch stored, by how: fast (a fast batch publish, one stream ack per batch) or single (one publish and ack each: a stream without allow_batched, a fast batch that ended early, a batch of one)."},
			[]string{"source", "publish"}),
		outcomes: prometheus.NewDesc("agent_outcomes_total",
			"Received messages by what happened to them (ack, nak, term, invalid, expired, reply, late_reply, ...).", []string{"agent_id", "outcome"}, nil),
		queue: prometheus.NewDesc("agent_queue_size",
			"Messages waiting for an agent: pending plus unacknowledged, over its consumers, read when gathered.", []string{"agent_id"}, nil),
		prefetch: prometheus.NewDesc("agent_prefetch",
			"Messages the agent buffers ahead of its workers besides one per worker, by priority, as the handlers' pace calls for (DeliveryPolicy.MaxPrefetch).",
			[]string{"agent_id", "priority"}, nil),
		agents:  map[string][]*agentkit.Agent{},
		retired: map[string]map[agentkit.Outcome]uint64{},
	}
	err := reg.Register(m)
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(*Metrics); ok {
			return existing, nil
		}
	}
	if err != nil {
		return nil, fmt.Errorf("%w: metrics: %w", agentkit.ErrInvalidOption, err)
	}
	return m, nil
}

// Describe implements [prometheus.Collector].
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	m.messages.Describe(ch)
	m.duration.Describe(ch)
	m.errors.Describe(ch)
	m.breaker.Describe(ch)
	m.batched.Describe(ch)
	ch <- m.outcomes
	ch <- m.queue
	ch <- m.prefetch
}

// Collect implements [prometheus.Collector].
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	m.messages.Collect(ch)
	m.duration.Collect(ch)
	m.errors.Collect(ch)
	m.breaker.Collect(ch)
	m.batched.Collect(ch)
	m.mu.Lock()
	ids := make(map[string][]*agentkit.Agent, len(m.agents)+len(m.retired))
	counts := make(map[string]map[agentkit.Outcome]uint64, len(m.agents)+len(m.retired))
	for id, n := range m.retired {
		counts[id] = clone(n)
	}
	for id, as := range m.agents {
		ids[id] = append([]*agentkit.Agent(nil), as...)
	}
	m.mu.Unlock()
	for id, as := range ids {
		if counts[id] == nil {
			counts[id] = map[agentkit.Outcome]uint64{}
		}
		var prefetch map[wire.Priority]int
		var started *agentkit.Agent
		for _, a := range as {
			st := a.Stats()
			for o, n := range st.Outcomes {
				counts[id][o] += n
			}
			if st.Prefetch != nil && started == nil {
				prefetch, started = st.Prefetch, a
			}
		}
		for p, n := range prefetch {
			ch <- prometheus.MustNewConstMetric(m.prefetch, prometheus.GaugeValue, float64(n), id, string(p))
		}
		if started != nil {
			if n, ok := queueSize(started); ok {
				ch <- prometheus.MustNewConstMetric(m.queue, prometheus.GaugeValue, float64(n), id)
			}
		}
	}
	for id, n := range counts {
		for _, o := range agentkit.Outcomes {
			ch <- prometheus.MustNewConstMetric(m.outcomes, prometheus.CounterValue, float64(n[o]), id, string(o))
		}
	}
}

// queueSize returns a's pending and unacknowledged messages over its
// consumers, and false if the server did not say.
func queueSize(a *agentkit.Agent) (uint64, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), queueTimeout)
	defer cancel()
	var n uint64
	for _, p := range wire.Priorities {
		info, err := a.ConsumerInfo(ctx, p)
		if err != nil {
			return 0, false
		}
		n += info.NumPending + uint64(info.NumAckPending)
	}
	return n, true
}

func clone(m map[agentkit.Outcome]uint64) map[agentkit.Outcome]uint64 {
	out := make(map[agentkit.Outcome]uint64, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// OnNewAgent starts collecting a's outcomes and gauges.
func (m *Metrics) OnNewAgent(a *agentkit.Agent) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.agents[a.ID()] = append(m.agents[a.ID()], a)
}

// OnAgentStopped keeps a's final outcome counts and drops its gauges.
func (m *Metrics) OnAgentStopped(a *agentkit.Agent) {
	st := a.Stats()
	m.mu.Lock()
	id := a.ID()
	as := m.agents[id]
	for i, x := range as {
		if x == a {
			as = append(as[:i], as[i+1:]...)
			break
		}
	}
	if len(as) == 0 {
		delete(m.agents, id)
	} else {
		m.agents[id] = as
	}
	n := m.retired[id]
	if n == nil {
		n = map[agentkit.Outcome]uint64{}
		m.retired[id] = n
	}
	for o, c := range st.Outcomes {
		n[o] += c
	}
	m.mu.Unlock()
	m.breaker.DeletePartialMatch(prometheus.Labels{"source": id})
}

// OnSettle counts the errors of received messages: INVALID ones and the
// codes of failed handlers.
func (m *Metrics) OnSettle(ev agentkit.SettleEvent) {
	switch {
	case ev.Outcome == agentkit.OutcomeInvalid:
		m.errors.WithLabelValues(ev.Agent, "invalid").Inc()
	case ev.Code != "":
		m.errors.WithLabelValues(ev.Agent, string(ev.Code)).Inc()
	}
}

// OnPublish counts the envelopes the stream stored and the publishes that
// failed.
func (m *Metrics) OnPublish(ev agentkit.PublishEvent) {
	if ev.Err != nil {
		m.errors.WithLabelValues(ev.Agent, "publish").Inc()
		return
	}
	e := ev.Envelope
	dest := e.ReceiverID
	switch {
	case dest != "":
	case e.Topic != "":
		dest = "topic:" + e.Topic
	default:
		dest = "*"
	}
	m.messages.WithLabelValues(ev.Agent, dest, string(e.MessageType)).Inc()
	if ev.Batch {
		how := "single"
		if ev.Fast {
			how = "fast"
		}
		m.batched.WithLabelValues(ev.Agent, how).Inc()
	}
}

// OnRequest observes the time to a reply and counts requests that failed:
// timeouts, refusals of the circuit breaker and error replies.
func (m *Metrics) OnRequest(ev agentkit.RequestEvent) {
	if ev.Reply != nil {
		m.duration.WithLabelValues(ev.Agent, ev.To).Observe(ev.Elapsed.Seconds())
	}
	switch {
	case ev.Refused:
		m.errors.WithLabelValues(ev.Agent, "circuit_open").Inc()
	case errors.Is(ev.Err, agentkit.ErrTimeout):
		m.errors.WithLabelValues(ev.Agent, "timeout").Inc()
	case wire.IsRemote(ev.Err):
		m.errors.WithLabelValues(ev.Agent, string(agentkit.CodeOf(ev.Err))).Inc()
	}
}

// OnBreakerChange sets the state of the circuit.
func (m *Metrics) OnBreakerChange(ev agentkit.BreakerEvent) {
	v := map[agentkit.BreakerState]float64{agentkit.BreakerClosed: 0, agentkit.BreakerHalfOpen: 1, agentkit.BreakerOpen: 2}[ev.State]
	m.breaker.WithLabelValues(ev.Agent, ev.To).Set(v)
}
