package ackmonitor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/ackmonitor/store"
	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// ActionEscalation is the action of the envelope the monitor sends to a
// sender's director when a message is exhausted (seed 000: "escalate to
// parent director").
const ActionEscalation = agentkit.ActionEscalation

// Headers the monitor adds to a dead letter; the original's headers are kept.
const (
	HeaderDLQReason     = "Mesh-Dlq-Reason"      // "max_deliveries" or "terminated: <TERM reason>"
	HeaderDLQStatus     = "Mesh-Dlq-Status"      // TIMEOUT, NACK or INVALID
	HeaderDLQDeliveries = "Mesh-Dlq-Deliveries"  // delivery attempts made
	HeaderDLQConsumer   = "Mesh-Dlq-Consumer"    // the consumer that gave up
	HeaderDLQStreamSeq  = "Mesh-Dlq-Stream-Seq"  // the original's sequence in the message stream
	HeaderDLQSubject    = "Mesh-Dlq-Subject"     // the original subject
	HeaderDLQOriginalID = "Mesh-Dlq-Original-Id" // the original Nats-Msg-Id (message_id)
)

// Escalation is the payload of an escalation envelope; the type lives in
// agentkit so directors need not import the monitor.
type Escalation = agentkit.Escalation

// DirectorResolver names the director an agent escalates to.
type DirectorResolver interface {
	Director(ctx context.Context, agent string) (string, error)
}

// DirectorFunc adapts a function to [DirectorResolver].
type DirectorFunc func(ctx context.Context, agent string) (string, error)

// Director calls f.
func (f DirectorFunc) Director(ctx context.Context, agent string) (string, error) {
	return f(ctx, agent)
}

// RegistryDirectors resolves directors from the agent registry: the JSON
// field "director" of key <agent> in KV bucket Bucket or, failing that, of
// the first instance key "agent.<agent>.<instance>" (agentkit's registry
// layout); Default when the bucket, the keys or the field are missing.
type RegistryDirectors struct {
	JS      jetstream.JetStream
	Bucket  string
	Default string

	mu sync.Mutex
	kv jetstream.KeyValue
}

// Director implements [DirectorResolver].
func (r *RegistryDirectors) Director(ctx context.Context, agent string) (string, error) {
	r.mu.Lock()
	kv := r.kv
	r.mu.Unlock()
	if kv == nil {
		var err error
		kv, err = r.JS.KeyValue(ctx, r.Bucket)
		if errors.Is(err, jetstream.ErrBucketNotFound) {
			return r.Default, nil
		}
		if err != nil {
			return "", fmt.Errorf("ackmonitor: registry %s: %w", r.Bucket, err)
		}
		r.mu.Lock()
		r.kv = kv
		r.mu.Unlock()
	}
	if d, err := directorAt(ctx, kv, agent); d != "" || err != nil {
		return d, err
	}
	filter, err := subjects.InstancesFilter(agent)
	if err != nil {
		return "", fmt.Errorf("ackmonitor: registry %s: %w", r.Bucket, err)
	}
	lister, err := kv.ListKeysFiltered(ctx, filter)
	if err != nil && !errors.Is(err, jetstream.ErrNoKeysFound) {
		return "", fmt.Errorf("ackmonitor: registry %s: %w", r.Bucket, err)
	}
	if err == nil {
		defer lister.Stop()
		for key := range lister.Keys() {
			if d, err := directorAt(ctx, kv, key); d != "" || err != nil {
				return d, err
			}
		}
	}
	return r.Default, nil
}

// directorAt returns the "director" field of key, or "" when the key or
// the field is missing.
func directorAt(ctx context.Context, kv jetstream.KeyValue, key string) (string, error) {
	e, err := kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("ackmonitor: registry key %s: %w", key, err)
	}
	var rec struct {
		Director string `json:"director"`
	}
	if json.Unmarshal(e.Value(), &rec) != nil {
		return "", nil
	}
	return rec.Director, nil
}

