package store

import (
	"context"
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/agentmesh-io/agentmesh/subjects"
)

// Statuses of a ledger row (ack_status). A row without a final outcome yet
// has the empty status ("pending").
const (
	StatusPending = ""
	StatusACK     = "ACK"  // acked by the receiver
	StatusNACK    = "NACK" // terminated by the receiver (agentkit.Reject, a missing capability)
	// StatusTimeout: delivery attempts exhausted (MAX_DELIVERIES). A row
	// whose every delivery its receiver NAKed is exhausted too, but
	// nothing timed out: [Record.NakExhausted] tells it apart, and the
	// timeout rate leaves it out ([Rate.NakExhausted]).
	StatusTimeout = "TIMEOUT"
	// StatusInvalid: terminated as invalid input (a TERM reason starting
	// with [InvalidReasonPrefix]), the sender's failure, not the
	// receiver's: such rows count in no receiver's ack, NACK or timeout
	// rate, but in their sender's invalid rate ([Store.SenderRates]).
	StatusInvalid = "INVALID"
)

// InvalidReasonPrefix starts the TERM reason of a message terminated as
// invalid input: agentkit's for a message that is not a valid envelope for
// its receiver, and for a handler's Reject with code INVALID.
const InvalidReasonPrefix = "INVALID: "

// EventKind is the kind of a consumer event.
type EventKind string

// The consumer events the ledger is built from.
const (
	EventAck  EventKind = "ACK"            // ack metric (sampled ack)
	EventNak  EventKind = "NAK"            // MSG_NAKED advisory: redelivery requested
	EventTerm EventKind = "TERM"           // MSG_TERMINATED advisory
	EventMax  EventKind = "MAX_DELIVERIES" // MAX_DELIVERIES advisory
)

// Sentinel errors.
var (
	// ErrNotFound is returned when a requested row does not exist.
	ErrNotFound = errors.New("store: not found")
	// ErrClosed is returned by calls on a closed store.
	ErrClosed = errors.New("store: closed")
	// ErrMigration wraps failures to bring the schema up to date.
	ErrMigration = errors.New("store: migration failed")
)

// Send is one message stored in the MESH stream, as the monitor's
// headers-only consumer saw it.
type Send struct {
	StreamSeq   uint64
	MessageID   string
	Sender      string
	Receiver    string // direct messages only
	Topic       string // topic messages only
	Kind        string // "agent", "topic" or "broadcast"
	Priority    string
	MessageType string
	Action      string
	Correlation string
	Workflow    string
	InReplyTo   string
	SentAt      time.Time // the stream's timestamp
}

// Consumer returns the consumer (ledger key) of a direct message's
// receiver, or "" for topic and broadcast messages.
func (s Send) Consumer() string {
	if s.Kind != "agent" || s.Receiver == "" {
		return ""
	}
	// Consumer names do not depend on the scheme's prefix. The receiver
	// and priority come from a parsed subject, so they are valid tokens.
	name, err := subjects.Default.Consumer(s.Receiver, s.Priority)
	if err != nil {
		return ""
	}
	return name
}

// Event is one consumer event of the MESH stream.
type Event struct {
	ID         string    `json:"id"` // the advisory's unique id
	Kind       EventKind `json:"kind"`
	Consumer   string    `json:"-"`
	Receiver   string    `json:"-"` // the consumer's agent
	Priority   string    `json:"-"` // the consumer's priority; "" for a fan-out consumer (the row takes its message's)
	StreamSeq  uint64    `json:"-"`
	Deliveries uint64    `json:"deliveries"`
	// AckTime is the ack metric's ack_time: from the latest (re)delivery (or
	// InProgress/NAK-delay reset) to the ack. Zero for other kinds.
	AckTime time.Duration `json:"ack_time_ns,omitzero"`
	Reason  string        `json:"reason,omitempty"` // TERM reason
	At      time.Time     `json:"at"`               // the server's event timestamp
	// Inferred marks an ACK the monitor inferred from the consumer's ack
	// floor because no event told it (ack sampling below 100 %, or events
	// lost): At is when it was inferred; Deliveries and AckTime are 0, so
	// the row gets no ack time, and any ACK, TERM or MAX_DELIVERIES event
	// of the row takes precedence.
	Inferred bool `json:"inferred,omitempty"`
	// LateAck marks an ACK of a redelivery that the receiver acked without
	// handling it again (see [LateAckRule]): the delivery before it was
	// handled, and its ack was lost or came too late. The store sets it
	// when it first applies the event.
	LateAck bool `json:"late_ack,omitempty"`
}

