package ackmonitor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/ackmonitor/store"
	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/registry"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/dlq"
	"github.com/agentmesh-io/agentmesh/internal/bound"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// followUps dead-letters and escalates final TIMEOUT, NACK and INVALID
// rows (run), and gives up on those that keep failing (failed).
type followUps struct {
	cfg     *Config
	nc      *nats.Conn
	js      jetstream.JetStream // the registry's unavailable marks
	dlq     jetstream.JetStream // stores dead-letter copies (batch)
	sender  *agentkit.Agent     // sends escalations
	metrics *metrics
	lease   *lease
	kick    chan struct{} // wakes run

	// startAt (UnixNano) holds follow-ups back after a takeover; see run.
	startAt atomic.Int64
	// eventsThrough (UnixNano) is when the events intake sent the pull
	// of its last batch written in full: every event delivered to this
	// instance before then is in the ledger.
	eventsThrough atomic.Int64
}

// wake wakes run: a row may be due.
func (f *followUps) wake() {
	select {
	case f.kick <- struct{}{}:
	default:
	}
}

// startFrom holds follow-ups back, after a takeover, until from and until
// the events intake has written the events delivered before from.
func (f *followUps) startFrom(from time.Time) {
	f.startAt.Store(from.UnixNano())
	f.wake()
}

// eventsWritten records that every event delivered to this instance
// before pulled (UnixNano, when the events intake sent a pull) is in the
// ledger. run waits for this after a takeover: it is woken, not left to
// its next tick.
func (f *followUps) eventsWritten(pulled int64) {
	if at := f.startAt.Load(); f.eventsThrough.Swap(pulled) < at && pulled >= at {
		f.wake()
	}
}

// stop stops the escalations' sender; run has returned.
func (f *followUps) stop() { f.sender.Stop() }

// run dead-letters and escalates final TIMEOUT, NACK and INVALID rows,
// reading the originals from mesh. It acts only while this instance is
// active; rows stay pending in the store until done, so a restart or a
// failover resumes where it stopped.
//
// After a takeover or a restart with events still held by the previous
// pin holder (fetched and never acked: it died, or its pull request was
// still open on the server when it did), it starts only AckWait later,
// when the server has redelivered those events, and once the events
// intake has written them: it waits for a batch whose pull went out after
// that time (startFrom, eventsWritten). A row followed up before would be
// escalated with part of its history, e.g. a NAK counted as a timeout.
func (f *followUps) run(ctx context.Context, mesh jetstream.Stream) {
	t := time.NewTicker(max(f.cfg.EvaluateInterval, time.Second))
	defer t.Stop()
	retries := map[store.Key]followUpRetry{}
	for {
		select {
		case <-ctx.Done():
			return
		case <-f.kick:
		case <-t.C:
		}
		if !f.lease.Active() || f.eventsThrough.Load() < f.startAt.Load() {
			continue
		}
		f.pass(ctx, mesh, retries)
	}
}

// followUpRetry is when a row whose follow-up failed is tried again.
type followUpRetry struct {
	at   time.Time
	wait time.Duration // doubles per failure, up to maxFollowUpWait
}

// maxFollowUpWait bounds the wait before a failed follow-up's next try.
const maxFollowUpWait = time.Minute

// followUpPage is how many rows a pass reads from the store at a time and
// follows up together (batch). Following rows up one at a time,
// each waiting for its own requests and ledger writes, could not keep
// pace with a receiver that terminates a burst, least of all on a
// cluster, where each request waits for the stream's replicas.
const followUpPage = 256

// followUpWorkers bounds the requests a batch has in flight at once when
// it reads originals and sends escalations.
const followUpWorkers = 32