// followUpLoop dead-letters and escalates final TIMEOUT, NACK and INVALID rows. It
// runs only while this instance is active; rows stay pending in the store
// until done, so a restart or a failover resumes where it stopped.
//
// After a takeover or a restart with events still held by the previous
// pin holder (fetched and never acked: it died, or its pull request was
// still open on the server when it did), it starts only AckWait later,
// when the server has redelivered those events, and once the events
// intake has written them: it waits for a batch whose pull went out after
// that time. A row followed up before would be escalated with part of its
// history, e.g. a NAK counted as a timeout.
func (m *Monitor) followUpLoop(ctx context.Context) {
	t := time.NewTicker(max(m.cfg.EvaluateInterval, time.Second))
	defer t.Stop()
	retries := map[store.Key]followUpRetry{}
	for {
		select {
		case <-ctx.Done():
			return
		case <-m.kick:
		case <-t.C:
		}
		if !m.Active() || m.eventsThrough.Load() < m.followUpAt.Load() {
			continue
		}
		m.followUpPass(ctx, retries)
	}
}

// followUpRetry is when a row whose follow-up failed is tried again.
type followUpRetry struct {
	at   time.Time
	wait time.Duration // doubles per failure, up to maxFollowUpWait
}

// maxFollowUpWait bounds the wait before a failed follow-up's next try.
const maxFollowUpWait = time.Minute

// followUpPass follows up every row due, in key order, skipping rows
// whose last try failed until their retry time: rows that keep failing
// (a sender without a director, an original gone) do not hold up the
// rows behind them. retries is the follow-up loop's own; rows no longer
// due leave it.
func (m *Monitor) followUpPass(ctx context.Context, retries map[store.Key]followUpRetry) {
	const page = 64
	seen := make(map[store.Key]bool, len(retries))
	after := store.Key{}
	for ctx.Err() == nil {
		recs, err := m.cfg.Store.PendingFollowUps(ctx, after, page)
		if err != nil {
			if ctx.Err() == nil {
				m.cfg.Logger.Warn("pending follow-ups", "err", err)
			}
			return // retries kept as they are
		}
		for _, r := range recs {
			k := r.Key()
			after, seen[k] = k, true
			retry, failedBefore := retries[k]
			if failedBefore && time.Now().Before(retry.at) {
				continue
			}
			err := m.followUp(ctx, r)
			if err == nil {
				delete(retries, k)
				continue
			}
			if ctx.Err() != nil {
				return
			}
			retry.wait = min(max(2*retry.wait, m.cfg.EvaluateInterval, time.Second), maxFollowUpWait)
			retries[k] = followUpRetry{at: time.Now().Add(retry.wait), wait: retry.wait}
			m.metrics.followUpErr.Inc()
			m.cfg.Logger.Warn("follow-up failed; will retry", "stream_seq", r.StreamSeq, "consumer", r.Consumer, "in", retry.wait, "err", err)
		}
		if len(recs) < page {
			break
		}
	}
	for k := range retries {
		if !seen[k] {
			delete(retries, k) // followed up by another instance, or gone
		}
	}
}

// followedUp reports whether rows of status are dead-lettered (and maybe
// escalated): every final status but ACK.
func followedUp(status string) bool {
	return status == store.StatusTimeout || status == store.StatusNACK || status == store.StatusInvalid
}

// deadLetterID is the Nats-Msg-Id of the dead-letter copy of r, so a
// retried copy is deduplicated: what identifies the row, the original's
// stream and sequence and the consumer. The message id would not do: the
// sender sets it, or leaves it out, and copies of different messages
// under one id were dropped as duplicates.
func (m *Monitor) deadLetterID(r store.Record) string {
	return m.cfg.Scheme.Stream() + ":" + strconv.FormatUint(r.StreamSeq, 10) + ":" + r.Consumer
}

// escalationID is the deterministic message id of the escalation of one
// row, so a retried or repeated escalation is deduplicated by the stream.
func escalationID(r store.Record) string {
	return uuid.NewSHA1(uuid.NameSpaceURL, []byte("agentmesh:escalation:"+strconv.FormatUint(r.StreamSeq, 10)+":"+r.Consumer)).String()
}

// copyTimeout bounds each request of a dead-letter copy (reading the
// original, storing the copy). A request that meets a stream leader change
// can go unanswered, and follow-ups run one after another: waiting out
// the whole follow-up's 15s held up every other dead letter and
// escalation (seen in e2e's DLQ step-down test). A copy that times out is
// made again at the next try, under the same message id.
const copyTimeout = 2 * time.Second