// LateAckRule is when the store takes an ACK for one of a redelivery the
// receiver had already handled: agentkit acks such a redelivery at once,
// without running the handler, while a real retry runs it again. The ACK
// is real (not inferred), of delivery 2 or later, and its ack_time is at
// most LateAckRatio of the fastest first-delivery ACK among the latest
// LateAckSamples ACKed first deliveries of its row's consumer (receiver
// and priority), of which there are at least LateAckMinSamples: the
// redelivery was settled in a fraction of the time this consumer's
// handler has lately needed. A consumer whose handler is as fast as the
// duplicate path (well under a millisecond on one host) gives no evidence
// either way, and its redeliveries stay timeouts.
const (
	LateAckSamples    = 20
	LateAckMinSamples = 5
	LateAckRatio      = 0.5
)

// Key identifies a ledger row.
type Key struct {
	StreamSeq uint64
	Consumer  string
}

// Record is one ledger row (message_acknowledgments).
type Record struct {
	StreamSeq   uint64 `json:"stream_seq"`
	Consumer    string `json:"consumer"`
	MessageID   string `json:"message_id"`
	Sender      string `json:"sender_agent"`
	Receiver    string `json:"receiver_agent"`
	Priority    string `json:"priority"`
	Workflow    string `json:"workflow_execution_id,omitempty"`
	Correlation string `json:"correlation_id,omitempty"`
	InReplyTo   string `json:"in_reply_to,omitempty"`

	SentAt         time.Time `json:"sent_at,omitzero"`         // zero until the send is recorded
	AcknowledgedAt time.Time `json:"acknowledged_at,omitzero"` // ACK or NACK time
	ResolvedAt     time.Time `json:"resolved_at,omitzero"`     // time the status became final
	Status         string    `json:"ack_status"`
	NackReason     string    `json:"nack_reason,omitempty"`
	Deliveries     int       `json:"deliveries"`
	RetryCount     int       `json:"retry_count"` // deliveries − 1
	Naks           int       `json:"naks"`
	Timeouts       int       `json:"timeouts"`
	// LateAcks counts the redeliveries caused by a late or lost ack of a
	// delivery that was handled, not by a timeout: 1 when the final ACK
	// is a [Event.LateAck] (the redelivery it acked), else 0. They are
	// not in Timeouts.
	LateAcks int `json:"late_acks"`
	// NakExhausted marks a TIMEOUT row whose every delivery the receiver
	// NAKed (no delivery timed out): the handler asked for redelivery
	// until the attempts ran out.
	NakExhausted bool `json:"nak_exhausted,omitempty"`
	// ProcessingTime is the ack metric's ack_time of the acking delivery
	// (processing_time_ms in the ledger's terms).
	ProcessingTime time.Duration `json:"processing_time_ns,omitzero"`
	History        []Event       `json:"history"`

	HandledAt    time.Time `json:"handled_at,omitzero"`   // dead-lettering/escalation done
	EscalatedAt  time.Time `json:"escalated_at,omitzero"` // escalation sent
	Director     string    `json:"director,omitempty"`
	DLQSeq       uint64    `json:"dlq_seq,omitempty"`
	EscalationID string    `json:"escalation_id,omitempty"`
	// FollowUpAttempts counts the failed tries to follow the row up, and
	// FollowUpError is the last one's error.
	FollowUpAttempts int    `json:"follow_up_attempts,omitempty"`
	FollowUpError    string `json:"follow_up_error,omitempty"`
	// GivenUpAt is when the monitor gave the follow-up up, for
	// FollowUpError: the row is no longer due (PendingFollowUps).
	GivenUpAt time.Time `json:"given_up_at,omitzero"`
}

// Key returns the row's key.
func (r *Record) Key() Key { return Key{r.StreamSeq, r.Consumer} }

// Latency returns sent_at → acknowledged_at, or 0 when either is unknown.
func (r *Record) Latency() time.Duration {
	if r.SentAt.IsZero() || r.AcknowledgedAt.IsZero() {
		return 0
	}
	return r.AcknowledgedAt.Sub(r.SentAt)
}