// pass follows up every row due, in key order, a page at a time,
// skipping rows whose last try failed until their retry time: rows that
// keep failing (a sender without a director, an original gone) do not
// hold up the rows behind them. retries is run's own; rows no longer due
// leave it.
func (f *followUps) pass(ctx context.Context, mesh jetstream.Stream, retries map[store.Key]followUpRetry) {
	seen := make(map[store.Key]bool, len(retries))
	after := store.Key{}
	for ctx.Err() == nil {
		recs, err := f.cfg.Store.PendingFollowUps(ctx, after, followUpPage)
		if err != nil {
			if ctx.Err() == nil {
				f.cfg.Logger.Warn("pending follow-ups", "err", err)
			}
			return // retries kept as they are
		}
		now := time.Now()
		due := make([]store.Record, 0, len(recs))
		for _, r := range recs {
			k := r.Key()
			after, seen[k] = k, true
			if retry, failedBefore := retries[k]; failedBefore && now.Before(retry.at) {
				continue
			}
			due = append(due, r)
		}
		tasks := f.batch(ctx, mesh, due)
		if ctx.Err() != nil {
			return
		}
		f.failed(ctx, tasks, retries)
		if len(recs) < followUpPage {
			break
		}
	}
	for k := range retries {
		if !seen[k] {
			delete(retries, k) // followed up by another instance, or gone
		}
	}
}

// failed records the batch's failed tries: each counts in its row, and a
// row whose failure is permanent, or that has had FollowUpAttempts
// tries, is given up; the others are tried again later (retries). When
// the ledger does not take the record, the tries go uncounted and a row
// to give up is tried again like the others.
func (f *followUps) failed(ctx context.Context, tasks []*followUpTask, retries map[store.Key]followUpRetry) {
	now := time.Now()
	var fs []store.FollowUpFailure
	var failed []*followUpTask
	for _, t := range tasks {
		if t.err == nil {
			delete(retries, t.r.Key())
			continue
		}
		f.metrics.followUpErr.Inc()
		fs = append(fs, store.FollowUpFailure{Key: t.r.Key(), Reason: bound.Clip(t.err.Error(), maxHeaderValue), At: now.UTC(),
			GiveUp: permanent(t.err) || t.r.FollowUpAttempts+1 >= f.cfg.FollowUpAttempts})
		failed = append(failed, t)
	}
	if len(fs) == 0 {
		return
	}
	wctx, cancel := detached(ctx)
	err := f.cfg.Store.FailFollowUps(wctx, fs)
	cancel()
	recorded := err == nil || errors.Is(err, store.ErrNotFound)
	if !recorded {
		f.cfg.Logger.Warn("recording failed follow-ups", "n", len(fs), "err", err)
	}
	for i, t := range failed {
		k, attempts := t.r.Key(), t.r.FollowUpAttempts+1
		if fs[i].GiveUp && recorded {
			delete(retries, k)
			f.metrics.givenUp.WithLabelValues(t.r.Receiver, t.r.Priority).Inc()
			f.countInvalid(t)
			f.cfg.Logger.Error("follow-up given up", "stream_seq", t.r.StreamSeq, "consumer", t.r.Consumer, "attempts", attempts,
				"dead_lettered", t.done.DLQSeq != 0, "err", t.err)
			continue
		}
		retry := retries[k]
		retry.wait = min(max(2*retry.wait, f.cfg.EvaluateInterval, time.Second), maxFollowUpWait)
		retries[k] = followUpRetry{at: now.Add(retry.wait), wait: retry.wait}
		f.cfg.Logger.Warn("follow-up failed; will retry", "stream_seq", t.r.StreamSeq, "consumer", t.r.Consumer,
			"attempts", attempts, "in", retry.wait, "err", t.err)
	}
}

// permanent reports whether a follow-up that failed with err fails at
// every try: the stream refuses the copy as such (a bad request, not an
// outage), nats.go refuses to send it, the row makes no valid subject, or
// agentkit refuses the escalation envelope.
func permanent(err error) bool {
	var api *jetstream.APIError
	return errors.As(err, &api) && api.Code == 400 ||
		errors.Is(err, nats.ErrMaxPayload) || errors.Is(err, nats.ErrBadHeaderMsg) ||
		errors.Is(err, subjects.ErrInvalidToken) || errors.Is(err, wire.ErrInvalidEnvelope) ||
		errors.Is(err, errPermanent)
}

