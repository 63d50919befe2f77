package store

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/agentmesh-io/agentmesh/subjects"
)

// storable returns b, or a copy of it when some of its strings need
// text to be stored by every dialect.
func (b Batch) storable() Batch {
	if b.textOK() {
		return b // the usual case: no copy
	}
	out := Batch{Sends: slices.Clone(b.Sends), Events: slices.Clone(b.Events), Refused: slices.Clone(b.Refused)}
	out.eachText(func(f *string) bool { *f = text(*f); return true })
	return out
}

// textOK reports whether every string of b is stored as it is.
func (b Batch) textOK() bool {
	return b.eachText(func(f *string) bool { return text(*f) == *f })
}

// eachText calls f with each string field of b's sends and events that
// comes from a publisher, until f returns false; it reports whether f
// always returned true.
func (b Batch) eachText(f func(*string) bool) bool {
	for i := range b.Sends {
		x := &b.Sends[i]
		for _, p := range [...]*string{&x.MessageID, &x.Sender, &x.Receiver, &x.Topic, &x.Kind, &x.Priority,
			&x.MessageType, &x.Action, &x.Correlation, &x.Workflow, &x.InReplyTo} {
			if !f(p) {
				return false
			}
		}
	}
	for _, events := range [...][]Event{b.Events, b.Refused} {
		for i := range events {
			x := &events[i]
			for _, p := range [...]*string{&x.ID, &x.Consumer, &x.Receiver, &x.Priority, &x.Reason} {
				if !f(p) {
					return false
				}
			}
		}
	}
	return true
}

// text returns s with NUL bytes and invalid UTF-8 replaced by U+FFFD.
// Headers and TERM reasons come from any publisher and may hold either,
// which PostgreSQL's TEXT refuses (SQLSTATE 22021): the batch failed on
// every redelivery and the intake behind it stopped for good. SQLite
// stores the same replacement, so the stores agree.
func text(s string) string {
	if utf8.ValidString(s) && strings.IndexByte(s, 0) < 0 {
		return s
	}
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
}

// probeWrites are the writes of an empty Apply besides store_probe's row:
// each changes no row of a table Apply writes, but takes the table's write
// lock and needs the table, so a ledger table that takes no writes (held
// locked by CREATE INDEX, VACUUM FULL or LOCK TABLE, or gone) fails the
// probe as it fails every batch: the intake must not take that outage for
// messages the ledger refuses, and terminate them.
var probeWrites = []string{
	`UPDATE message_sends SET sent_at = sent_at WHERE 1 = 0`,
	`UPDATE message_acknowledgments SET created_at = created_at WHERE 1 = 0`,
	`UPDATE metrics_dirty SET gen = gen WHERE 1 = 0`,
	`UPDATE agent_health SET updated_at = updated_at WHERE 1 = 0`,
	`UPDATE refused_events SET refused_at = refused_at WHERE 1 = 0`,
}