// ackedWithSend reports whether the row has both its send time and an
// ACK with its time, so its Latency is known.
func (r *Record) ackedWithSend() bool {
	return r.Status == StatusACK && !r.AcknowledgedAt.IsZero() && !r.SentAt.IsZero()
}

// InferredAck reports whether an inferred ACK (Event.Inferred) decided the
// row: an ACK without acknowledged_at.
func (r *Record) InferredAck() bool { return r.Status == StatusACK && r.AcknowledgedAt.IsZero() }

// Final reports whether the row has its final status.
func (r *Record) Final() bool { return r.Status != StatusPending }

// recompute derives every outcome field from the history. Rules:
//   - naks = number of NAK events; deliveries = the largest delivery count seen;
//   - the final event is the ACK, TERM or MAX_DELIVERIES with the most
//     deliveries (ties: the later one; an inferred ACK has none, so it is
//     final only without any other): ACK → ACK, TERM → NACK (reason kept),
//     or INVALID when the reason starts with InvalidReasonPrefix,
//     MAX_DELIVERIES → TIMEOUT, even when the last attempt was NAKed (the
//     message was never handled: it is exhausted);
//   - timeouts = redeliveries not caused by a NAK: deliveries − 1 − naks,
//     and for an exhausted message the last attempt counts too unless NAKed
//     (deliveries − naks); never negative;
//   - late_acks = 1 when the final event is an ACK marked LateAck and a
//     redelivery was not caused by a NAK: that redelivery is taken out of
//     timeouts (its delivery was handled; its ack was lost or late).
func (r *Record) recompute() {
	r.Naks, r.Deliveries = 0, 0
	var final *Event
	for i := range r.History {
		e := &r.History[i]
		r.Deliveries = max(r.Deliveries, int(e.Deliveries))
		if e.Kind == EventNak {
			r.Naks++
			continue
		}
		if final == nil || e.Deliveries > final.Deliveries || e.Deliveries == final.Deliveries && e.At.After(final.At) {
			final = e
		}
	}
	r.RetryCount = max(r.Deliveries-1, 0)
	r.Status, r.NackReason, r.ProcessingTime = StatusPending, "", 0
	r.AcknowledgedAt, r.ResolvedAt = time.Time{}, time.Time{}
	r.Timeouts, r.LateAcks = max(r.Deliveries-1-r.Naks, 0), 0
	if final == nil {
		return
	}
	r.ResolvedAt = final.At
	switch final.Kind {
	case EventAck:
		r.Status, r.ProcessingTime = StatusACK, final.AckTime
		if !final.Inferred {
			r.AcknowledgedAt = final.At // an inferred ACK's time is only an upper bound
		}
		if final.LateAck && r.Timeouts > 0 {
			r.Timeouts, r.LateAcks = r.Timeouts-1, 1
		}
	case EventTerm:
		r.Status, r.AcknowledgedAt, r.NackReason = StatusNACK, final.At, final.Reason
		if strings.HasPrefix(final.Reason, InvalidReasonPrefix) {
			r.Status = StatusInvalid
		}
	case EventMax:
		r.Status = StatusTimeout
		r.Timeouts = max(r.Deliveries-r.Naks, 0)
	}
	r.NakExhausted = nakExhausted(r.Status, r.Timeouts)
}

// nakExhausted reports whether a row of status and timeouts was exhausted
// by NAKs alone; rates.go's nakExhaustedSQL is the same test in SQL.
func nakExhausted(status string, timeouts int) bool { return status == StatusTimeout && timeouts == 0 }

// hasEvent reports whether an event with id is in the history.
func (r *Record) hasEvent(id string) bool {
	return slices.ContainsFunc(r.History, func(h Event) bool { return h.ID == id })
}

// addEvent appends e unless an event with its id is in the history; it
// reports whether e was new.
func (r *Record) addEvent(e Event) bool {
	if r.hasEvent(e.ID) {
		return false
	}
	r.History = append(r.History, e)
	slices.SortStableFunc(r.History, func(a, b Event) int { return a.At.Compare(b.At) })
	return true
}

// Batch is what [Store.Apply] writes in one transaction.
type Batch struct {
	Sends  []Send
	Events []Event
	// Refused are events the ledger refused, which the monitor drops:
	// Apply records only their ids, rows and kinds (refused_events), and
	// [Store.Pending] leaves out the rows of refused TERM and
	// MAX_DELIVERIES events, whose outcome is lost, not an ACK to infer.
	Refused []Event
}

