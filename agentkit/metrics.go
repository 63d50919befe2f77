package agentkit

import (
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/agentmesh-io/agentmesh/agentkit/wire"
)

// metrics are the Prometheus collectors of seed 004 §7.2 plus handler
// outcomes and breaker state. Labels are agent ids, topics, message types,
// error codes and outcomes: bounded by the mesh's size, never message or
// correlation ids.
type metrics struct {
	messages *prometheus.CounterVec   // agent_messages_total{source,dest,type}
	duration *prometheus.HistogramVec // agent_request_duration_seconds{source,dest}
	errors   *prometheus.CounterVec   // agent_errors_total{source,error_type}
	queue    *prometheus.GaugeVec     // agent_queue_size{agent_id}
	prefetch *prometheus.GaugeVec     // agent_prefetch{agent_id,priority}
	breaker  *prometheus.GaugeVec     // agent_breaker_state{source,dest}
	outcomes *prometheus.CounterVec   // agent_outcomes_total{agent_id,outcome}
	batched  *prometheus.CounterVec   // agent_batch_messages_total{source,publish}
}

// newMetrics registers the collectors on reg. Agents of one process may
// share a registerer: a collector registered by another agent is reused.
func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		messages: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "agent_messages_total",
			Help: "Messages sent, by sender, destination (agent id, topic:<name> or *) and message type."}, []string{"source", "dest", "type"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "agent_request_duration_seconds",
			Help: "Time from sending a request (Request, SendAndWait) to its reply.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 18)},
			[]string{"source", "dest"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "agent_errors_total",
			Help: "Errors seen by an agent, by kind: publish, timeout, circuit_open, invalid, or the error code of a NACK or failed handler."},
			[]string{"source", "error_type"}),
		queue: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "agent_queue_size",
			Help: "Messages waiting for an agent: pending plus unacknowledged, over its consumers, refreshed every heartbeat."}, []string{"agent_id"}),
		prefetch: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "agent_prefetch",
			Help: "Messages the agent buffers ahead of its workers besides one per worker, by priority, as the handlers' pace calls for (DeliveryPolicy.MaxPrefetch); refreshed every heartbeat."},
			[]string{"agent_id", "priority"}),
		breaker: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "agent_breaker_state",
			Help: "Circuit to a destination: 0 closed, 1 half-open, 2 open."}, []string{"source", "dest"}),
		outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "agent_outcomes_total",
			Help: "Received messages by what happened to them (ack, nak, term, invalid, expired, reply, late_reply, ...)."}, []string{"agent_id", "outcome"}),
		batched: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "agent_batch_messages_total",
			Help: "Messages SendBatch stored, by how: fast (a fast batch publish, one stream ack per batch) or single (one publish and ack each: a stream without allow_batched, a fast batch that ended early, a batch of one)."},
			[]string{"source", "publish"}),
	}
	var err error
	if m.messages, err = register(reg, m.messages); err != nil {
		return nil, err
	}
	if m.duration, err = register(reg, m.duration); err != nil {
		return nil, err
	}
	if m.errors, err = register(reg, m.errors); err != nil {
		return nil, err
	}
	if m.queue, err = register(reg, m.queue); err != nil {
		return nil, err
	}
	if m.prefetch, err = register(reg, m.prefetch); err != nil {
		return nil, err
	}
	if m.breaker, err = register(reg, m.breaker); err != nil {
		return nil, err
	}
	if m.outcomes, err = register(reg, m.outcomes); err != nil {
		return nil, err
	}
	if m.batched, err = register(reg, m.batched); err != nil {
		return nil, err
	}
	return m, nil
}

// register registers c, or returns the equal collector already registered.
func register[T prometheus.Collector](reg prometheus.Registerer, c T) (T, error) {
	err := reg.Register(c)
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(T); ok {
			return existing, nil
		}
	}
	if err != nil {
		return c, fmt.Errorf("%w: metrics: %w", ErrInvalidOption, err)
	}
	return c, nil
}

// bind pre-resolves the outcome counters of agent into c, so counting an
// outcome on the hot path costs no label lookup.
func (m *metrics) bind(agent string, c *counters) {
	for i, o := range Outcomes {
		c.prom[i] = m.outcomes.WithLabelValues(agent, string(o))
	}
}

func (a *Agent) countSent(e *wire.Envelope) {
	if a.metrics == nil {
		return
	}
	dest := e.ReceiverID
	switch {
	case dest != "":
	case e.Topic != "":
		dest = "topic:" + e.Topic
	default:
		dest = "*"
	}
	a.metrics.messages.WithLabelValues(a.id, dest, string(e.MessageType)).Inc()
}

// countBatched counts the messages of one SendBatch the stream stored,
// fast of them with fast batch publish.
func (a *Agent) countBatched(fast, single int) {
	if a.metrics != nil {
		a.metrics.batched.WithLabelValues(a.id, "fast").Add(float64(fast))
		a.metrics.batched.WithLabelValues(a.id, "single").Add(float64(single))
	}
}

func (a *Agent) countError(kind string) {
	if a.metrics != nil {
		a.metrics.errors.WithLabelValues(a.id, kind).Inc()
	}
}

func (a *Agent) observeRequest(to string, d time.Duration) {
	if a.metrics != nil {
		a.metrics.duration.WithLabelValues(a.id, to).Observe(d.Seconds())
	}
}

func (a *Agent) observeBreaker(to string, s BreakerState) {
	if a.metrics != nil {
		a.metrics.breaker.WithLabelValues(a.id, to).Set(map[BreakerState]float64{BreakerClosed: 0, BreakerHalfOpen: 1, BreakerOpen: 2}[s])
	}
}

// forget removes the gauges of agent id, which stopped: frozen values
// would read as its state, and a process that starts and stops agents
// would keep their series for ever.
func (m *metrics) forget(id string) {
	m.queue.DeletePartialMatch(prometheus.Labels{"agent_id": id})
	m.prefetch.DeletePartialMatch(prometheus.Labels{"agent_id": id})
	m.breaker.DeletePartialMatch(prometheus.Labels{"source": id})
}