// errPermanent marks a follow-up error that no try can change.
var errPermanent = errors.New("permanent")

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
func (f *followUps) deadLetterID(r store.Record) string {
	return f.cfg.Scheme.Stream() + ":" + strconv.FormatUint(r.StreamSeq, 10) + ":" + r.Consumer
}

// escalationID is the deterministic message id of the escalation of one
// row, so a retried or repeated escalation is deduplicated by the stream.
func escalationID(r store.Record) string {
	return uuid.NewSHA1(uuid.NameSpaceURL, []byte("agentmesh:escalation:"+strconv.FormatUint(r.StreamSeq, 10)+":"+r.Consumer)).String()
}

// copyTimeout bounds each request of a follow-up: reading an original,
// storing a copy (its ack). A request that meets a stream leader change
// can go unanswered; the rows it leaves undone are tried again, their
// copies under the same message ids.
const copyTimeout = 2 * time.Second

// readTimeout bounds the read of a row's original after attempts failed
// tries: copyTimeout, doubled with each failure up to 30s. An original
// near the max payload can take longer than copyTimeout to serve on a
// busy server; with a fixed bound every retry would fail the same way.
func readTimeout(attempts int) time.Duration {
	return min(copyTimeout<<min(max(attempts, 0), 4), 30*time.Second)
}

// recordTimeout bounds a follow-up's ledger write. It waits for the
// intakes' writes (SQLite takes one writer at a time), which take long
// under load: a write that gave up after copyTimeout failed a whole batch
// whose copies were stored, again at every try.
const recordTimeout = 30 * time.Second

// escalateTimeout bounds a batch's escalations: the director lookups and
// the sends, which agentkit retries while the mesh stream has no leader.
const escalateTimeout = 15 * time.Second

// followUpTask is one row of a batch and what its follow-up has come to.
type followUpTask struct {
	r    store.Record
	orig *jetstream.RawStreamMsg // nil: gone from the stream
	esc  Escalation
	// copy is the dead letter to store, nil when the row records it
	// already (an earlier try stored it).
	copy     *nats.Msg
	escalate bool
	done     store.FollowUp // completes the row
	err      error          // the row stays due
}

// fail records the first error of t.
func (t *followUpTask) fail(err error) {
	if t.err == nil {
		t.err = err
	}
}

// batch follows up rows together, each step for every row of the
// batch at once: read the originals (concurrently), store the copies
// (published without waiting for each other's acks), mark the receivers
// of exhausted messages, record the copies of rows to escalate (one
// ledger write), escalate (concurrently), then complete every row done
// (one ledger write). A row that fails a step goes no further and keeps
// its error; the others go on.
// The originals are read from mesh.
func (f *followUps) batch(ctx context.Context, mesh jetstream.Stream, rows []store.Record) []*followUpTask {
	tasks := make([]*followUpTask, len(rows))
	for i, r := range rows {
		tasks[i] = &followUpTask{r: r, done: store.FollowUp{Key: r.Key(), DLQSeq: r.DLQSeq}}
	}
	if len(tasks) == 0 {
		return tasks
	}
	parallel(len(tasks), followUpWorkers, func(i int) {
		t := tasks[i]
		rctx, cancel := context.WithTimeout(ctx, readTimeout(t.r.FollowUpAttempts))
		defer cancel()
		orig, err := mesh.GetMsg(rctx, t.r.StreamSeq)
		if err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
			t.fail(fmt.Errorf("ackmonitor: read original %d: %w", t.r.StreamSeq, err))
			return
		}
		t.orig = orig
	})
	for _, t := range tasks {
		if t.err == nil {
			f.prepare(t)
		}
	}
	f.storeCopies(ctx, tasks)
	f.markExhausted(ctx, tasks)
	now := time.Now().UTC()
	var copied []store.DeadLetter
	for _, t := range tasks {
		if t.err == nil && t.escalate && t.copy != nil {
			copied = append(copied, store.DeadLetter{Key: t.r.Key(), DLQSeq: t.done.DLQSeq})
		}
	}
	// A retry reads the copies recorded here: the DLQ stream deduplicates
	// only within its window, and the receivers' marks would overrule
	// their ACKs since.
	f.record(ctx, tasks, func(t *followUpTask) bool { return t.escalate && t.copy != nil }, func(c context.Context) error {
		return f.cfg.Store.RecordDeadLetters(c, copied)
	})
	f.escalateAll(ctx, tasks, now)
	var done []store.FollowUp
	for _, t := range tasks {
		if t.err == nil {
			t.done.HandledAt = now
			done = append(done, t.done)
		}
	}
	// Recorded even when Run is stopping: the escalations have gone out.
	f.record(ctx, tasks, func(*followUpTask) bool { return true }, func(c context.Context) error {
		return f.cfg.Store.CompleteFollowUps(c, done)
	})
	for _, t := range tasks {
		if t.err == nil {
			f.countInvalid(t)
		}
	}
	return tasks
}

