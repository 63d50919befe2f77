package store

import (
	"context"
	"database/sql"
	"fmt"
	"time"
)

func (s *sqlStore) MarkUnavailable(ctx context.Context, agent, reason string, at time.Time) error {
	return s.tx(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, s.q(`INSERT INTO agent_health (agent, unavailable_since, reason, updated_at)
			VALUES (?, ?, ?, ?) ON CONFLICT (agent) DO UPDATE SET reason = excluded.reason, updated_at = excluded.updated_at,
			unavailable_since = COALESCE(agent_health.unavailable_since, excluded.unavailable_since)`),
			agent, at.UnixMicro(), reason, at.UnixMicro())
		if err != nil {
			return fmt.Errorf("store: mark %s unavailable: %w", agent, err)
		}
		return nil
	})
}

func (s *sqlStore) Health(ctx context.Context) ([]AgentHealth, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT agent, unavailable_since, reason, updated_at FROM agent_health ORDER BY agent`)
	if err != nil {
		return nil, fmt.Errorf("store: health: %w", err)
	}
	defer rows.Close()
	var out []AgentHealth
	for rows.Next() {
		var h AgentHealth
		var since sql.NullInt64
		var upd int64
		if err := rows.Scan(&h.Agent, &since, &h.Reason, &upd); err != nil {
			return nil, fmt.Errorf("store: health: %w", err)
		}
		h.UnavailableSince, h.UpdatedAt = fromUS(since), time.UnixMicro(upd).UTC()
		out = append(out, h)
	}
	return out, rows.Err()
}

func (s *sqlStore) SaveAlert(ctx context.Context, a Alert) error {
	return s.tx(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, s.q(`INSERT INTO alerts (id, agent, kind, severity, value, threshold, samples,
			raised_at, resolved_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET
			severity = excluded.severity, value = excluded.value, threshold = excluded.threshold,
			samples = excluded.samples, resolved_at = excluded.resolved_at`),
			a.ID, a.Agent, a.Kind, a.Severity, a.Value, a.Threshold, a.Samples, a.RaisedAt.UnixMicro(), us(a.ResolvedAt))
		if err != nil {
			return fmt.Errorf("store: save alert %s: %w", a.ID, err)
		}
		return nil
	})
}

func (s *sqlStore) Alerts(ctx context.Context, activeOnly bool, limit int) ([]Alert, error) {
	if limit <= 0 {
		limit = 100
	}
	where := ""
	if activeOnly {
		where = " WHERE resolved_at IS NULL"
	}
	rows, err := s.db.QueryContext(ctx, s.q(`SELECT id, agent, kind, severity, value, threshold, samples, raised_at,
		resolved_at FROM alerts`+where+` ORDER BY raised_at DESC, id LIMIT ?`), limit)
	if err != nil {
		return nil, fmt.Errorf("store: alerts: %w", err)
	}
	defer rows.Close()
	var out []Alert
	for rows.Next() {
		var a Alert
		var raised int64
		var resolved sql.NullInt64
		if err := rows.Scan(&a.ID, &a.Agent, &a.Kind, &a.Severity, &a.Value, &a.Threshold, &a.Samples, &raised, &resolved); err != nil {
			return nil, fmt.Errorf("store: alerts: %w", err)
		}
		a.RaisedAt, a.ResolvedAt = time.UnixMicro(raised).UTC(), fromUS(resolved)
		out = append(out, a)
	}
	return out, rows.Err()
}