// Apply writes a batch with a handful of multi-row statements, whatever
// its size: round trips, not rows, are what a batch costs in PostgreSQL.
// An empty batch updates store_probe's row: a real write (a store that
// is down or read-only fails it) that changes no ledger data; and it
// writes no row of each ledger table (probeWrites).
func (s *sqlStore) Apply(ctx context.Context, b Batch) (Applied, error) {
	if b.empty() {
		return Applied{}, s.tx(ctx, func(tx *sql.Tx) error {
			if _, err := s.exec(ctx, tx, `INSERT INTO store_probe (id, probed_at) VALUES (1, ?)
				ON CONFLICT (id) DO UPDATE SET probed_at = excluded.probed_at`, time.Now().UnixMicro()); err != nil {
				return fmt.Errorf("store: probe: %w", err)
			}
			for _, w := range probeWrites {
				if _, err := s.exec(ctx, tx, w); err != nil {
					return fmt.Errorf("store: probe: %w", err)
				}
			}
			return nil
		})
	}
	b = b.storable()
	var out Applied
	err := s.tx(ctx, func(tx *sql.Tx) error {
		out = Applied{}
		dirty := map[bucket]struct{}{}
		now := time.Now().UnixMicro()
		if s.d.lockRows != "" {
			if _, err := tx.ExecContext(ctx, s.q(s.d.lockRows), rowLockIDs(b)); err != nil {
				return fmt.Errorf("store: lock ledger rows: %w", err)
			}
		}
		if err := s.applySends(ctx, tx, b.Sends, now, dirty, &out); err != nil {
			return err
		}
		if err := s.applyEvents(ctx, tx, b.Events, now, dirty, &out); err != nil {
			return err
		}
		if err := s.recordRefused(ctx, tx, b.Refused, now); err != nil {
			return err
		}
		ackedBy := map[string]int64{}
		for _, r := range out.Resolved {
			if r.Status == StatusACK {
				ackedBy[r.Receiver] = max(ackedBy[r.Receiver], r.ResolvedAt.UnixMicro())
			}
		}
		for _, agent := range slices.Sorted(maps.Keys(ackedBy)) {
			at := ackedBy[agent]
			if _, err := s.exec(ctx, tx, `UPDATE agent_health SET unavailable_since = NULL, reason = '',
				updated_at = ? WHERE agent = ? AND unavailable_since IS NOT NULL AND unavailable_since <= ?`, at, agent, at); err != nil {
				return fmt.Errorf("store: agent health %s: %w", agent, err)
			}
		}
		buckets := slices.SortedFunc(maps.Keys(dirty), func(x, y bucket) int {
			return cmp.Or(cmp.Compare(x.agent, y.agent), cmp.Compare(x.priority, y.priority), cmp.Compare(x.hour, y.hour))
		})
		for _, bk := range buckets {
			// gen tells a concurrent Rollup that the hour changed again
			// after it read it, so it must not clear the mark.
			if _, err := s.exec(ctx, tx, `INSERT INTO metrics_dirty (agent_id, priority, hour_bucket, gen)
				VALUES (?, ?, ?, 0) ON CONFLICT (agent_id, priority, hour_bucket) DO UPDATE SET gen = metrics_dirty.gen + 1`,
				bk.agent, bk.priority, bk.hour); err != nil {
				return fmt.Errorf("store: mark hour dirty: %w", err)
			}
		}
		return nil
	})
	if err != nil {
		return Applied{}, err
	}
	return out, nil
}

// rowLockIDs returns the ids of the row locks a write of b takes in
// PostgreSQL: the stream sequences (mod 2^32) of its events, whose rows
// may not exist yet, and of its sends; sorted, so concurrent writers
// cannot deadlock on them. Without them, two transactions creating a row
// would each write only their own events, and the later commit would drop
// the other's; a topic send committed between an event's read of
// message_sends and its insert of the row would never fill in the row's
// send fields; and an event batch that read message_sends before a direct
// send committed would resolve the row without marking its hour for the
// rollup, which the send had marked and a rollup in between had cleared.
func rowLockIDs(b Batch) []int32 {
	ids := make([]int32, 0, len(b.Events)+len(b.Sends))
	for _, e := range b.Events {
		ids = append(ids, int32(uint32(e.StreamSeq)))
	}
	for _, snd := range b.Sends {
		ids = append(ids, int32(uint32(snd.StreamSeq)))
	}
	slices.Sort(ids)
	return slices.Compact(ids)
}