// empty reports whether b writes nothing.
func (b Batch) empty() bool { return len(b.Sends)+len(b.Events)+len(b.Refused) == 0 }

// Applied reports what a batch changed; replays report nothing.
type Applied struct {
	// NewSends are the sends not recorded before.
	NewSends []Send
	// NewEvents are the events not applied before.
	NewEvents []Event
	// Resolved are the rows that reached their final status in this batch.
	Resolved []Record
	// Acked are the rows that first have both their send time and an ACK
	// with its time (not inferred) in this batch: when the ACK came with
	// the send recorded, or the send after the ACK. Each row is here once,
	// whatever order its send and events arrive in, so the send-to-ACK
	// latency can be observed for every ACK exactly once.
	Acked []Record
}

// Rate aggregates one receiver and priority over a window: outcomes
// resolved in the window, sends made in it.
type Rate struct {
	Agent    string `json:"agent"`
	Priority string `json:"priority"`
	Sent     int64  `json:"sent"`
	Acked    int64  `json:"acked"`
	Nacked   int64  `json:"nacked"`
	// TimedOut counts every exhausted message (StatusTimeout), those
	// NakExhausted counts included.
	TimedOut int64 `json:"timed_out"`
	// NakExhausted counts the TimedOut messages whose every delivery the
	// receiver NAKed: an outcome of their own, in the resolved messages
	// but not in the timeout rate, since nothing timed out.
	NakExhausted int64 `json:"nak_exhausted"`
	// Invalid counts the messages the receiver terminated as invalid
	// input (StatusInvalid): their senders' failures, so they are not
	// among the resolved messages its rates divide by.
	Invalid  int64 `json:"invalid"`
	Pending  int64 `json:"pending"`
	Naks     int64 `json:"naks"`
	Timeouts int64 `json:"delivery_timeouts"`
	// LateAcks counts the redeliveries of messages the receiver had
	// handled, whose ack was lost or late (Record.LateAcks): not in
	// Timeouts.
	LateAcks     int64   `json:"late_acks"`
	AvgAckTimeMS float64 `json:"avg_ack_time_ms"` // mean ack metric ack_time of ACKs
	AvgLatencyMS float64 `json:"avg_latency_ms"`  // mean sent_at → acknowledged_at of ACKs
}

// Resolved returns the number of messages with a final outcome.
func (r Rate) Resolved() int64 { return r.Acked + r.Nacked + r.TimedOut }

func ratio(n, d int64) float64 {
	if d == 0 {
		return 0
	}
	return float64(n) / float64(d)
}

// AckRate returns ACKs / resolved messages (0 without samples).
func (r Rate) AckRate() float64 { return ratio(r.Acked, r.Resolved()) }

// NackRate returns NACKs / resolved messages.
func (r Rate) NackRate() float64 { return ratio(r.Nacked, r.Resolved()) }

// TimeoutRate returns TIMEOUTs that timed out (not NakExhausted) /
// resolved messages.
func (r Rate) TimeoutRate() float64 { return ratio(r.TimedOut-r.NakExhausted, r.Resolved()) }

// Merge adds o's counts to r (averages weighted by ACK counts).
func (r Rate) Merge(o Rate) Rate {
	if a := r.Acked + o.Acked; a > 0 {
		r.AvgAckTimeMS = (r.AvgAckTimeMS*float64(r.Acked) + o.AvgAckTimeMS*float64(o.Acked)) / float64(a)
		r.AvgLatencyMS = (r.AvgLatencyMS*float64(r.Acked) + o.AvgLatencyMS*float64(o.Acked)) / float64(a)
	}
	r.Sent += o.Sent
	r.Acked += o.Acked
	r.Nacked += o.Nacked
	r.TimedOut += o.TimedOut
	r.NakExhausted += o.NakExhausted
	r.Invalid += o.Invalid
	r.Pending += o.Pending
	r.Naks += o.Naks
	r.Timeouts += o.Timeouts
	r.LateAcks += o.LateAcks
	return r
}

// SenderRate aggregates the messages of one sender (the sender token of
// their subjects) that reached a final status in a window, per receiving
// consumer: a topic or broadcast message counts once per receiver.
type SenderRate struct {
	Sender   string `json:"sender"`
	Resolved int64  `json:"resolved"` // every final status, INVALID included
	Invalid  int64  `json:"invalid"`  // terminated as invalid input
}

