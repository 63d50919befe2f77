package store

import (
	"context"
	"database/sql"
	"fmt"
	"time"
)

// hour returns the start of t's hour in Unix microseconds.
func hour(t time.Time) int64 { return t.Truncate(time.Hour).UnixMicro() }

type bucket struct {
	agent, priority string
	hour            int64
	gen             int64 // Rollup only
}

func (s *sqlStore) Rollup(ctx context.Context) error {
	return s.tx(ctx, func(tx *sql.Tx) error {
		rows, err := tx.QueryContext(ctx, `SELECT agent_id, priority, hour_bucket, gen FROM metrics_dirty
			ORDER BY agent_id, priority, hour_bucket`)
		if err != nil {
			return fmt.Errorf("store: rollup: %w", err)
		}
		var dirty []bucket
		for rows.Next() {
			var b bucket
			if err := rows.Scan(&b.agent, &b.priority, &b.hour, &b.gen); err != nil {
				rows.Close()
				return err
			}
			dirty = append(dirty, b)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		for _, b := range dirty {
			end := b.hour + time.Hour.Microseconds()
			if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO acknowledgment_metrics (agent_id, priority, hour_bucket,
				messages_sent, messages_acknowledged, messages_timeout, messages_nak_exhausted, messages_nack, avg_ack_time_ms)
				SELECT receiver_agent, priority, ?, COUNT(*),
				COALESCE(SUM(CASE WHEN ack_status = 'ACK' THEN 1 ELSE 0 END), 0),
				COALESCE(SUM(CASE WHEN ack_status = 'TIMEOUT' THEN 1 ELSE 0 END), 0),
				COALESCE(SUM(CASE WHEN `+nakExhaustedSQL+` THEN 1 ELSE 0 END), 0),
				COALESCE(SUM(CASE WHEN ack_status = 'NACK' THEN 1 ELSE 0 END), 0),
				AVG(CASE WHEN ack_status = 'ACK' THEN processing_time_ms END)
				FROM message_acknowledgments WHERE receiver_agent = ? AND priority = ? AND sent_at >= ? AND sent_at < ?
				GROUP BY receiver_agent, priority
				ON CONFLICT (agent_id, priority, hour_bucket) DO UPDATE SET messages_sent = excluded.messages_sent,
				messages_acknowledged = excluded.messages_acknowledged, messages_timeout = excluded.messages_timeout,
				messages_nak_exhausted = excluded.messages_nak_exhausted, messages_nack = excluded.messages_nack, avg_ack_time_ms = excluded.avg_ack_time_ms`),
				b.hour, b.agent, b.priority, b.hour, end); err != nil {
				return fmt.Errorf("store: rollup %s/%s: %w", b.agent, b.priority, err)
			}
			if _, err := tx.ExecContext(ctx, s.q(`DELETE FROM metrics_dirty WHERE agent_id = ? AND priority = ?
				AND hour_bucket = ? AND gen = ?`), b.agent, b.priority, b.hour, b.gen); err != nil {
				return err
			}
		}
		return nil
	})
}

func (s *sqlStore) Hourly(ctx context.Context, since time.Time) ([]HourlyMetric, error) {
	rows, err := s.db.QueryContext(ctx, s.q(`SELECT agent_id, priority, hour_bucket, messages_sent,
		messages_acknowledged, messages_timeout, messages_nak_exhausted, messages_nack, avg_ack_time_ms FROM acknowledgment_metrics
		WHERE hour_bucket >= ? ORDER BY hour_bucket, agent_id, priority`), hour(since))
	if err != nil {
		return nil, fmt.Errorf("store: hourly: %w", err)
	}
	defer rows.Close()
	var out []HourlyMetric
	for rows.Next() {
		var m HourlyMetric
		var h int64
		var avg sql.NullFloat64
		if err := rows.Scan(&m.Agent, &m.Priority, &h, &m.Sent, &m.Acked, &m.TimedOut, &m.NakExhausted, &m.Nacked, &avg); err != nil {
			return nil, fmt.Errorf("store: hourly: %w", err)
		}
		m.Hour, m.AvgAckTimeMS = time.UnixMicro(h).UTC(), avg.Float64
		out = append(out, m)
	}
	return out, rows.Err()
}
