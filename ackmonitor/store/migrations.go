package store

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"
)

// migrations are applied in order, each once, recorded in
// schema_migrations. The SQL is shared by SQLite and PostgreSQL: BIGINT
// Unix-microsecond times, TEXT, DOUBLE PRECISION and ON CONFLICT upserts
// mean the same in both. Append new versions; never edit an applied one.
var migrations = []string{
	// 1: the ledger, keyed by (stream_seq, consumer).
	`CREATE TABLE message_sends (
		stream_seq            BIGINT PRIMARY KEY,
		message_id            TEXT NOT NULL,
		sender_agent          TEXT NOT NULL,
		receiver_agent        TEXT NOT NULL DEFAULT '',
		topic                 TEXT NOT NULL DEFAULT '',
		kind                  TEXT NOT NULL,
		priority              TEXT NOT NULL,
		message_type          TEXT NOT NULL DEFAULT '',
		action                TEXT NOT NULL DEFAULT '',
		correlation_id        TEXT NOT NULL DEFAULT '',
		workflow_execution_id TEXT NOT NULL DEFAULT '',
		in_reply_to           TEXT NOT NULL DEFAULT '',
		sent_at               BIGINT NOT NULL
	);
	CREATE INDEX idx_sends_message_id ON message_sends (message_id);
	CREATE TABLE message_acknowledgments (
		stream_seq            BIGINT NOT NULL,
		consumer              TEXT NOT NULL,
		message_id            TEXT NOT NULL DEFAULT '',
		sender_agent          TEXT NOT NULL DEFAULT '',
		receiver_agent        TEXT NOT NULL,
		workflow_execution_id TEXT NOT NULL DEFAULT '',
		correlation_id        TEXT NOT NULL DEFAULT '',
		in_reply_to           TEXT NOT NULL DEFAULT '',
		priority              TEXT NOT NULL DEFAULT 'normal',
		sent_at               BIGINT,
		acknowledged_at       BIGINT,
		resolved_at           BIGINT,
		ack_status            TEXT,
		nack_reason           TEXT NOT NULL DEFAULT '',
		retry_count           INTEGER NOT NULL DEFAULT 0,
		deliveries            INTEGER NOT NULL DEFAULT 0,
		naks                  INTEGER NOT NULL DEFAULT 0,
		timeouts              INTEGER NOT NULL DEFAULT 0,
		processing_time_ms    DOUBLE PRECISION,
		history               TEXT NOT NULL DEFAULT '[]',
		handled_at            BIGINT,
		escalated_at          BIGINT,
		director              TEXT NOT NULL DEFAULT '',
		escalation_id         TEXT NOT NULL DEFAULT '',
		dlq_seq               BIGINT,
		created_at            BIGINT NOT NULL,
		PRIMARY KEY (stream_seq, consumer)
	);
	CREATE INDEX idx_ack_sender_receiver ON message_acknowledgments (sender_agent, receiver_agent);
	CREATE INDEX idx_ack_workflow ON message_acknowledgments (workflow_execution_id);
	CREATE INDEX idx_ack_status ON message_acknowledgments (ack_status, sent_at);
	CREATE INDEX idx_ack_receiver ON message_acknowledgments (receiver_agent, priority, sent_at);
	CREATE INDEX idx_ack_resolved ON message_acknowledgments (resolved_at);
	CREATE INDEX idx_ack_sent ON message_acknowledgments (sent_at);
	CREATE INDEX idx_ack_message_id ON message_acknowledgments (message_id);
	CREATE INDEX idx_ack_followup ON message_acknowledgments (handled_at, ack_status);
	CREATE TABLE acknowledgment_metrics (
		agent_id              TEXT NOT NULL,
		priority              TEXT NOT NULL,
		hour_bucket           BIGINT NOT NULL,
		messages_sent         INTEGER NOT NULL DEFAULT 0,
		messages_acknowledged INTEGER NOT NULL DEFAULT 0,
		messages_timeout      INTEGER NOT NULL DEFAULT 0,
		messages_nack         INTEGER NOT NULL DEFAULT 0,
		avg_ack_time_ms       DOUBLE PRECISION,
		PRIMARY KEY (agent_id, priority, hour_bucket)
	);
	CREATE TABLE metrics_dirty (
		agent_id    TEXT NOT NULL,
		priority    TEXT NOT NULL,
		hour_bucket BIGINT NOT NULL,
		gen         BIGINT NOT NULL DEFAULT 0,
		PRIMARY KEY (agent_id, priority, hour_bucket)
	);
	CREATE TABLE alerts (
		id          TEXT PRIMARY KEY,
		agent       TEXT NOT NULL,
		kind        TEXT NOT NULL,
		severity    TEXT NOT NULL,
		value       DOUBLE PRECISION NOT NULL,
		threshold   DOUBLE PRECISION NOT NULL,
		samples     BIGINT NOT NULL,
		raised_at   BIGINT NOT NULL,
		resolved_at BIGINT
	);
	CREATE INDEX idx_alerts_raised ON alerts (raised_at);
	CREATE TABLE agent_health (
		agent             TEXT PRIMARY KEY,
		unavailable_since BIGINT,
		reason            TEXT NOT NULL DEFAULT '',
		updated_at        BIGINT NOT NULL
	);`,
	// 2: unresolved rows in key order, for Store.Pending (the monitor's
	// inferred ACKs); idx_ack_status would sort every pending row per page.
	`CREATE INDEX idx_ack_pending ON message_acknowledgments (stream_seq, consumer) WHERE ack_status IS NULL;`,
	// 3: rows due a follow-up in key order, for Store.PendingFollowUps;
	// idx_ack_followup also holds every ACK row, whose handled_at is NULL.
	`CREATE INDEX idx_ack_followup_due ON message_acknowledgments (stream_seq, consumer)
	WHERE handled_at IS NULL AND ack_status IN ('TIMEOUT', 'NACK');`,
	// 4: events the ledger refused and the monitor dropped (Batch.Refused),
	// by ledger row, so Store.Pending can leave out the rows whose TERM or
	// MAX_DELIVERIES is lost (no ACK is inferred for them); and the row an
	// empty Apply writes to check that the store takes writes.
	`CREATE TABLE refused_events (
		stream_seq BIGINT NOT NULL,
		consumer   TEXT NOT NULL,
		event_id   TEXT NOT NULL,
		kind       TEXT NOT NULL,
		refused_at BIGINT NOT NULL,
		PRIMARY KEY (stream_seq, consumer, event_id)
	);
	CREATE TABLE store_probe (
		id        INTEGER PRIMARY KEY,
		probed_at BIGINT NOT NULL
	);`,
	// 5: terminations as invalid input are their sender's (StatusInvalid),
	// not the receiver's NACKs: rows recorded before are converted and
	// their hours rolled up again, and follow-ups take them too.
	`UPDATE message_acknowledgments SET ack_status = 'INVALID' WHERE ack_status = 'NACK' AND substr(nack_reason, 1, 9) = 'INVALID: ';
	INSERT INTO metrics_dirty (agent_id, priority, hour_bucket, gen)
	SELECT DISTINCT receiver_agent, priority, sent_at - sent_at % 3600000000, 0 FROM message_acknowledgments
	WHERE ack_status = 'INVALID' AND sent_at IS NOT NULL
	ON CONFLICT (agent_id, priority, hour_bucket) DO UPDATE SET gen = metrics_dirty.gen + 1;
	DROP INDEX idx_ack_followup_due;
	CREATE INDEX idx_ack_followup_due ON message_acknowledgments (stream_seq, consumer)
	WHERE handled_at IS NULL AND ack_status IN ('TIMEOUT', 'NACK', 'INVALID');`,
	// 6: follow-ups that can never succeed are given up (FailFollowUps):
	// failed tries counted, the last error kept, and a given-up row no
	// longer due.
	`ALTER TABLE message_acknowledgments ADD COLUMN follow_up_attempts INTEGER NOT NULL DEFAULT 0;
	ALTER TABLE message_acknowledgments ADD COLUMN follow_up_error TEXT NOT NULL DEFAULT '';
	ALTER TABLE message_acknowledgments ADD COLUMN given_up_at BIGINT;
	DROP INDEX idx_ack_followup_due;
	CREATE INDEX idx_ack_followup_due ON message_acknowledgments (stream_seq, consumer)
	WHERE handled_at IS NULL AND given_up_at IS NULL AND ack_status IN ('TIMEOUT', 'NACK', 'INVALID');
	CREATE INDEX idx_ack_given_up ON message_acknowledgments (given_up_at) WHERE given_up_at IS NOT NULL;`,
	// 7: the hourly rollup counts messages exhausted by NAKs alone apart,
	// as the rates do (nakExhaustedSQL); the hours holding one are rolled
	// up again.
	`ALTER TABLE acknowledgment_metrics ADD COLUMN messages_nak_exhausted INTEGER NOT NULL DEFAULT 0;
	INSERT INTO metrics_dirty (agent_id, priority, hour_bucket, gen)
	SELECT DISTINCT receiver_agent, priority, sent_at - sent_at % 3600000000, 0 FROM message_acknowledgments
	WHERE ` + nakExhaustedSQL + ` AND sent_at IS NOT NULL
	ON CONFLICT (agent_id, priority, hour_bucket) DO UPDATE SET gen = metrics_dirty.gen + 1;`,
	// 8: redeliveries of handled messages whose ack was lost or late
	// (Record.LateAcks) are counted apart from timeouts. Rows recorded
	// before keep 0: their ACKs were never judged (Event.LateAck).
	`ALTER TABLE message_acknowledgments ADD COLUMN late_acks INTEGER NOT NULL DEFAULT 0;`,
}

