package ackmonitor

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/agentmesh-io/agentmesh/ackmonitor/store"
)

// metrics are the monitor's Prometheus series, on its own registry. They
// count what this instance applied to the ledger for the first time, so
// replays never count twice and instances can be summed.
type metrics struct {
	reg         *prometheus.Registry
	sends       *prometheus.CounterVec // sender, priority
	outcomes    *prometheus.CounterVec // agent, priority, status
	naks        *prometheus.CounterVec // agent, priority
	timeouts    *prometheus.CounterVec // agent, priority: delivery timeouts
	lateAcks    *prometheus.CounterVec // agent, priority: redeliveries of handled messages (Record.LateAcks)
	nakExhaust  *prometheus.CounterVec // agent, priority: TIMEOUT outcomes exhausted by NAKs alone
	escalations *prometheus.CounterVec // agent, priority
	deadLetters *prometheus.CounterVec // agent, priority
	followUpErr prometheus.Counter     // failed dead-letter or escalation attempts
	givenUp     *prometheus.CounterVec // agent, priority: follow-ups given up
	invalid     *prometheus.CounterVec // sender, priority: messages terminated as invalid input
	refused     *prometheus.CounterVec // consumer: messages the ledger refused, terminated
	// receiver, bounded (unknownReceivers.label): messages to unknown agents
	unknownReceivers *prometheus.CounterVec
	inferred         *prometheus.CounterVec   // agent, priority
	ackTime          *prometheus.HistogramVec // agent, priority
	latency          *prometheus.HistogramVec // agent, priority
	events           *prometheus.CounterVec   // kind
	batches          prometheus.Counter
	pending          *prometheus.GaugeVec // consumer
	lag              prometheus.Gauge
	active           prometheus.Gauge
	alerts           *prometheus.GaugeVec // agent, kind, severity; written by Monitor.reportAlerts only
	// stalePending has no labels: one series while active, none otherwise;
	// written by Monitor.reportStalePending only.
	stalePending *prometheus.GaugeVec
	alertsMu     sync.Mutex // serializes rebuilds of alerts and stalePending
}