// applySends records new sends and creates (or completes) their ledger
// rows. Rows are touched in stream_seq order here and in applyEvents, so
// concurrent batches lock rows in the same order.
func (s *sqlStore) applySends(ctx context.Context, tx *sql.Tx, in []Send, now int64, dirty map[bucket]struct{}, out *Applied) error {
	sends := slices.Clone(in)
	slices.SortStableFunc(sends, func(x, y Send) int { return cmp.Compare(x.StreamSeq, y.StreamSeq) })
	sends = slices.CompactFunc(sends, func(x, y Send) bool { return x.StreamSeq == y.StreamSeq })
	if len(sends) == 0 {
		return nil
	}
	isNew := map[uint64]bool{}
	for _, c := range chunks(len(sends), 500) {
		part := sends[c[0]:c[1]]
		args := make([]any, 0, len(part)*13)
		for _, snd := range part {
			args = append(args, int64(snd.StreamSeq), snd.MessageID, snd.Sender, snd.Receiver, snd.Topic, snd.Kind, snd.Priority,
				snd.MessageType, snd.Action, snd.Correlation, snd.Workflow, snd.InReplyTo, snd.SentAt.UnixMicro())
		}
		rows, err := tx.QueryContext(ctx, s.q(`INSERT INTO message_sends (stream_seq, message_id, sender_agent,
			receiver_agent, topic, kind, priority, message_type, action, correlation_id, workflow_execution_id,
			in_reply_to, sent_at) VALUES `+placeholders(len(part), 13)+` ON CONFLICT (stream_seq) DO NOTHING RETURNING stream_seq`), args...)
		if err != nil {
			return fmt.Errorf("store: record sends: %w", err)
		}
		for rows.Next() {
			var seq int64
			if err := rows.Scan(&seq); err != nil {
				rows.Close()
				return err
			}
			isNew[uint64(seq)] = true
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("store: record sends: %w", err)
		}
	}
	if err := s.ackedBeforeSend(ctx, tx, sends, isNew, out); err != nil {
		return err
	}
	var direct []Send
	for _, snd := range sends {
		if !isNew[snd.StreamSeq] {
			continue
		}
		out.NewSends = append(out.NewSends, snd)
		if snd.Consumer() != "" {
			direct = append(direct, snd)
			dirty[bucket{agent: snd.Receiver, priority: snd.Priority, hour: hour(snd.SentAt)}] = struct{}{}
			continue
		}
		// Topic and broadcast: drop the rows of the sender's own fan-out
		// consumers (see ownFanout) and fill in the rows events have
		// created so far; a fan-out consumer's row takes the message's
		// priority.
		if own := fanoutConsumers(snd.Sender); len(own) > 0 {
			args := []any{int64(snd.StreamSeq)}
			for _, c := range own {
				args = append(args, c)
			}
			if _, err := s.exec(ctx, tx, `DELETE FROM message_acknowledgments WHERE stream_seq = ? AND consumer IN `+
				placeholders(1, len(own)), args...); err != nil {
				return fmt.Errorf("store: drop the sender's own rows %d: %w", snd.StreamSeq, err)
			}
		}
		if _, err := s.exec(ctx, tx, `UPDATE message_acknowledgments SET message_id = ?, sender_agent = ?,
			workflow_execution_id = ?, correlation_id = ?, in_reply_to = ?, sent_at = ?,
			priority = CASE WHEN priority = '' THEN ? ELSE priority END WHERE stream_seq = ?`,
			snd.MessageID, snd.Sender, snd.Workflow, snd.Correlation, snd.InReplyTo, snd.SentAt.UnixMicro(), snd.Priority,
			int64(snd.StreamSeq)); err != nil {
			return fmt.Errorf("store: ledger send fields %d: %w", snd.StreamSeq, err)
		}
		rows, err := s.query(ctx, tx, `SELECT receiver_agent, priority FROM message_acknowledgments WHERE stream_seq = ?`, int64(snd.StreamSeq))
		if err != nil {
			return err
		}
		for rows.Next() {
			bk := bucket{hour: hour(snd.SentAt)}
			if err := rows.Scan(&bk.agent, &bk.priority); err != nil {
				rows.Close()
				return err
			}
			dirty[bk] = struct{}{}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
	}
	// A direct message has one ledger row, known now: create it with the
	// send fields, or fill them in if an event came first.
	for _, c := range chunks(len(direct), 500) {
		part := direct[c[0]:c[1]]
		args := make([]any, 0, len(part)*11)
		for _, snd := range part {
			args = append(args, int64(snd.StreamSeq), snd.Consumer(), snd.MessageID, snd.Sender, snd.Receiver, snd.Workflow,
				snd.Correlation, snd.InReplyTo, snd.Priority, snd.SentAt.UnixMicro(), now)
		}
		if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO message_acknowledgments (stream_seq, consumer,
			message_id, sender_agent, receiver_agent, workflow_execution_id, correlation_id, in_reply_to,
			priority, sent_at, created_at) VALUES `+placeholders(len(part), 11)+`
			ON CONFLICT (stream_seq, consumer) DO UPDATE SET message_id = excluded.message_id,
			sender_agent = excluded.sender_agent, workflow_execution_id = excluded.workflow_execution_id,
			correlation_id = excluded.correlation_id, in_reply_to = excluded.in_reply_to, sent_at = excluded.sent_at`), args...); err != nil {
			return fmt.Errorf("store: ledger rows of sends: %w", err)
		}
	}
	return nil
}

// ackedBeforeSend adds to out.Acked the rows of new sends that were ACKed
// before their send was recorded: the send about to be written gives them
// their send time, and so their latency, now. Only a new send fills in
// sent_at, so each such row is reported once.
func (s *sqlStore) ackedBeforeSend(ctx context.Context, tx *sql.Tx, sends []Send, isNew map[uint64]bool, out *Applied) error {
	bySeq := map[uint64]Send{}
	var seqs []any
	for _, snd := range sends {
		if isNew[snd.StreamSeq] {
			bySeq[snd.StreamSeq] = snd
			seqs = append(seqs, int64(snd.StreamSeq))
		}
	}
	for _, c := range chunks(len(seqs), 500) {
		part := seqs[c[0]:c[1]]
		recs, err := s.queryRecordsTx(ctx, tx, `SELECT `+recordCols+` FROM message_acknowledgments
			WHERE stream_seq IN `+placeholders(1, len(part))+` AND sent_at IS NULL AND ack_status = 'ACK'
			AND acknowledged_at IS NOT NULL ORDER BY stream_seq, consumer`, part...)
		if err != nil {
			return fmt.Errorf("store: read rows acked before their send: %w", err)
		}
		for _, r := range recs {
			snd := bySeq[r.StreamSeq]
			if c := snd.Consumer(); c != "" && c != r.Consumer {
				continue // a direct send fills in its receiver's row only
			}
			if ownFanout(r.Consumer, snd.Sender) {
				continue // dropped by applySends
			}
			if r.Priority == "" {
				r.Priority = snd.Priority
			}
			r.MessageID, r.Sender, r.Workflow, r.Correlation, r.InReplyTo = snd.MessageID, snd.Sender, snd.Workflow, snd.Correlation, snd.InReplyTo
			r.SentAt = snd.SentAt
			out.Acked = append(out.Acked, r)
		}
	}
	return nil
}

// applyEvents adds new events to their rows' histories and rewrites the
// rows whose history changed.
func (s *sqlStore) applyEvents(ctx context.Context, tx *sql.Tx, events []Event, now int64, dirty map[bucket]struct{}, out *Applied) error {
	byKey := map[Key][]Event{}
	for _, e := range events {
		k := Key{e.StreamSeq, e.Consumer}
		byKey[k] = append(byKey[k], e)
	}
	keys := slices.SortedFunc(maps.Keys(byKey), func(x, y Key) int {
		return cmp.Or(cmp.Compare(x.StreamSeq, y.StreamSeq), cmp.Compare(x.Consumer, y.Consumer))
	})
	if len(keys) == 0 {
		return nil
	}
	existing := map[Key]Record{}
	for _, c := range chunks(len(keys), 400) {
		part := keys[c[0]:c[1]]
		args := make([]any, 0, 2*len(part))
		for _, k := range part {
			args = append(args, int64(k.StreamSeq), k.Consumer)
		}
		recs, err := s.queryRecordsTx(ctx, tx, `SELECT `+recordCols+` FROM message_acknowledgments
			WHERE (stream_seq, consumer) IN (`+placeholders(len(part), 2)+`) ORDER BY stream_seq, consumer`+s.d.forUpdate, args...)
		if err != nil {
			return fmt.Errorf("store: read ledger rows: %w", err)
		}
		for _, r := range recs {
			existing[r.Key()] = r
		}
	}
	// Sends of rows not created yet (events before the send, topic rows).
	var missing []any
	for _, k := range keys {
		if _, ok := existing[k]; !ok {
			missing = append(missing, int64(k.StreamSeq))
		}
	}
	sent := map[uint64]Record{}
	for _, c := range chunks(len(missing), 500) {
		part := missing[c[0]:c[1]]
		rows, err := tx.QueryContext(ctx, s.q(`SELECT stream_seq, message_id, sender_agent, workflow_execution_id, correlation_id,
			in_reply_to, priority, sent_at FROM message_sends WHERE stream_seq IN `+placeholders(1, len(part))), part...)
		if err != nil {
			return fmt.Errorf("store: read sends: %w", err)
		}
		for rows.Next() {
			var r Record
			var seq, at int64
			if err := rows.Scan(&seq, &r.MessageID, &r.Sender, &r.Workflow, &r.Correlation, &r.InReplyTo, &r.Priority, &at); err != nil {
				rows.Close()
				return err
			}
			r.SentAt = time.UnixMicro(at).UTC()
			sent[uint64(seq)] = r
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("store: read sends: %w", err)
		}
	}
	var changed []Record
	for _, k := range keys {
		evs := byKey[k]
		r, ok := existing[k]
		if !ok {
			snd := sent[k.StreamSeq]
			if ownFanout(k.Consumer, snd.Sender) {
				continue // the sender's own broadcast or topic message: no row
			}
			// A fan-out consumer's event has no priority (the consumer
			// reads several): the row takes its message's, once the send
			// is known (else applySends fills it in).
			r = Record{StreamSeq: k.StreamSeq, Consumer: k.Consumer, Receiver: evs[0].Receiver, Priority: cmp.Or(evs[0].Priority, snd.Priority),
				MessageID: snd.MessageID, Sender: snd.Sender, Workflow: snd.Workflow, Correlation: snd.Correlation,
				InReplyTo: snd.InReplyTo, SentAt: snd.SentAt}
		}
		wasFinal, hadLatency := r.Final(), r.ackedWithSend()
		n := 0
		for _, e := range evs {
			if lateAckCandidate(e) && !r.hasEvent(e.ID) {
				late, err := s.lateAck(ctx, tx, r, e)
				if err != nil {
					return err
				}
				e.LateAck = late
			}
			if r.addEvent(e) {
				n++
				e.Priority = cmp.Or(e.Priority, r.Priority) // for the NAK metric's label
				out.NewEvents = append(out.NewEvents, e)
			}
		}
		if n == 0 {
			continue
		}
		r.recompute()
		if r.Final() && !wasFinal {
			out.Resolved = append(out.Resolved, r)
		}
		if r.ackedWithSend() && !hadLatency {
			out.Acked = append(out.Acked, r)
		}
		if !r.SentAt.IsZero() {
			dirty[bucket{agent: r.Receiver, priority: r.Priority, hour: hour(r.SentAt)}] = struct{}{}
		}
		changed = append(changed, r)
	}
	for _, c := range chunks(len(changed), 300) {
		part := changed[c[0]:c[1]]
		args := make([]any, 0, len(part)*22)
		for _, r := range part {
			hist, err := json.Marshal(r.History)
			if err != nil {
				return err
			}
			var proc, status any
			if r.Status == StatusACK && !r.InferredAck() {
				proc = float64(r.ProcessingTime) / float64(time.Millisecond)
			}
			if r.Status != StatusPending {
				status = r.Status
			}
			args = append(args, int64(r.StreamSeq), r.Consumer, r.MessageID, r.Sender, r.Receiver, r.Workflow, r.Correlation,
				r.InReplyTo, r.Priority, us(r.SentAt), us(r.AcknowledgedAt), us(r.ResolvedAt), status, r.NackReason,
				r.RetryCount, r.Deliveries, r.Naks, r.Timeouts, r.LateAcks, proc, string(hist), now)
		}
		if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO message_acknowledgments (stream_seq, consumer, message_id,
			sender_agent, receiver_agent, workflow_execution_id, correlation_id, in_reply_to, priority, sent_at,
			acknowledged_at, resolved_at, ack_status, nack_reason, retry_count, deliveries, naks, timeouts,
			late_acks, processing_time_ms, history, created_at) VALUES `+placeholders(len(part), 22)+`
			ON CONFLICT (stream_seq, consumer) DO UPDATE SET acknowledged_at = excluded.acknowledged_at,
			resolved_at = excluded.resolved_at, ack_status = excluded.ack_status, nack_reason = excluded.nack_reason,
			retry_count = excluded.retry_count, deliveries = excluded.deliveries, naks = excluded.naks,
			timeouts = excluded.timeouts, late_acks = excluded.late_acks, processing_time_ms = excluded.processing_time_ms, history = excluded.history`), args...); err != nil {
			return fmt.Errorf("store: write ledger rows: %w", err)
		}
	}
	return nil
}