// InvalidRate returns invalid / resolved messages (0 without samples).
func (r SenderRate) InvalidRate() float64 { return ratio(r.Invalid, r.Resolved) }

// Merge adds o's counts to r.
func (r SenderRate) Merge(o SenderRate) SenderRate {
	r.Resolved += o.Resolved
	r.Invalid += o.Invalid
	return r
}

// HourlyMetric is one acknowledgment_metrics row: messages sent to agent
// at priority during the hour starting at Hour, counted by the outcome
// they have reached so far.
type HourlyMetric struct {
	Agent    string    `json:"agent_id"`
	Priority string    `json:"priority"`
	Hour     time.Time `json:"hour_bucket"`
	Sent     int64     `json:"messages_sent"`
	Acked    int64     `json:"messages_acknowledged"`
	// TimedOut counts every exhausted message, those NakExhausted counts
	// included, as [Rate.TimedOut] does.
	TimedOut int64 `json:"messages_timeout"`
	// NakExhausted counts the TimedOut messages whose every delivery the
	// receiver NAKed (see [Rate.NakExhausted]).
	NakExhausted int64   `json:"messages_nak_exhausted"`
	Nacked       int64   `json:"messages_nack"`
	AvgAckTimeMS float64 `json:"avg_ack_time_ms"`
}

// Resolved returns the number of the hour's messages with a final outcome.
func (m HourlyMetric) Resolved() int64 { return m.Acked + m.Nacked + m.TimedOut }

// AckRate returns ACKs / resolved messages, as [Rate.AckRate].
func (m HourlyMetric) AckRate() float64 { return ratio(m.Acked, m.Resolved()) }

// NackRate returns NACKs / resolved messages, as [Rate.NackRate].
func (m HourlyMetric) NackRate() float64 { return ratio(m.Nacked, m.Resolved()) }

// TimeoutRate returns TIMEOUTs that timed out (not NakExhausted) /
// resolved messages, as [Rate.TimeoutRate] and the alerts count them.
func (m HourlyMetric) TimeoutRate() float64 { return ratio(m.TimedOut-m.NakExhausted, m.Resolved()) }

// Point is one step of a time series of resolved outcomes.
type Point struct {
	At           time.Time `json:"at"`
	Acked        int64     `json:"acked"`
	Nacked       int64     `json:"nacked"`
	TimedOut     int64     `json:"timed_out"`     // NakExhausted included
	NakExhausted int64     `json:"nak_exhausted"` // see Rate.NakExhausted
	Invalid      int64     `json:"invalid"`
	AvgAckTimeMS float64   `json:"avg_ack_time_ms"`
}

// Query selects ledger rows for [Store.Messages]; zero fields do not filter.
type Query struct {
	Receiver string
	Status   string // a final status: StatusACK, StatusNACK, StatusTimeout or StatusInvalid
	// Pending selects only rows without a final status (those of refused
	// events too, unlike [Store.Pending]), oldest first (key order), so the
	// rows pending longest come before those in flight.
	Pending    bool
	Escalated  bool // only rows with an escalation
	DeadLetter bool // only rows copied to the DLQ
	GivenUp    bool // only rows whose follow-up was given up, newest first
	Limit      int  // default 100
}

// DeadLetter is where the dead-letter copy of a row is stored.
type DeadLetter struct {
	Key    Key
	DLQSeq uint64
}

// FollowUp is the result of dead-lettering and escalating a row.
type FollowUp struct {
	Key          Key
	DLQSeq       uint64
	Director     string
	EscalationID string
	EscalatedAt  time.Time // zero when not escalated
	HandledAt    time.Time
}

// FollowUpFailure is a failed try to follow a row up.
type FollowUpFailure struct {
	Key    Key
	Reason string // the try's error (FollowUpError)
	At     time.Time
	// GiveUp says no try will succeed: the row is given up at At.
	GiveUp bool
}

// Alert is one raised alert; it stays in the store after it is resolved.
type Alert struct {
	ID         string    `json:"id"`
	Agent      string    `json:"agent"`    // the receiver, or for "invalid_rate" the sender
	Kind       string    `json:"kind"`     // "ack_rate", "timeout_rate" or "invalid_rate"
	Severity   string    `json:"severity"` // "warning" or "critical"
	Value      float64   `json:"value"`
	Threshold  float64   `json:"threshold"`
	Samples    int64     `json:"samples"`
	RaisedAt   time.Time `json:"raised_at"`
	ResolvedAt time.Time `json:"resolved_at,omitzero"`
}

