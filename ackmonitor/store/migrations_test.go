package store

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/agentmesh-io/agentmesh/ackmonitor/internal/pgtest"
)

// upgrade opens a fresh database of each dialect (PostgreSQL with
// AGENTMESH_TEST_POSTGRES_DSN), brings it to version from, lets fill write
// to it as a monitor of that version did, then opens it as a store of
// this version and hands it to check.
func upgrade(t *testing.T, from int, fill func(t *testing.T, s *sqlStore), check func(t *testing.T, s *sqlStore)) {
	for _, name := range []string{"sqlite", "postgres"} {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			var db *sql.DB
			var d dialect
			var err error
			if name == "sqlite" {
				db, d, err = openSQLite(ctx, filepath.Join(t.TempDir(), "ledger.db"))
			} else {
				db, d, err = openPostgres(ctx, pgtest.Schema(t, "store_migration"))
			}
			if err != nil {
				t.Fatal(err)
			}
			old := unmigrated(db, d)
			t.Cleanup(func() { old.Close() })
			if err := old.migrate(ctx, from); err != nil {
				t.Fatal(err)
			}
			fill(t, old)
			if err := old.migrate(ctx, len(migrations)); err != nil {
				t.Fatalf("upgrade from version %d: %v", from, err)
			}
			check(t, old)
		})
	}
}

// Rows a monitor recorded as NACKs though their TERM said the message was
// invalid input become INVALID, due a follow-up if they were not followed
// up yet, and their hours are rolled up again.
func TestMigration_InvalidTermsBecomeInvalid(t *testing.T) {
	t.Parallel()
	sent := time.Date(2026, 11, 20, 10, 30, 0, 0, time.UTC)
	upgrade(t, 4, func(t *testing.T, s *sqlStore) {
		for i, row := range []struct {
			reason  string
			handled any
		}{{"INVALID: not an envelope", nil}, {"INVALID: followed up", sent.UnixMicro()}, {"NOT_FOUND: x", nil}, {"invalid: y", nil}} {
			if _, err := s.db.Exec(s.q(`INSERT INTO message_acknowledgments (stream_seq, consumer, sender_agent, receiver_agent,
				priority, sent_at, resolved_at, ack_status, nack_reason, handled_at, created_at)
				VALUES (?, 'b_normal', 'a', 'b', 'normal', ?, ?, 'NACK', ?, ?, ?)`),
				i+1, sent.UnixMicro(), sent.UnixMicro(), row.reason, row.handled, sent.UnixMicro()); err != nil {
				t.Fatal(err)
			}
		}
	}, func(t *testing.T, s *sqlStore) {
		ctx := context.Background()
		recs, err := s.Messages(ctx, Query{Limit: 10})
		if err != nil {
			t.Fatal(err)
		}
		got := map[uint64]string{}
		for _, r := range recs {
			got[r.StreamSeq] = r.Status
		}
		if want := map[uint64]string{1: StatusInvalid, 2: StatusInvalid, 3: StatusNACK, 4: StatusNACK}; fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("statuses %v, want %v", got, want)
		}
		due, err := s.PendingFollowUps(ctx, Key{}, 10)
		if err != nil || len(due) != 3 || due[0].StreamSeq != 1 || due[1].StreamSeq != 3 {
			t.Fatalf("due follow-ups = %+v, %v", due, err)
		}
		if err := s.Rollup(ctx); err != nil {
			t.Fatal(err)
		}
		hours, err := s.Hourly(ctx, sent.Add(-time.Hour))
		if err != nil || len(hours) != 1 || !hours[0].Hour.Equal(sent.Truncate(time.Hour)) || hours[0].Nacked != 2 || hours[0].Sent != 4 {
			t.Fatalf("hourly = %+v, %v; want the hour rolled up again with 2 NACKs of 4", hours, err)
		}
	})
}

// Rows recorded before follow-ups could be given up keep what they had:
// a row due stays due, with no failed try.
func TestMigration_GiveUpColumns(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 11, 20, 10, 30, 0, 0, time.UTC).UnixMicro()
	upgrade(t, 5, func(t *testing.T, s *sqlStore) {
		for seq, handled := range []any{nil, at} {
			if _, err := s.db.Exec(s.q(`INSERT INTO message_acknowledgments (stream_seq, consumer, receiver_agent,
				resolved_at, ack_status, handled_at, dlq_seq, created_at) VALUES (?, 'b_normal', 'b', ?, 'TIMEOUT', ?, 3, ?)`),
				seq+1, at, handled, at); err != nil {
				t.Fatal(err)
			}
		}
	}, func(t *testing.T, s *sqlStore) {
		due, err := s.PendingFollowUps(context.Background(), Key{}, 10)
		if err != nil || len(due) != 1 || due[0].StreamSeq != 1 || due[0].DLQSeq != 3 || due[0].FollowUpAttempts != 0 || !due[0].GivenUpAt.IsZero() {
			t.Fatalf("due = %+v, %v", due, err)
		}
	})
}

// Hours rolled up before messages exhausted by NAKs alone were counted
// apart are rolled up again, so their timeout rate leaves them out.
func TestMigration_HourlyNakExhausted(t *testing.T) {
	t.Parallel()
	sent := time.Date(2026, 11, 20, 10, 30, 0, 0, time.UTC)
	upgrade(t, 6, func(t *testing.T, s *sqlStore) {
		for i, row := range []struct {
			status   string
			timeouts int
		}{{"TIMEOUT", 0}, {"TIMEOUT", 1}, {"ACK", 0}, {"ACK", 0}} {
			if _, err := s.db.Exec(s.q(`INSERT INTO message_acknowledgments (stream_seq, consumer, sender_agent, receiver_agent,
				priority, sent_at, resolved_at, ack_status, timeouts, created_at)
				VALUES (?, 'b_normal', 'a', 'b', 'normal', ?, ?, ?, ?, ?)`),
				i+1, sent.UnixMicro(), sent.UnixMicro(), row.status, row.timeouts, sent.UnixMicro()); err != nil {
				t.Fatal(err)
			}
		}
		// The hour as version 6 rolled it up, nothing left dirty: both
		// TIMEOUTs counted as timeouts.
		if _, err := s.db.Exec(s.q(`INSERT INTO acknowledgment_metrics (agent_id, priority, hour_bucket, messages_sent,
			messages_acknowledged, messages_timeout, messages_nack) VALUES ('b', 'normal', ?, 4, 2, 2, 0)`),
			sent.Truncate(time.Hour).UnixMicro()); err != nil {
			t.Fatal(err)
		}
	}, func(t *testing.T, s *sqlStore) {
		ctx := context.Background()
		if err := s.Rollup(ctx); err != nil {
			t.Fatal(err)
		}
		hours, err := s.Hourly(ctx, sent.Add(-time.Hour))
		if err != nil || len(hours) != 1 || hours[0].TimedOut != 2 || hours[0].NakExhausted != 1 || hours[0].TimeoutRate() != 0.25 {
			t.Fatalf("hourly = %+v, %v; want the hour rolled up again with 1 of 2 TIMEOUTs exhausted by NAKs", hours, err)
		}
	})
}