func newMetrics() *metrics {
	m := &metrics{reg: prometheus.NewRegistry()}
	ap := []string{"agent", "priority"}
	m.sends = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ackmonitor_messages_sent_total",
		Help: "Messages stored in the mesh stream, by sender and priority."}, []string{"sender", "priority"})
	m.outcomes = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ackmonitor_outcomes_total",
		Help: "Messages that reached a final status (ACK, NACK = terminated, TIMEOUT = deliveries exhausted), by receiving agent and priority; messages terminated as invalid input are their senders' and not counted here."},
		[]string{"agent", "priority", "status"})
	m.naks = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ackmonitor_naks_total",
		Help: "NAKs (redelivery requests, e.g. busy receivers), by receiving agent and priority."}, ap)
	m.timeouts = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ackmonitor_delivery_timeouts_total",
		Help: "Delivery attempts that expired without ack or NAK (inferred: deliveries - 1 - NAKs, less late acks), by agent and priority."}, ap)
	m.lateAcks = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ackmonitor_late_acks_total",
		Help: "Redeliveries of messages the receiver had handled, whose ack was lost or came late (the redelivery was acked far faster than the receiver's handler runs); not in ackmonitor_delivery_timeouts_total. By agent and priority."}, ap)
	m.nakExhaust = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ackmonitor_nak_exhausted_total",
		Help: "TIMEOUT outcomes (counted in ackmonitor_outcomes_total) whose every delivery the receiver NAKed: exhausted by NAKs, nothing timed out; the timeout rate leaves them out. By receiving agent and priority."}, ap)
	m.escalations = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ackmonitor_escalations_total",
		Help: "Escalations sent to directors, by receiving agent and priority."}, ap)
	m.deadLetters = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ackmonitor_dead_letters_total",
		Help: "Messages copied to the dead-letter stream, by receiving agent and priority."}, ap)
	m.followUpErr = prometheus.NewCounter(prometheus.CounterOpts{Name: "ackmonitor_follow_up_failures_total",
		Help: "Failed tries to dead-letter or escalate a message; its row stays pending and is tried again, up to FollowUpAttempts tries."})
	m.givenUp = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ackmonitor_follow_ups_given_up_total",
		Help: "Rows whose dead-lettering or escalation the monitor gave up (a failure no try can change, or FollowUpAttempts failed tries), by receiving agent and priority; /api/v1/messages?status=given_up lists them with the reason."}, ap)
	m.invalid = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ackmonitor_invalid_messages_total",
		Help: "Messages their receivers terminated as invalid input (ledger status INVALID), by sender (the subject's sender token) and priority, one per receiving consumer; counted by the active instance as it dead-letters them."},
		[]string{"sender", "priority"})
	m.refused = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ackmonitor_intake_refused_total",
		Help: "Messages of the monitor's consumers (events, sends) the ledger kept refusing on their own while it took other writes; terminated and logged."},
		[]string{"consumer"})
	m.unknownReceivers = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ackmonitor_messages_to_unknown_agents_total",
		Help: "Direct messages whose receiver had no consumer for their priority a moment after the send (no such agent): they wait in the stream undelivered. By receiver; past 50 receivers the rest count as receiver \"_other\"; GET /api/v1/unknown_receivers lists them."},
		[]string{"receiver"})
	m.inferred = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ackmonitor_inferred_acks_total",
		Help: "ACKs inferred from a consumer's ack floor without an ack metric (sampling below 100 %, or events lost), by receiving agent and priority."}, ap)
	buckets := prometheus.ExponentialBuckets(0.0005, 2, 18) // 0.5ms .. ~65s
	m.ackTime = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "ackmonitor_ack_time_seconds",
		Help: "Ack metric ack_time: from the acking delivery (or its last InProgress) to the ack.", Buckets: buckets}, ap)
	m.latency = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "ackmonitor_ack_latency_seconds",
		Help: "From the message's stream timestamp (sent_at) to its ack, retries included.", Buckets: buckets}, ap)
	m.events = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ackmonitor_events_processed_total",
		Help: "Stream messages the monitor committed to the ledger, by kind (send, ACK, NAK, TERM, MAX_DELIVERIES, ignored)."}, []string{"kind"})
	m.batches = prometheus.NewCounter(prometheus.CounterOpts{Name: "ackmonitor_batches_total", Help: "Ledger transactions committed."})
	m.pending = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "ackmonitor_consumer_pending",
		Help: "Messages waiting for the monitor (pending + ack pending) per monitor consumer."}, []string{"consumer"})
	m.lag = prometheus.NewGauge(prometheus.GaugeOpts{Name: "ackmonitor_lag_seconds",
		Help: "Age of the newest message (event or send) of the last batch committed from the events or message stream, when it was committed."})
	m.active = prometheus.NewGauge(prometheus.GaugeOpts{Name: "ackmonitor_active",
		Help: "1 while this instance holds the pin of the events consumer (evaluates alerts, escalates)."})
	m.alerts = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "ackmonitor_alert_active",
		Help: "1 for each active (raised, not resolved) alert, reported by the active instance only."}, []string{"agent", "kind", "severity"})
	m.stalePending = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "ackmonitor_stale_pending_rows",
		Help: "Ledger rows without a final status whose send is older than StalePendingAfter (default 2h), reported by the active instance only."}, nil)
	m.reg.MustRegister(m.sends, m.outcomes, m.naks, m.timeouts, m.lateAcks, m.nakExhaust, m.escalations, m.deadLetters, m.followUpErr, m.givenUp, m.invalid, m.refused, m.unknownReceivers, m.inferred, m.ackTime, m.latency,
		m.events, m.batches, m.pending, m.lag, m.active, m.alerts, m.stalePending,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// observe counts what one committed batch changed.
func (m *metrics) observe(a store.Applied) {
	for _, s := range a.NewSends {
		m.sends.WithLabelValues(s.Sender, s.Priority).Inc()
	}
	for _, e := range a.NewEvents {
		if e.Kind == store.EventNak {
			m.naks.WithLabelValues(e.Receiver, e.Priority).Inc()
		}
	}
	for _, r := range a.Resolved {
		// The rules over this counter divide by every status of a
		// receiver: invalid input, its sender's failure, stays out.
		if r.Status != store.StatusInvalid {
			m.outcomes.WithLabelValues(r.Receiver, r.Priority, r.Status).Inc()
		}
		if r.NakExhausted {
			m.nakExhaust.WithLabelValues(r.Receiver, r.Priority).Inc()
		}
		if r.Timeouts > 0 {
			m.timeouts.WithLabelValues(r.Receiver, r.Priority).Add(float64(r.Timeouts))
		}
		if r.LateAcks > 0 {
			m.lateAcks.WithLabelValues(r.Receiver, r.Priority).Add(float64(r.LateAcks))
		}
		if r.Status == store.StatusACK && !r.InferredAck() { // inferred ACKs have no ack time
			m.ackTime.WithLabelValues(r.Receiver, r.Priority).Observe(r.ProcessingTime.Seconds())
		}
	}
	// Not from Resolved: a row ACKed before its send was recorded gets its
	// latency only when the send fills in sent_at.
	for _, r := range a.Acked {
		m.latency.WithLabelValues(r.Receiver, r.Priority).Observe(max(r.Latency(), 0).Seconds())
	}
}
