package ackmonitor

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/ackmonitor/store"
)

// The server samples ack metrics (a consumer's SampleFrequency, "100" by
// default) but always sends the NAK, TERM and MAX_DELIVERIES advisories.
// At a lower sampling, and whenever events are lost (the monitor down
// while its events stream has no leader), the rows of messages their
// receiver acked would stay pending for good. So the active instance
// infers those ACKs (reconcileLoop): a message at or below its consumer's
// ack floor, and still in the stream, was acked, terminated or exhausted,
// and without a TERM or MAX_DELIVERIES it was acked. A row whose TERM or
// MAX_DELIVERIES event the ledger refused (the intake terminated the event,
// so the events consumer's ack floor passed it) is not pending for this:
// the intake records the refusal first and Store.Pending leaves the row
// out, as its outcome is lost, not an ACK. A row is inferred
// only if it was at or below the floor at the previous check and, at this
// one, the monitor has written (acked) every event the events stream held
// at the end of the previous check: the event of anything acked before
// then is in the ledger. (Waiting for the events consumer to be idle
// instead starved the inference under steady traffic.) An event that
// comes later still takes precedence (store.Event.Inferred). Inferred
// ACKs carry no ack time.

// reconcilePage is how many pending rows one store read returns.
const reconcilePage = 1000

// reconcileLoop infers missing ACKs every ReconcileInterval while this
// instance is active, then counts the rows still pending since long ago.
func (m *Monitor) reconcileLoop(ctx context.Context) {
	var prev reconcileCheck
	everyTick(ctx, m.cfg.ReconcileInterval, func() {
		if !m.Active() {
			prev = reconcileCheck{}
			return
		}
		next, err := m.reconcile(ctx, prev)
		if err != nil && ctx.Err() == nil {
			m.cfg.Logger.Warn("inferring missing ACKs", "err", err)
		}
		prev = next
		m.countStalePending(ctx)
	})
}

// countStalePending sets ackmonitor_stale_pending_rows to the number of
// rows without a final status whose send is older than StalePendingAfter:
// rows that stay pending (a receiver down or gone, events lost or refused)
// without anything else telling the operator. On a store error the gauge
// keeps its value.
func (m *Monitor) countStalePending(ctx context.Context) {
	n, err := m.cfg.Store.CountPending(ctx, time.Now().Add(-m.cfg.StalePendingAfter))
	if err != nil {
		if ctx.Err() == nil {
			m.cfg.Logger.Warn("counting stale pending rows", "err", err)
		}
		return
	}
	m.reportStalePending(n)
}

// reportStalePending makes the ackmonitor_stale_pending_rows gauge show n
// while this instance is active, and nothing otherwise (or for n < 0), as
// reportAlerts does for alerts: the sum over instances counts the rows once.
func (m *Monitor) reportStalePending(n int64) {
	m.metrics.alertsMu.Lock()
	defer m.metrics.alertsMu.Unlock()
	if n < 0 || !m.Active() {
		m.metrics.stalePending.Reset()
		return
	}
	m.metrics.stalePending.WithLabelValues().Set(float64(n))
}

// reconcileCheck is what one reconcile pass leaves the next.
type reconcileCheck struct {
	suspects   map[store.Key]struct{} // pending rows at or below their consumer's ack floor
	eventsLast uint64                 // the events stream's last sequence after they were found
}