// migrate applies every migration up to version to that is not yet
// recorded in schema_migrations. Each runs under the dialect's migration
// lock, and so does creating schema_migrations: PostgreSQL's CREATE TABLE
// IF NOT EXISTS fails (23505) when another store opening the same schema
// creates it at the same moment.
func (s *sqlStore) migrate(ctx context.Context, to int) error {
	for i, m := range migrations[:to] {
		version := i + 1
		if err := s.tx(ctx, func(tx *sql.Tx) error {
			if s.d.migrationLock != "" {
				if _, err := tx.ExecContext(ctx, s.d.migrationLock); err != nil {
					return err
				}
			}
			if _, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (version BIGINT PRIMARY KEY, applied_at BIGINT NOT NULL)`); err != nil {
				return fmt.Errorf("schema_migrations: %w", err)
			}
			var n int
			if err := tx.QueryRowContext(ctx, s.q(`SELECT COUNT(*) FROM schema_migrations WHERE version = ?`), version).Scan(&n); err != nil {
				return err
			}
			if n > 0 {
				return nil
			}
			for _, stmt := range strings.Split(m, ";\n") {
				if strings.TrimSpace(stmt) == "" {
					continue
				}
				if _, err := tx.ExecContext(ctx, stmt); err != nil {
					return fmt.Errorf("%s: %w", strings.TrimSpace(stmt)[:min(60, len(strings.TrimSpace(stmt)))], err)
				}
			}
			_, err := tx.ExecContext(ctx, s.q(`INSERT INTO schema_migrations (version, applied_at) VALUES (?, ?)`), version, time.Now().UnixMicro())
			return err
		}); err != nil {
			return fmt.Errorf("%w: %s: version %d: %w", ErrMigration, s.d.name, version, err)
		}
	}
	return nil
}
