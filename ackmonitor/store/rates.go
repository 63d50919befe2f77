package store

import (
	"context"
	"database/sql"
	"fmt"
	"time"
)

// nakExhaustedSQL tells a row exhausted by NAKs alone (nakExhausted): a
// TIMEOUT row with no timed-out delivery. It needs no column of its own,
// so rows recorded before it was counted are counted too.
const nakExhaustedSQL = `(ack_status = 'TIMEOUT' AND timeouts = 0)`

func (s *sqlStore) Rates(ctx context.Context, since time.Time) ([]Rate, error) {
	t, allPending := since.UnixMicro(), ""
	if since.IsZero() {
		t, allPending = 0, " OR ack_status IS NULL"
	}
	rows, err := s.db.QueryContext(ctx, s.q(`SELECT receiver_agent, priority,
		CAST(COALESCE(SUM(CASE WHEN sent_at >= ? THEN 1 ELSE 0 END), 0) AS BIGINT),
		CAST(COALESCE(SUM(CASE WHEN resolved_at >= ? AND ack_status = 'ACK' THEN 1 ELSE 0 END), 0) AS BIGINT),
		CAST(COALESCE(SUM(CASE WHEN resolved_at >= ? AND ack_status = 'NACK' THEN 1 ELSE 0 END), 0) AS BIGINT),
		CAST(COALESCE(SUM(CASE WHEN resolved_at >= ? AND ack_status = 'TIMEOUT' THEN 1 ELSE 0 END), 0) AS BIGINT),
		CAST(COALESCE(SUM(CASE WHEN resolved_at >= ? AND `+nakExhaustedSQL+` THEN 1 ELSE 0 END), 0) AS BIGINT),
		CAST(COALESCE(SUM(CASE WHEN resolved_at >= ? AND ack_status = 'INVALID' THEN 1 ELSE 0 END), 0) AS BIGINT),
		CAST(COALESCE(SUM(CASE WHEN ack_status IS NULL THEN 1 ELSE 0 END), 0) AS BIGINT),
		CAST(COALESCE(SUM(CASE WHEN resolved_at >= ? THEN naks ELSE 0 END), 0) AS BIGINT),
		CAST(COALESCE(SUM(CASE WHEN resolved_at >= ? THEN timeouts ELSE 0 END), 0) AS BIGINT),
		CAST(COALESCE(SUM(CASE WHEN resolved_at >= ? THEN late_acks ELSE 0 END), 0) AS BIGINT),
		CAST(AVG(CASE WHEN resolved_at >= ? AND ack_status = 'ACK' THEN processing_time_ms END) AS DOUBLE PRECISION),
		CAST(AVG(CASE WHEN resolved_at >= ? AND ack_status = 'ACK' AND sent_at IS NOT NULL
			THEN (acknowledged_at - sent_at) / 1000.0 END) AS DOUBLE PRECISION)
		FROM message_acknowledgments WHERE resolved_at >= ? OR sent_at >= ?`+allPending+`
		GROUP BY receiver_agent, priority ORDER BY receiver_agent, priority`), t, t, t, t, t, t, t, t, t, t, t, t, t)
	if err != nil {
		return nil, fmt.Errorf("store: rates: %w", err)
	}
	defer rows.Close()
	var out []Rate
	for rows.Next() {
		var r Rate
		var ack, lat sql.NullFloat64
		if err := rows.Scan(&r.Agent, &r.Priority, &r.Sent, &r.Acked, &r.Nacked, &r.TimedOut, &r.NakExhausted, &r.Invalid, &r.Pending,
			&r.Naks, &r.Timeouts, &r.LateAcks, &ack, &lat); err != nil {
			return nil, fmt.Errorf("store: rates: %w", err)
		}
		r.AvgAckTimeMS, r.AvgLatencyMS = ack.Float64, lat.Float64
		out = append(out, r)
	}
	return out, rows.Err()
}

// SenderRates reads idx_ack_resolved; the zero time takes every final row.
func (s *sqlStore) SenderRates(ctx context.Context, since time.Time) ([]SenderRate, error) {
	rows, err := s.db.QueryContext(ctx, s.q(`SELECT sender_agent, CAST(COUNT(*) AS BIGINT),
		CAST(COALESCE(SUM(CASE WHEN ack_status = 'INVALID' THEN 1 ELSE 0 END), 0) AS BIGINT)
		FROM message_acknowledgments WHERE resolved_at >= ? AND ack_status IS NOT NULL AND sender_agent <> ''
		GROUP BY sender_agent ORDER BY sender_agent`), since.UnixMicro())
	if err != nil {
		return nil, fmt.Errorf("store: sender rates: %w", err)
	}
	defer rows.Close()
	var out []SenderRate
	for rows.Next() {
		var r SenderRate
		if err := rows.Scan(&r.Sender, &r.Resolved, &r.Invalid); err != nil {
			return nil, fmt.Errorf("store: sender rates: %w", err)
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

func (s *sqlStore) Series(ctx context.Context, agent string, since time.Time, step time.Duration) ([]Point, error) {
	if step < time.Second {
		step = time.Second
	}
	stepUS := step.Microseconds()
	args := []any{stepUS, since.UnixMicro()}
	filter := ""
	if agent != "" {
		filter, args = " AND receiver_agent = ?", append(args, agent)
	}
	rows, err := s.db.QueryContext(ctx, s.q(`SELECT resolved_at / ? AS b,
		CAST(COALESCE(SUM(CASE WHEN ack_status = 'ACK' THEN 1 ELSE 0 END), 0) AS BIGINT),
		CAST(COALESCE(SUM(CASE WHEN ack_status = 'NACK' THEN 1 ELSE 0 END), 0) AS BIGINT),
		CAST(COALESCE(SUM(CASE WHEN ack_status = 'TIMEOUT' THEN 1 ELSE 0 END), 0) AS BIGINT),
		CAST(COALESCE(SUM(CASE WHEN `+nakExhaustedSQL+` THEN 1 ELSE 0 END), 0) AS BIGINT),
		CAST(COALESCE(SUM(CASE WHEN ack_status = 'INVALID' THEN 1 ELSE 0 END), 0) AS BIGINT),
		CAST(AVG(CASE WHEN ack_status = 'ACK' THEN processing_time_ms END) AS DOUBLE PRECISION)
		FROM message_acknowledgments WHERE resolved_at >= ?`+filter+` GROUP BY b ORDER BY b`), args...)
	if err != nil {
		return nil, fmt.Errorf("store: series: %w", err)
	}
	defer rows.Close()
	var out []Point
	for rows.Next() {
		var p Point
		var b int64
		var avg sql.NullFloat64
		if err := rows.Scan(&b, &p.Acked, &p.Nacked, &p.TimedOut, &p.NakExhausted, &p.Invalid, &avg); err != nil {
			return nil, fmt.Errorf("store: series: %w", err)
		}
		p.At, p.AvgAckTimeMS = time.UnixMicro(b*stepUS).UTC(), avg.Float64
		out = append(out, p)
	}
	return out, rows.Err()
}