// reconcile infers the ACK of every pending row that is in prev's
// suspects and still at or below its consumer's ack floor, once the
// events up to prev.eventsLast are written, and returns this check.
func (m *Monitor) reconcile(ctx context.Context, prev reconcileCheck) (reconcileCheck, error) {
	events, err := m.events.Info(ctx)
	if err != nil {
		return prev, err
	}
	// Until then the events still to come may resolve the suspects. Keep
	// waiting for that mark rather than setting a new one: an intake
	// lagging by more than an interval, as under steady traffic on a
	// loaded machine, would otherwise chase a new mark at every check and
	// never infer anything.
	if prev.suspects != nil && events.AckFloor.Stream < prev.eventsLast {
		return prev, nil
	}
	suspects := prev.suspects
	mesh, err := m.mesh.Info(ctx)
	if err != nil {
		return prev, err
	}
	floors := map[string]uint64{} // consumer → ack floor (0: none to trust)
	now := time.Now().UTC()
	started := time.Now()
	next := map[store.Key]struct{}{}
	var inferred []store.Event
	// Rows below the stream's first sequence cannot be inferred (below):
	// the pages start there.
	for after := (store.Key{StreamSeq: max(mesh.State.FirstSeq, 1) - 1}); ; {
		recs, err := m.cfg.Store.Pending(ctx, after, reconcilePage)
		if err != nil {
			return prev, err
		}
		for _, r := range recs {
			floor, ok := floors[r.Consumer]
			if !ok {
				floor = m.rowFloor(ctx, r.Consumer, floors, started)
				floors[r.Consumer] = floor
			}
			// Below the first sequence the message is gone (MaxAge): the
			// floor passed it whether or not it was delivered.
			if r.StreamSeq > floor || r.StreamSeq < mesh.State.FirstSeq {
				continue
			}
			next[r.Key()] = struct{}{}
			if _, seen := suspects[r.Key()]; seen {
				inferred = append(inferred, store.Event{
					ID:   "inferred-ack:" + strconv.FormatUint(r.StreamSeq, 10) + ":" + r.Consumer,
					Kind: store.EventAck, Consumer: r.Consumer, Receiver: r.Receiver, Priority: r.Priority,
					StreamSeq: r.StreamSeq, At: now, Inferred: true,
				})
			}
		}
		if len(recs) < reconcilePage {
			break
		}
		after = recs[len(recs)-1].Key()
	}
	// Read after the floors: the events of the acks they show are in it.
	eventsStream, err := m.js.Stream(ctx, m.cfg.Scheme.EventsStream())
	if err != nil {
		return prev, err
	}
	check := reconcileCheck{suspects: next, eventsLast: eventsStream.CachedInfo().State.LastSeq}
	for len(inferred) > 0 {
		n := min(len(inferred), m.cfg.BatchSize)
		applied, err := m.intake.apply(ctx, store.Batch{Events: inferred[:n]})
		if err != nil {
			return check, err
		}
		m.intake.recorded(applied)
		for _, r := range applied.Resolved {
			if r.InferredAck() {
				m.metrics.inferred.WithLabelValues(r.Receiver, r.Priority).Inc()
			}
		}
		inferred = inferred[n:]
	}
	return check, nil
}

// rowFloor returns the ack floor of the rows of consumer: its own, or,
// when an agent's direct consumer does not exist, that of the group
// consumer whose filters include the agent's (the group delivers its
// messages). While the agent's own consumer exists it is the one to ask:
// a member's catch-up consumer delivers the messages stored before the
// agent joined, behind the group's floor. floors caches the groups'
// floors for the pass that started at started; the group consumers are
// listed again for a member the last listing, before the pass, did not
// know.
func (m *Monitor) rowFloor(ctx context.Context, consumer string, floors map[string]uint64, started time.Time) uint64 {
	floor, err := m.ackFloor(ctx, consumer)
	if !errors.Is(err, jetstream.ErrConsumerNotFound) || m.groups.isGroup(consumer) {
		return floor
	}
	if c, err := m.cfg.Scheme.ParseConsumerName(consumer); err != nil || c.Priority == "" || c.Agent == "" {
		return 0 // not an agent's direct consumer: a fan-out one has no group
	}
	group, err := m.groups.groupOf(ctx, consumer, started)
	if err != nil {
		if ctx.Err() == nil {
			m.cfg.Logger.Warn("looking up the group of a consumer not found", "consumer", consumer, "err", err)
		}
		return 0
	}
	if group == "" {
		return 0
	}
	if f, ok := floors[group]; ok {
		return f
	}
	// A group consumer delivers only what was stored after it was made
	// (DeliverNew): what came before, and what a member was sent before
	// it joined, is its members' catch-ups', and a member has no
	// consumer of its own only once its catch-up is done.
	floor, _ = m.ackFloor(ctx, group, jetstream.DeliverNewPolicy)
	floors[group] = floor
	return floor
}

// ackFloor returns the stream sequence of consumer's ack floor, or 0 when
// the consumer is gone (with the error) or does not deliver the whole
// stream (agentkit's agent consumers do), so its floor says nothing about
// earlier messages; a consumer with one of also's deliver policies is
// taken as delivering the whole stream.
func (m *Monitor) ackFloor(ctx context.Context, consumer string, also ...jetstream.DeliverPolicy) (uint64, error) {
	c, err := m.mesh.Consumer(ctx, consumer)
	if err != nil {
		return 0, fmt.Errorf("ackmonitor: consumer %s: %w", consumer, err)
	}
	info := c.CachedInfo()
	if p := info.Config.DeliverPolicy; p != jetstream.DeliverAllPolicy && !slices.Contains(also, p) {
		return 0, nil
	}
	return info.AckFloor.Stream, nil
}