// Active reports whether the alert is not resolved.
func (a Alert) Active() bool { return a.ResolvedAt.IsZero() }

// AgentHealth is the monitor's view of an agent's availability.
type AgentHealth struct {
	Agent            string    `json:"agent"`
	UnavailableSince time.Time `json:"unavailable_since,omitzero"` // zero: available
	Reason           string    `json:"reason,omitempty"`
	UpdatedAt        time.Time `json:"updated_at"`
}

// Store is the ledger. Implementations are safe for concurrent use.
type Store interface {
	// Apply records sends and events in one transaction; replays are no-ops.
	// An empty batch records nothing but still commits a write: it checks
	// that the store takes writes, to each table a batch writes.
	Apply(ctx context.Context, b Batch) (Applied, error)
	// Get returns one ledger row or [ErrNotFound].
	Get(ctx context.Context, k Key) (Record, error)
	// Messages returns ledger rows, newest first (Query.Pending: oldest
	// first).
	Messages(ctx context.Context, q Query) ([]Record, error)
	// CountPending returns the number of rows without a final status whose
	// message was sent (sent_at) before the given time; rows without a
	// recorded send are not counted.
	CountPending(ctx context.Context, sentBefore time.Time) (int64, error)
	// Rates aggregates per receiver and priority since the given time
	// (the zero time: everything).
	Rates(ctx context.Context, since time.Time) ([]Rate, error)
	// SenderRates aggregates the rows resolved since the given time (the
	// zero time: every final row) per sender, in sender order; rows
	// whose sender is not known yet (no send recorded) are left out.
	SenderRates(ctx context.Context, since time.Time) ([]SenderRate, error)
	// Series returns resolved outcomes since the given time in steps,
	// optionally for one receiver.
	Series(ctx context.Context, agent string, since time.Time, step time.Duration) ([]Point, error)
	// Rollup brings acknowledgment_metrics up to date for every hour that
	// changed since the last rollup.
	Rollup(ctx context.Context) error
	// Hourly returns acknowledgment_metrics rows from the given hour on.
	Hourly(ctx context.Context, since time.Time) ([]HourlyMetric, error)
	// Pending returns up to limit rows without a final status, in key
	// order (stream sequence, then consumer), after the key after; rows
	// with a refused TERM or MAX_DELIVERIES event (Batch.Refused) are left
	// out.
	Pending(ctx context.Context, after Key, limit int) ([]Record, error)
	// PendingFollowUps returns up to limit final TIMEOUT, NACK and INVALID
	// rows not yet followed up nor given up, in key order (stream sequence, then consumer),
	// after the key after.
	PendingFollowUps(ctx context.Context, after Key, limit int) ([]Record, error)
	// RecordDeadLetters records, in one transaction, where the dead-letter
	// copies of rows pending follow-up are stored, so a retried follow-up
	// does not copy them again. Rows that exist are written; when some
	// key has no row, the error matches [ErrNotFound].
	RecordDeadLetters(ctx context.Context, ds []DeadLetter) error
	// CompleteFollowUps records, in one transaction, the dead letters and
	// escalations of rows; missing rows as for RecordDeadLetters.
	CompleteFollowUps(ctx context.Context, fs []FollowUp) error
	// FailFollowUps records, in one transaction, failed tries to follow
	// rows up: each counts in the row's FollowUpAttempts, its reason
	// replaces FollowUpError, and one that gives up sets GivenUpAt;
	// missing rows as for RecordDeadLetters.
	FailFollowUps(ctx context.Context, fs []FollowUpFailure) error
	// MarkUnavailable marks agent potentially unavailable since at; a later
	// ACK from the agent (in Apply) marks it available again.
	MarkUnavailable(ctx context.Context, agent, reason string, at time.Time) error
	// Health returns every agent the monitor has marked.
	Health(ctx context.Context) ([]AgentHealth, error)
	// SaveAlert inserts or updates an alert by id.
	SaveAlert(ctx context.Context, a Alert) error
	// Alerts returns alerts, newest first; activeOnly drops resolved ones.
	Alerts(ctx context.Context, activeOnly bool, limit int) ([]Alert, error)
	// Close releases the database.
	Close() error
}