// countInvalid counts t's message in ackmonitor_invalid_messages_total if
// its receiver terminated it as invalid input; t's follow-up is over.
// Its sender is the subject's, as prepare read it from the original, else
// the one the ledger recorded with the send.
func (f *followUps) countInvalid(t *followUpTask) {
	if t.r.Status == store.StatusInvalid {
		f.metrics.invalid.WithLabelValues(first(t.esc.Sender, t.r.Sender, UnknownSender), t.r.Priority).Inc()
	}
}

// record runs write, a ledger write of the tasks without an error for
// which of reports true, on a context Run's stopping does not cut short;
// when it fails, those tasks fail. A row the ledger no longer has is not
// followed up again either way.
func (f *followUps) record(ctx context.Context, tasks []*followUpTask, of func(*followUpTask) bool, write func(context.Context) error) {
	n := 0
	for _, t := range tasks {
		if t.err == nil && of(t) {
			n++
		}
	}
	if n == 0 {
		return
	}
	wctx, cancel := detached(ctx)
	defer cancel()
	err := write(wctx)
	if errors.Is(err, store.ErrNotFound) {
		f.cfg.Logger.Warn("follow-ups of rows the ledger no longer has", "err", err)
		return
	}
	if err != nil {
		err = fmt.Errorf("ackmonitor: %w", err)
		for _, t := range tasks {
			if t.err == nil && of(t) {
				t.fail(err)
			}
		}
	}
}

// prepare builds t's escalation payload and, unless the row records its
// copy already, the dead-letter copy.
func (f *followUps) prepare(t *followUpTask) {
	r, orig := t.r, t.orig
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
		if sub, err := parseSubject(f.cfg.Scheme, orig.Subject); err == nil {
			esc.Sender = sub.Sender
		}
		h := orig.Header
		esc.MessageID = first(esc.MessageID, h.Get(wire.HeaderMsgID))
		esc.CorrelationID = first(esc.CorrelationID, h.Get(wire.HeaderCorrelation))
		esc.WorkflowID = first(esc.WorkflowID, h.Get(wire.HeaderWorkflow))
		esc.InReplyTo = first(esc.InReplyTo, h.Get(wire.HeaderInReplyTo))
		if !wire.Mirrored(h) {
			if env := envelopeOf(orig.Data); env != nil {
				esc.MessageID = first(esc.MessageID, env.MessageID)
				esc.CorrelationID = first(esc.CorrelationID, env.Correlation)
				esc.WorkflowID = first(esc.WorkflowID, env.WorkflowID)
				esc.InReplyTo = first(esc.InReplyTo, env.InReplyTo)
			}
		}
		if json.Valid(orig.Data) {
			esc.Original = orig.Data
		}
		if esc.SentAt.IsZero() {
			esc.SentAt = orig.Time.UTC()
		}
	}
	// Peers wrote these: the escalation carries them bounded.
	for _, p := range []*string{&esc.MessageID, &esc.CorrelationID, &esc.WorkflowID, &esc.InReplyTo, &esc.Subject} {
		*p = bound.Clip(*p, maxHeaderValue)
	}
	for i := range esc.Reasons {
		esc.Reasons[i] = bound.Clip(esc.Reasons[i], maxHeaderValue)
	}
	if esc.Sender == "" {
		t.fail(fmt.Errorf("ackmonitor: %d/%s: sender unknown (original gone and send not recorded yet)", r.StreamSeq, r.Consumer))
		return
	}
	dlqSubject, err := f.cfg.Scheme.DLQ(r.Receiver, r.Priority, esc.Sender)
	if err != nil {
		t.fail(fmt.Errorf("ackmonitor: dead-letter subject: %w", err))
		return
	}
	esc.DLQSubject, esc.DLQSeq = dlqSubject, r.DLQSeq
	t.esc = esc
	t.escalate = (r.Status == store.StatusTimeout || r.Status == store.StatusNACK && f.cfg.EscalateTerminated) &&
		esc.Sender != f.cfg.MonitorID // an escalation that failed is not escalated again
	if r.DLQSeq != 0 {
		return // a retry skips what an earlier try recorded
	}
	reason := esc.Reason
	if r.Status != store.StatusTimeout {
		reason = "terminated: " + r.NackReason
	}
	ours := nats.Header{}
	ours.Set(jetstream.MsgIDHeader, f.deadLetterID(r))
	ours.Set(dlq.HeaderOriginalID, esc.MessageID)
	ours.Set(dlq.HeaderReason, reason)
	ours.Set(dlq.HeaderStatus, r.Status)
	ours.Set(dlq.HeaderDeliveries, strconv.Itoa(r.Deliveries))
	ours.Set(dlq.HeaderConsumer, r.Consumer)
	ours.Set(dlq.HeaderStreamSeq, strconv.FormatUint(r.StreamSeq, 10))
	ours.Set(dlq.HeaderSubject, esc.Subject)
	t.copy = deadLetterMsg(dlqSubject, origHeader, body, ours, f.nc.MaxPayload())
}