// followUp dead-letters r and, for exhausted messages (and terminated ones
// when configured), escalates it and marks the receiver potentially
// unavailable.
func (m *Monitor) followUp(ctx context.Context, r store.Record) error {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	rctx, rcancel := context.WithTimeout(ctx, copyTimeout)
	orig, err := m.mesh.GetMsg(rctx, r.StreamSeq)
	rcancel()
	if err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		return fmt.Errorf("ackmonitor: read original %d: %w", r.StreamSeq, err)
	}
	esc := Escalation{Reason: "max_deliveries", MessageID: r.MessageID, Sender: r.Sender, Receiver: r.Receiver,
		Consumer: r.Consumer, Priority: r.Priority, StreamSeq: r.StreamSeq, Attempts: r.Deliveries, Naks: r.Naks,
		Timeouts: r.Timeouts, CorrelationID: r.Correlation, WorkflowID: r.Workflow, InReplyTo: r.InReplyTo,
		SentAt: r.SentAt, FailedAt: r.ResolvedAt, Reasons: []string{}}
	if r.Status != store.StatusTimeout {
		esc.Reason = "terminated"
	}
	for _, e := range r.History {
		switch e.Kind {
		case store.EventNak:
			esc.Reasons = append(esc.Reasons, fmt.Sprintf("delivery %d: NAK", e.Deliveries))
		case store.EventTerm:
			esc.Reasons = append(esc.Reasons, fmt.Sprintf("delivery %d: TERM %s", e.Deliveries, e.Reason))
		case store.EventMax:
			esc.Reasons = append(esc.Reasons, fmt.Sprintf("delivery %d: MAX_DELIVERIES", e.Deliveries))
		}
	}
	var origHeader nats.Header
	var body []byte
	if orig != nil {
		origHeader, body = orig.Header, orig.Data
		esc.Subject = orig.Subject
		if sub, err := m.cfg.Scheme.Parse(orig.Subject); err == nil {
			esc.Sender = sub.Sender
		}
		h := orig.Header
		esc.MessageID = first(esc.MessageID, h.Get(agentkit.HeaderMsgID))
		esc.CorrelationID = first(esc.CorrelationID, h.Get(agentkit.HeaderCorrelation))
		esc.WorkflowID = first(esc.WorkflowID, h.Get(agentkit.HeaderWorkflow))
		esc.InReplyTo = first(esc.InReplyTo, h.Get(agentkit.HeaderInReplyTo))
		if json.Valid(orig.Data) {
			esc.Original = orig.Data
		}
		if esc.SentAt.IsZero() {
			esc.SentAt = orig.Time.UTC()
		}
	}
	// Peers wrote these: the escalation carries them bounded.
	for _, f := range []*string{&esc.MessageID, &esc.CorrelationID, &esc.WorkflowID, &esc.InReplyTo, &esc.Subject} {
		*f = clip(*f, maxHeaderValue)
	}
	for i := range esc.Reasons {
		esc.Reasons[i] = clip(esc.Reasons[i], maxHeaderValue)
	}
	if esc.Sender == "" {
		return fmt.Errorf("ackmonitor: %d/%s: sender unknown (original gone and send not recorded yet)", r.StreamSeq, r.Consumer)
	}
	reason := esc.Reason
	if r.Status != store.StatusTimeout {
		reason = "terminated: " + r.NackReason
	}
	dlqSubject, err := m.cfg.Scheme.DLQ(r.Receiver, r.Priority, esc.Sender)
	if err != nil {
		return fmt.Errorf("ackmonitor: dead-letter subject: %w", err)
	}
	ours := nats.Header{}
	ours.Set(jetstream.MsgIDHeader, m.deadLetterID(r))
	ours.Set(HeaderDLQOriginalID, esc.MessageID)
	ours.Set(HeaderDLQReason, reason)
	ours.Set(HeaderDLQStatus, r.Status)
	ours.Set(HeaderDLQDeliveries, strconv.Itoa(r.Deliveries))
	ours.Set(HeaderDLQConsumer, r.Consumer)
	ours.Set(HeaderDLQStreamSeq, strconv.FormatUint(r.StreamSeq, 10))
	ours.Set(HeaderDLQSubject, esc.Subject)
	esc.DLQSubject, esc.DLQSeq = dlqSubject, r.DLQSeq
	if r.DLQSeq == 0 { // a retry skips what an earlier try recorded
		msg := deadLetterMsg(dlqSubject, origHeader, body, ours, m.nc.MaxPayload())
		if esc.DLQSeq, err = m.deadLetter(ctx, r, msg); err != nil {
			return err
		}
	}
	now := time.Now().UTC()
	f := store.FollowUp{Key: r.Key(), DLQSeq: esc.DLQSeq, HandledAt: now}
	escalate := r.Status == store.StatusTimeout || r.Status == store.StatusNACK && m.cfg.EscalateTerminated
	if esc.Sender == m.cfg.MonitorID {
		escalate = false // an escalation that failed is not escalated again
	}
	if escalate {
		director, err := m.cfg.Directors.Director(ctx, esc.Sender)
		if err != nil {
			return err
		}
		payload, err := json.Marshal(esc)
		if err != nil {
			return fmt.Errorf("ackmonitor: escalation payload: %w", err)
		}
		env := agentkit.NewEnvelope(agentkit.TypeNotification, m.cfg.MonitorID, ActionEscalation)
		env.MessageID = escalationID(r)
		env.ReceiverID = director
		env.Priority = agentkit.PriorityHigh
		if c := first(envelopeID(esc.CorrelationID), envelopeID(esc.MessageID)); c != "" {
			env.Correlation = c
		}
		env.WorkflowID = envelopeID(esc.WorkflowID)
		env.Payload = payload
		if err := m.sender.SendEnvelope(ctx, env); err != nil {
			return fmt.Errorf("ackmonitor: escalate %d/%s to %s: %w", r.StreamSeq, r.Consumer, director, err)
		}
		f.Director, f.EscalationID, f.EscalatedAt = director, env.MessageID, now
		m.metrics.escalations.WithLabelValues(r.Receiver, r.Priority).Inc()
		m.cfg.Logger.Info("escalated", "message_id", esc.MessageID, "receiver", r.Receiver, "sender", esc.Sender,
			"director", director, "attempts", r.Deliveries)
	}
	// Recorded even when Run is stopping: the escalation has gone out.
	wctx, wcancel := detached(ctx)
	defer wcancel()
	if err := m.cfg.Store.CompleteFollowUp(wctx, f); err != nil {
		return fmt.Errorf("ackmonitor: %w", err)
	}
	return nil
}