// lateAckCandidate reports whether e could be the ACK of a redelivery
// the receiver had handled (see LateAckRule).
func lateAckCandidate(e Event) bool {
	return e.Kind == EventAck && !e.Inferred && e.Deliveries >= 2
}

// lateAck applies LateAckRule to e, an ACK of row r: it compares e's
// ack time with the latest ACKed first deliveries of r's consumer.
// It reads them through idx_ack_receiver, and only for ACKs of
// redeliveries, which are rare.
func (s *sqlStore) lateAck(ctx context.Context, tx *sql.Tx, r Record, e Event) (bool, error) {
	if r.Priority == "" {
		return false, nil // a fan-out row before its send: no consumer's history to judge by
	}
	var n int64
	var fastest sql.NullFloat64
	err := tx.QueryRowContext(ctx, s.q(`SELECT CAST(COUNT(*) AS BIGINT), CAST(MIN(p) AS DOUBLE PRECISION) FROM (
		SELECT processing_time_ms AS p FROM message_acknowledgments
		WHERE receiver_agent = ? AND priority = ? AND consumer = ? AND ack_status = 'ACK' AND deliveries = 1
		AND processing_time_ms IS NOT NULL AND sent_at IS NOT NULL AND stream_seq <> ?
		ORDER BY sent_at DESC LIMIT `+fmt.Sprint(LateAckSamples)+`) AS firsts`),
		r.Receiver, r.Priority, r.Consumer, int64(r.StreamSeq)).Scan(&n, &fastest)
	if err != nil {
		return false, fmt.Errorf("store: first deliveries of %s: %w", r.Consumer, err)
	}
	if n < LateAckMinSamples || !fastest.Valid {
		return false, nil
	}
	ms := float64(e.AckTime) / float64(time.Millisecond)
	return ms <= LateAckRatio*fastest.Float64, nil
}