// storeCopies publishes the batch's copies without waiting for each
// other's acks, then collects the acks: the DLQ stream stores them in one
// round of its replicas rather than one round each. Each publish times
// out by itself after copyTimeout (the DLQ context's option); the wait
// here is bounded too, in case an ack's timer is lost.
func (f *followUps) storeCopies(ctx context.Context, tasks []*followUpTask) {
	type inFlight struct {
		t   *followUpTask
		ack jetstream.PubAckFuture
	}
	var pending []inFlight
	for _, t := range tasks {
		if t.err != nil || t.copy == nil {
			continue
		}
		ack, err := f.dlq.PublishMsgAsync(t.copy)
		if err != nil {
			t.fail(fmt.Errorf("ackmonitor: dead-letter %d/%s: %w", t.r.StreamSeq, t.r.Consumer, err))
			continue
		}
		pending = append(pending, inFlight{t, ack})
	}
	wctx, cancel := context.WithTimeout(ctx, 2*copyTimeout)
	defer cancel()
	for _, p := range pending {
		r := p.t.r
		select {
		case ack := <-p.ack.Ok():
			p.t.done.DLQSeq, p.t.esc.DLQSeq = ack.Sequence, ack.Sequence
			if !ack.Duplicate {
				f.metrics.deadLetters.WithLabelValues(r.Receiver, r.Priority).Inc()
			}
		case err := <-p.ack.Err():
			p.t.fail(fmt.Errorf("ackmonitor: dead-letter %d/%s: %w", r.StreamSeq, r.Consumer, err))
		case <-wctx.Done():
			p.t.fail(fmt.Errorf("ackmonitor: dead-letter %d/%s: %w", r.StreamSeq, r.Consumer, wctx.Err()))
		}
	}
}