// detached returns a context for recording what has been done, which
// Run's stopping must not cut short, bounded by copyTimeout.
func detached(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), copyTimeout)
}

// deadLetter stores the dead-letter copy of r, marks an exhausted
// message's receiver potentially unavailable and records the copy in the
// store, which a retry of the rest of the follow-up reads: the copy is
// deduplicated by the DLQ stream only within its duplicate window, and
// the mark would overrule the receiver's ACKs since.
func (m *Monitor) deadLetter(ctx context.Context, r store.Record, msg *nats.Msg) (uint64, error) {
	pctx, pcancel := context.WithTimeout(ctx, copyTimeout)
	ack, err := m.js.PublishMsg(pctx, msg)
	pcancel()
	if err != nil {
		return 0, fmt.Errorf("ackmonitor: dead-letter %d/%s: %w", r.StreamSeq, r.Consumer, err)
	}
	if !ack.Duplicate {
		m.metrics.deadLetters.WithLabelValues(r.Receiver, r.Priority).Inc()
	}
	if r.Status == store.StatusTimeout {
		why := fmt.Sprintf("message %d exhausted %d deliveries on %s", r.StreamSeq, r.Deliveries, r.Consumer)
		if err := m.cfg.Store.MarkUnavailable(ctx, r.Receiver, why, time.Now().UTC()); err != nil {
			return 0, err
		}
		if m.cfg.UnavailableFor > 0 {
			// Best effort: the store's mark is the monitor's record; a mesh
			// without a registry has nobody to tell.
			if err := agentkit.MarkUnavailable(ctx, m.js, m.cfg.Scheme, r.Receiver, m.cfg.MonitorID, why, m.cfg.UnavailableFor); err != nil {
				m.cfg.Logger.Warn("registry unavailable mark failed", "agent", r.Receiver, "err", err)
			}
		}
	}
	wctx, wcancel := detached(ctx)
	defer wcancel()
	if err := m.cfg.Store.RecordDeadLetter(wctx, r.Key(), ack.Sequence); err != nil {
		return 0, fmt.Errorf("ackmonitor: %w", err)
	}
	return ack.Sequence, nil
}

func first(vs ...string) string {
	for _, v := range vs {
		if v != "" {
			return v
		}
	}
	return ""
}