// recordRefused records the ids, rows and kinds of refused events.
func (s *sqlStore) recordRefused(ctx context.Context, tx *sql.Tx, refused []Event, now int64) error {
	for _, c := range chunks(len(refused), 500) {
		part := refused[c[0]:c[1]]
		args := make([]any, 0, len(part)*5)
		for _, e := range part {
			args = append(args, int64(e.StreamSeq), e.Consumer, e.ID, string(e.Kind), now)
		}
		if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO refused_events (stream_seq, consumer, event_id, kind, refused_at)
			VALUES `+placeholders(len(part), 5)+` ON CONFLICT (stream_seq, consumer, event_id) DO NOTHING`), args...); err != nil {
			return fmt.Errorf("store: record refused events: %w", err)
		}
	}
	return nil
}

// ownFanout reports whether consumer is one of sender's fan-out
// consumers: an agent acks its own broadcasts and topic messages without
// handling them, so the ledger lists no agent as a receiver of its own
// message. Consumer names do not depend on the scheme's prefix.
func ownFanout(consumer, sender string) bool {
	if sender == "" {
		return false // the send is not known yet
	}
	c, err := subjects.Default.ParseConsumerName(consumer)
	return err == nil && c.Class != "" && c.Agent == sender
}

// fanoutConsumers returns the names of sender's fan-out consumers, one
// per class, or nil when sender is no valid agent id.
func fanoutConsumers(sender string) []string {
	out := make([]string, 0, len(subjects.FanoutClasses))
	for _, class := range subjects.FanoutClasses {
		name, err := subjects.Default.FanoutConsumer(sender, class)
		if err != nil {
			return nil
		}
		out = append(out, name)
	}
	return out
}