// markExhausted marks the receivers of the batch's exhausted messages
// whose copies were just stored potentially unavailable: in the store
// (once per receiver; a failure fails its rows, whose copies are
// deduplicated when they are tried again) and, best effort, in the
// registry.
func (f *followUps) markExhausted(ctx context.Context, tasks []*followUpTask) {
	why := map[string]string{}
	var receivers []string
	for _, t := range tasks {
		if t.err != nil || t.copy == nil || t.r.Status != store.StatusTimeout {
			continue
		}
		if _, ok := why[t.r.Receiver]; !ok {
			receivers = append(receivers, t.r.Receiver)
		}
		why[t.r.Receiver] = fmt.Sprintf("message %d exhausted %d deliveries on %s", t.r.StreamSeq, t.r.Deliveries, t.r.Consumer)
	}
	for _, agent := range receivers {
		wctx, cancel := detached(ctx)
		err := f.cfg.Store.MarkUnavailable(wctx, agent, why[agent], time.Now().UTC())
		cancel()
		if err != nil {
			for _, t := range tasks {
				if t.err == nil && t.copy != nil && t.r.Status == store.StatusTimeout && t.r.Receiver == agent {
					t.fail(err)
				}
			}
			continue
		}
		if f.cfg.UnavailableFor > 0 {
			// Best effort: the store's mark is the monitor's record; a mesh
			// without a registry has nobody to tell.
			rctx, cancel := context.WithTimeout(ctx, copyTimeout)
			if err := registry.MarkUnavailable(rctx, f.js, f.cfg.Scheme, agent, f.cfg.MonitorID, why[agent], f.cfg.UnavailableFor); err != nil {
				f.cfg.Logger.Warn("registry unavailable mark failed", "agent", agent, "err", err)
			}
			cancel()
		}
	}
}

// escalateAll sends the escalations of the batch's rows to escalate,
// each sender's director looked up once, the sends concurrent.
func (f *followUps) escalateAll(ctx context.Context, tasks []*followUpTask, now time.Time) {
	var todo []*followUpTask
	for _, t := range tasks {
		if t.err == nil && t.escalate {
			todo = append(todo, t)
		}
	}
	if len(todo) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, escalateTimeout)
	defer cancel()
	type lookup struct {
		director string
		err      error
	}
	directors := map[string]lookup{}
	for _, t := range todo {
		l, ok := directors[t.esc.Sender]
		if !ok {
			l.director, l.err = f.cfg.Directors.Director(ctx, t.esc.Sender)
			directors[t.esc.Sender] = l
		}
		if l.err != nil {
			t.fail(l.err)
		}
	}
	parallel(len(todo), followUpWorkers, func(i int) {
		t := todo[i]
		if t.err != nil {
			return
		}
		director := directors[t.esc.Sender].director
		payload, err := json.Marshal(t.esc)
		if err != nil {
			t.fail(fmt.Errorf("ackmonitor: escalation payload (%w): %w", errPermanent, err))
			return
		}
		env := wire.NewEnvelope(wire.TypeNotification, f.cfg.MonitorID, ActionEscalation)
		env.MessageID = escalationID(t.r)
		env.ReceiverID = director
		env.Priority = wire.PriorityHigh
		if c := first(envelopeID(t.esc.CorrelationID), envelopeID(t.esc.MessageID)); c != "" {
			env.Correlation = c
		}
		env.WorkflowID = envelopeID(t.esc.WorkflowID)
		env.Payload = payload
		if err := f.sender.SendEnvelope(ctx, env); err != nil {
			t.fail(fmt.Errorf("ackmonitor: escalate %d/%s to %s: %w", t.r.StreamSeq, t.r.Consumer, director, err))
			return
		}
		t.done.Director, t.done.EscalationID, t.done.EscalatedAt = director, env.MessageID, now
		f.metrics.escalations.WithLabelValues(t.r.Receiver, t.r.Priority).Inc()
		f.cfg.Logger.Info("escalated", "message_id", t.esc.MessageID, "receiver", t.r.Receiver, "sender", t.esc.Sender,
			"director", director, "attempts", t.r.Deliveries)
	})
}

// parallel calls f(0), ..., f(n-1) from at most workers goroutines and
// returns once every call has.
func parallel(n, workers int, f func(i int)) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(n, workers) {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
				f(i)
			}
		})
	}
	wg.Wait()
}

// detached returns a context for recording what has been done, which
// Run's stopping must not cut short, bounded by recordTimeout.
func detached(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), recordTimeout)
}

func first(vs ...string) string {
	for _, v := range vs {
		if v != "" {
			return v
		}
	}
	return ""
}
