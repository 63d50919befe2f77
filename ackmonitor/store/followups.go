package store

import (
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"maps"
	"slices"
	"strings"
)

func (s *sqlStore) PendingFollowUps(ctx context.Context, after Key, limit int) ([]Record, error) {
	if limit <= 0 {
		limit = 100
	}
	return s.queryRecords(ctx, `SELECT `+recordCols+` FROM message_acknowledgments WHERE handled_at IS NULL
		AND given_up_at IS NULL AND ack_status IN ('TIMEOUT', 'NACK', 'INVALID') AND (stream_seq, consumer) > (?, ?)
		ORDER BY stream_seq, consumer LIMIT ?`, int64(after.StreamSeq), after.Consumer, limit)
}

// updateRows writes rows of values to the ledger rows they name, in one
// transaction, with a statement per chunk: UPDATE ... SET set FROM
// (VALUES ...) AS v WHERE the row's key is (v.column1, v.column2). Each
// row's values are its key's, then the rest in the order of types, their
// SQL types (PostgreSQL types no parameter of a VALUES list by itself).
// Rows are written whether or not every key has a row; the error matches
// ErrNotFound when some has none. The advisory locks of Apply are taken
// first, in the same order, so the two never wait for each other's row
// locks in opposite orders.
func (s *sqlStore) updateRows(ctx context.Context, what, set string, types []string, keys []Key, values [][]any) error {
	if len(keys) == 0 {
		return nil
	}
	one := "(CAST(? AS BIGINT), CAST(? AS TEXT)"
	for _, t := range types {
		one += ", CAST(? AS " + t + ")"
	}
	one += ")"
	updated := int64(0)
	err := s.tx(ctx, func(tx *sql.Tx) error {
		updated = 0
		if s.d.lockRows != "" {
			var b Batch
			for _, k := range keys {
				b.Events = append(b.Events, Event{StreamSeq: k.StreamSeq})
			}
			if _, err := tx.ExecContext(ctx, s.q(s.d.lockRows), rowLockIDs(b)); err != nil {
				return fmt.Errorf("store: lock ledger rows: %w", err)
			}
		}
		for _, c := range chunks(len(keys), 500) {
			args := make([]any, 0, (c[1]-c[0])*(2+len(types)))
			for i := c[0]; i < c[1]; i++ {
				args = append(args, int64(keys[i].StreamSeq), keys[i].Consumer)
				args = append(args, values[i]...)
			}
			res, err := tx.ExecContext(ctx, s.q(`UPDATE message_acknowledgments SET `+set+` FROM (VALUES `+
				strings.TrimSuffix(strings.Repeat(one+", ", c[1]-c[0]), ", ")+`) AS v
				WHERE stream_seq = v.column1 AND consumer = v.column2`), args...)
			if err != nil {
				return fmt.Errorf("store: %s: %w", what, err)
			}
			n, err := res.RowsAffected()
			if err != nil {
				return fmt.Errorf("store: %s: %w", what, err)
			}
			updated += n
		}
		return nil
	})
	if err != nil {
		return err
	}
	if updated < int64(len(keys)) {
		return fmt.Errorf("%w: %s: %d of %d rows", ErrNotFound, what, int64(len(keys))-updated, len(keys))
	}
	return nil
}

// sortedUnique returns items in key order, one per key (the last given).
func sortedUnique[T any](items []T, key func(T) Key) []T {
	byKey := make(map[Key]T, len(items))
	for _, it := range items {
		byKey[key(it)] = it
	}
	out := slices.Collect(maps.Values(byKey))
	slices.SortFunc(out, func(x, y T) int {
		a, b := key(x), key(y)
		return cmp.Or(cmp.Compare(a.StreamSeq, b.StreamSeq), cmp.Compare(a.Consumer, b.Consumer))
	})
	return out
}

func (s *sqlStore) RecordDeadLetters(ctx context.Context, ds []DeadLetter) error {
	ds = sortedUnique(ds, func(d DeadLetter) Key { return d.Key })
	keys, values := make([]Key, len(ds)), make([][]any, len(ds))
	for i, d := range ds {
		keys[i], values[i] = d.Key, []any{int64(d.DLQSeq)}
	}
	return s.updateRows(ctx, "dead letters", `dlq_seq = v.column3`, []string{"BIGINT"}, keys, values)
}

func (s *sqlStore) CompleteFollowUps(ctx context.Context, fs []FollowUp) error {
	fs = sortedUnique(fs, func(f FollowUp) Key { return f.Key })
	keys, values := make([]Key, len(fs)), make([][]any, len(fs))
	for i, f := range fs {
		var dlq any
		if f.DLQSeq > 0 {
			dlq = int64(f.DLQSeq)
		}
		keys[i], values[i] = f.Key, []any{us(f.HandledAt), us(f.EscalatedAt), f.Director, f.EscalationID, dlq}
	}
	return s.updateRows(ctx, "follow-ups", `handled_at = v.column3, escalated_at = v.column4, director = v.column5,
		escalation_id = v.column6, dlq_seq = v.column7`, []string{"BIGINT", "BIGINT", "TEXT", "TEXT", "BIGINT"}, keys, values)
}

// FailFollowUps keeps the first time a row was given up: a try that
// failed on another instance meanwhile does not move or clear it.
func (s *sqlStore) FailFollowUps(ctx context.Context, fs []FollowUpFailure) error {
	fs = sortedUnique(fs, func(f FollowUpFailure) Key { return f.Key })
	keys, values := make([]Key, len(fs)), make([][]any, len(fs))
	for i, f := range fs {
		var givenUp any
		if f.GiveUp {
			givenUp = f.At.UnixMicro()
		}
		keys[i], values[i] = f.Key, []any{text(f.Reason), givenUp}
	}
	return s.updateRows(ctx, "failed follow-ups", `follow_up_attempts = follow_up_attempts + 1,
		follow_up_error = v.column3, given_up_at = COALESCE(given_up_at, v.column4)`, []string{"TEXT", "BIGINT"}, keys, values)
}
