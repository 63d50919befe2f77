package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

const recordCols = `stream_seq, consumer, message_id, sender_agent, receiver_agent, workflow_execution_id,
	correlation_id, in_reply_to, priority, sent_at, acknowledged_at, resolved_at, ack_status, nack_reason,
	retry_count, deliveries, naks, timeouts, late_acks, processing_time_ms, history, handled_at, escalated_at,
	director, escalation_id, dlq_seq, follow_up_attempts, follow_up_error, given_up_at`

type scanner interface{ Scan(...any) error }

func scanRecord(sc scanner) (Record, error) {
	var r Record
	var sent, acked, resolved, handled, escalated, dlq, givenUp sql.NullInt64
	var status sql.NullString
	var proc sql.NullFloat64
	var hist string
	var seq int64
	err := sc.Scan(&seq, &r.Consumer, &r.MessageID, &r.Sender, &r.Receiver, &r.Workflow, &r.Correlation,
		&r.InReplyTo, &r.Priority, &sent, &acked, &resolved, &status, &r.NackReason, &r.RetryCount,
		&r.Deliveries, &r.Naks, &r.Timeouts, &r.LateAcks, &proc, &hist, &handled, &escalated, &r.Director, &r.EscalationID, &dlq,
		&r.FollowUpAttempts, &r.FollowUpError, &givenUp)
	if err != nil {
		return r, err
	}
	r.StreamSeq = uint64(seq)
	r.SentAt, r.AcknowledgedAt, r.ResolvedAt = fromUS(sent), fromUS(acked), fromUS(resolved)
	r.HandledAt, r.EscalatedAt, r.GivenUpAt = fromUS(handled), fromUS(escalated), fromUS(givenUp)
	r.Status = status.String
	r.NakExhausted = nakExhausted(r.Status, r.Timeouts)
	if proc.Valid {
		r.ProcessingTime = time.Duration(proc.Float64 * float64(time.Millisecond))
	}
	if dlq.Valid {
		r.DLQSeq = uint64(dlq.Int64)
	}
	if err := json.Unmarshal([]byte(hist), &r.History); err != nil {
		return r, fmt.Errorf("store: history of %d/%s: %w", r.StreamSeq, r.Consumer, err)
	}
	return r, nil
}

func (s *sqlStore) queryRecordsTx(ctx context.Context, tx *sql.Tx, query string, args ...any) ([]Record, error) {
	rows, err := tx.QueryContext(ctx, s.q(query), args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Record
	for rows.Next() {
		r, err := scanRecord(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

func (s *sqlStore) Get(ctx context.Context, k Key) (Record, error) {
	r, err := scanRecord(s.db.QueryRowContext(ctx, s.q(`SELECT `+recordCols+` FROM message_acknowledgments
		WHERE stream_seq = ? AND consumer = ?`), int64(k.StreamSeq), k.Consumer))
	if errors.Is(err, sql.ErrNoRows) {
		return r, fmt.Errorf("%w: %d/%s", ErrNotFound, k.StreamSeq, k.Consumer)
	}
	return r, err
}

func (s *sqlStore) queryRecords(ctx context.Context, query string, args ...any) ([]Record, error) {
	rows, err := s.db.QueryContext(ctx, s.q(query), args...)
	if err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	defer rows.Close()
	var out []Record
	for rows.Next() {
		r, err := scanRecord(rows)
		if err != nil {
			return nil, fmt.Errorf("store: %w", err)
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

func (s *sqlStore) Messages(ctx context.Context, q Query) ([]Record, error) {
	where, args, index := []string{"1 = 1"}, []any{}, ""
	if q.Receiver != "" {
		where, args = append(where, "receiver_agent = ?"), append(args, q.Receiver)
	}
	if q.Status != "" {
		where, args = append(where, "ack_status = ?"), append(args, q.Status)
	}
	order := "stream_seq DESC, consumer"
	if q.Pending {
		// idx_ack_pending's order: no sort of every pending row.
		where, order, index = append(where, "ack_status IS NULL"), "stream_seq, consumer", s.d.pendingIndex
	}
	if q.Escalated {
		where = append(where, "escalated_at IS NOT NULL")
		order = "escalated_at DESC, stream_seq DESC"
	}
	if q.DeadLetter {
		where = append(where, "dlq_seq IS NOT NULL")
		order = "dlq_seq DESC"
	}
	if q.GivenUp {
		where = append(where, "given_up_at IS NOT NULL")
		order = "given_up_at DESC, stream_seq DESC, consumer"
	}
	if q.Limit <= 0 {
		q.Limit = 100
	}
	args = append(args, q.Limit)
	return s.queryRecords(ctx, `SELECT `+recordCols+` FROM message_acknowledgments`+index+` WHERE `+
		strings.Join(where, " AND ")+` ORDER BY `+order+` LIMIT ?`, args...)
}

func (s *sqlStore) Pending(ctx context.Context, after Key, limit int) ([]Record, error) {
	if limit <= 0 {
		limit = 100
	}
	return s.queryRecords(ctx, `SELECT `+recordCols+` FROM message_acknowledgments AS a`+s.d.pendingIndex+`
		WHERE ack_status IS NULL AND (stream_seq, consumer) > (?, ?)
		AND NOT EXISTS (SELECT 1 FROM refused_events AS f WHERE f.stream_seq = a.stream_seq
			AND f.consumer = a.consumer AND f.kind IN ('TERM', 'MAX_DELIVERIES'))
		ORDER BY stream_seq, consumer LIMIT ?`,
		int64(after.StreamSeq), after.Consumer, limit)
}

// CountPending counts from idx_ack_status (ack_status, sent_at), which
// holds every column it reads.
func (s *sqlStore) CountPending(ctx context.Context, sentBefore time.Time) (int64, error) {
	var n int64
	if err := s.db.QueryRowContext(ctx, s.q(`SELECT COUNT(*) FROM message_acknowledgments
		WHERE ack_status IS NULL AND sent_at < ?`), sentBefore.UnixMicro()).Scan(&n); err != nil {
		return 0, fmt.Errorf("store: count pending: %w", err)
	}
	return n, nil
}
