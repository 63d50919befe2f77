package store

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// dialect holds what differs between SQLite and PostgreSQL.
type dialect struct {
	name string
	// dollar: placeholders are $1, $2, ... instead of ?.
	dollar bool
	// forUpdate is appended to row reads inside Apply (row locks in
	// PostgreSQL; SQLite's writer lock covers the whole transaction).
	forUpdate string
	// lockRows, if set, takes a transaction lock on each id of an array
	// (rowLockIDs) before Apply touches any row: FOR UPDATE cannot lock a
	// row that does not exist yet.
	lockRows string
	// migrationLock serialises concurrent migrations, if the database needs it.
	migrationLock string
	// serialWrites: take a process-wide mutex around write transactions
	// (SQLite allows one writer).
	serialWrites bool
	// pendingIndex makes Pending read idx_ack_pending (SQLite's planner,
	// without statistics, takes idx_ack_status and sorts every pending row
	// for each page).
	pendingIndex string
}

// sqlStore implements [Store] over database/sql for both dialects.
type sqlStore struct {
	db      *sql.DB
	d       dialect
	writeMu sync.Mutex
	rebound sync.Map // query → rebound query
	stmts   sync.Map // rebound query → *sql.Stmt
	// txSlots keeps concurrent transactions below the pool's connections
	// (nil: no bound). A transaction that prepares a statement not yet
	// cached (prepared) needs a second connection for it: with every
	// connection held by such a transaction, all of them would wait for
	// ever.
	txSlots chan struct{}
	closed  chan struct{}
	once    sync.Once
}

func us(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t.UnixMicro()
}

func fromUS(v sql.NullInt64) time.Time {
	if !v.Valid {
		return time.Time{}
	}
	return time.UnixMicro(v.Int64).UTC()
}

// prepared returns tx's handle on the statement for query, preparing it
// once per store: re-parsing every statement of a batch cost SQLite more
// than executing it.
func (s *sqlStore) prepared(ctx context.Context, tx *sql.Tx, query string) (*sql.Stmt, error) {
	q := s.q(query)
	if v, ok := s.stmts.Load(q); ok {
		return tx.StmtContext(ctx, v.(*sql.Stmt)), nil
	}
	st, err := s.db.PrepareContext(ctx, q)
	if err != nil {
		return nil, err
	}
	if v, loaded := s.stmts.LoadOrStore(q, st); loaded {
		st.Close()
		st = v.(*sql.Stmt)
	}
	return tx.StmtContext(ctx, st), nil
}

func (s *sqlStore) exec(ctx context.Context, tx *sql.Tx, query string, args ...any) (sql.Result, error) {
	st, err := s.prepared(ctx, tx, query)
	if err != nil {
		return nil, err
	}
	return st.ExecContext(ctx, args...)
}

func (s *sqlStore) query(ctx context.Context, tx *sql.Tx, query string, args ...any) (*sql.Rows, error) {
	st, err := s.prepared(ctx, tx, query)
	if err != nil {
		return nil, err
	}
	return st.QueryContext(ctx, args...)
}

// q rewrites ? placeholders for the dialect.
func (s *sqlStore) q(query string) string {
	if !s.d.dollar {
		return query
	}
	if v, ok := s.rebound.Load(query); ok {
		return v.(string)
	}
	var b strings.Builder
	n := 0
	for _, c := range query {
		if c == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(c)
	}
	s.rebound.Store(query, b.String())
	return b.String()
}

func newSQLStore(ctx context.Context, db *sql.DB, d dialect) (*sqlStore, error) {
	s := unmigrated(db, d)
	if err := s.migrate(ctx, len(migrations)); err != nil {
		db.Close()
		return nil, err
	}
	return s, nil
}

// unmigrated returns the store over db, its schema as it is.
func unmigrated(db *sql.DB, d dialect) *sqlStore {
	s := &sqlStore{db: db, d: d, closed: make(chan struct{})}
	if n := db.Stats().MaxOpenConnections; n > 0 && !d.serialWrites {
		s.txSlots = make(chan struct{}, max(n-1, 1))
	}
	return s
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

// tx runs f in a write transaction.
func (s *sqlStore) tx(ctx context.Context, f func(*sql.Tx) error) error {
	select {
	case <-s.closed:
		return ErrClosed
	default:
	}
	if s.d.serialWrites {
		s.writeMu.Lock()
		defer s.writeMu.Unlock()
	}
	if s.txSlots != nil {
		select {
		case s.txSlots <- struct{}{}:
			defer func() { <-s.txSlots }()
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := f(tx); err != nil {
		tx.Rollback()
		return err
	}
	return tx.Commit()
}

func (s *sqlStore) Close() error {
	var err error
	s.once.Do(func() {
		close(s.closed)
		s.writeMu.Lock() // wait for a running write
		s.stmts.Range(func(_, v any) bool { v.(*sql.Stmt).Close(); return true })
		err = s.db.Close()
		s.writeMu.Unlock()
	})
	return err
}

const recordCols = `stream_seq, consumer, message_id, sender_agent, receiver_agent, workflow_execution_id,
	correlation_id, in_reply_to, priority, sent_at, acknowledged_at, resolved_at, ack_status, nack_reason,
	retry_count, deliveries, naks, timeouts, processing_time_ms, history, handled_at, escalated_at,
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
		&r.Deliveries, &r.Naks, &r.Timeouts, &proc, &hist, &handled, &escalated, &r.Director, &r.EscalationID, &dlq,
		&r.FollowUpAttempts, &r.FollowUpError, &givenUp)
	if err != nil {
		return r, err
	}
	r.StreamSeq = uint64(seq)
	r.SentAt, r.AcknowledgedAt, r.ResolvedAt = fromUS(sent), fromUS(acked), fromUS(resolved)
	r.HandledAt, r.EscalatedAt, r.GivenUpAt = fromUS(handled), fromUS(escalated), fromUS(givenUp)
	r.Status = status.String
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

// hour returns the start of t's hour in Unix microseconds.
func hour(t time.Time) int64 { return t.Truncate(time.Hour).UnixMicro() }

type bucket struct {
	agent, priority string
	hour            int64
	gen             int64 // Rollup only
}

// placeholders returns "(?, ?), (?, ?)" for rows × cols.
func placeholders(rows, cols int) string {
	one := "(" + strings.Repeat("?, ", cols-1) + "?)"
	return strings.Repeat(one+", ", rows-1) + one
}

// chunks splits n items into runs of at most size.
func chunks(n, size int) [][2]int {
	var out [][2]int
	for i := 0; i < n; i += size {
		out = append(out, [2]int{i, min(i+size, n)})
	}
	return out
}

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
		// Topic and broadcast: fill in the rows events have created so far.
		if _, err := s.exec(ctx, tx, `UPDATE message_acknowledgments SET message_id = ?, sender_agent = ?,
			workflow_execution_id = ?, correlation_id = ?, in_reply_to = ?, sent_at = ? WHERE stream_seq = ?`,
			snd.MessageID, snd.Sender, snd.Workflow, snd.Correlation, snd.InReplyTo, snd.SentAt.UnixMicro(), int64(snd.StreamSeq)); err != nil {
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
			in_reply_to, sent_at FROM message_sends WHERE stream_seq IN `+placeholders(1, len(part))), part...)
		if err != nil {
			return fmt.Errorf("store: read sends: %w", err)
		}
		for rows.Next() {
			var r Record
			var seq, at int64
			if err := rows.Scan(&seq, &r.MessageID, &r.Sender, &r.Workflow, &r.Correlation, &r.InReplyTo, &at); err != nil {
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
			r = Record{StreamSeq: k.StreamSeq, Consumer: k.Consumer, Receiver: evs[0].Receiver, Priority: evs[0].Priority,
				MessageID: snd.MessageID, Sender: snd.Sender, Workflow: snd.Workflow, Correlation: snd.Correlation,
				InReplyTo: snd.InReplyTo, SentAt: snd.SentAt}
		}
		wasFinal := r.Final()
		n := 0
		for _, e := range evs {
			if r.addEvent(e) {
				n++
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
		if !r.SentAt.IsZero() {
			dirty[bucket{agent: r.Receiver, priority: r.Priority, hour: hour(r.SentAt)}] = struct{}{}
		}
		changed = append(changed, r)
	}
	for _, c := range chunks(len(changed), 300) {
		part := changed[c[0]:c[1]]
		args := make([]any, 0, len(part)*21)
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
				r.RetryCount, r.Deliveries, r.Naks, r.Timeouts, proc, string(hist), now)
		}
		if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO message_acknowledgments (stream_seq, consumer, message_id,
			sender_agent, receiver_agent, workflow_execution_id, correlation_id, in_reply_to, priority, sent_at,
			acknowledged_at, resolved_at, ack_status, nack_reason, retry_count, deliveries, naks, timeouts,
			processing_time_ms, history, created_at) VALUES `+placeholders(len(part), 21)+`
			ON CONFLICT (stream_seq, consumer) DO UPDATE SET acknowledged_at = excluded.acknowledged_at,
			resolved_at = excluded.resolved_at, ack_status = excluded.ack_status, nack_reason = excluded.nack_reason,
			retry_count = excluded.retry_count, deliveries = excluded.deliveries, naks = excluded.naks,
			timeouts = excluded.timeouts, processing_time_ms = excluded.processing_time_ms, history = excluded.history`), args...); err != nil {
			return fmt.Errorf("store: write ledger rows: %w", err)
		}
	}
	return nil
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
		CAST(COALESCE(SUM(CASE WHEN resolved_at >= ? AND ack_status = 'INVALID' THEN 1 ELSE 0 END), 0) AS BIGINT),
		CAST(COALESCE(SUM(CASE WHEN ack_status IS NULL THEN 1 ELSE 0 END), 0) AS BIGINT),
		CAST(COALESCE(SUM(CASE WHEN resolved_at >= ? THEN naks ELSE 0 END), 0) AS BIGINT),
		CAST(COALESCE(SUM(CASE WHEN resolved_at >= ? THEN timeouts ELSE 0 END), 0) AS BIGINT),
		CAST(AVG(CASE WHEN resolved_at >= ? AND ack_status = 'ACK' THEN processing_time_ms END) AS DOUBLE PRECISION),
		CAST(AVG(CASE WHEN resolved_at >= ? AND ack_status = 'ACK' AND sent_at IS NOT NULL
			THEN (acknowledged_at - sent_at) / 1000.0 END) AS DOUBLE PRECISION)
		FROM message_acknowledgments WHERE resolved_at >= ? OR sent_at >= ?`+allPending+`
		GROUP BY receiver_agent, priority ORDER BY receiver_agent, priority`), t, t, t, t, t, t, t, t, t, t, t)
	if err != nil {
		return nil, fmt.Errorf("store: rates: %w", err)
	}
	defer rows.Close()
	var out []Rate
	for rows.Next() {
		var r Rate
		var ack, lat sql.NullFloat64
		if err := rows.Scan(&r.Agent, &r.Priority, &r.Sent, &r.Acked, &r.Nacked, &r.TimedOut, &r.Invalid, &r.Pending,
			&r.Naks, &r.Timeouts, &ack, &lat); err != nil {
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
		if err := rows.Scan(&b, &p.Acked, &p.Nacked, &p.TimedOut, &p.Invalid, &avg); err != nil {
			return nil, fmt.Errorf("store: series: %w", err)
		}
		p.At, p.AvgAckTimeMS = time.UnixMicro(b*stepUS).UTC(), avg.Float64
		out = append(out, p)
	}
	return out, rows.Err()
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
				messages_sent, messages_acknowledged, messages_timeout, messages_nack, avg_ack_time_ms)
				SELECT receiver_agent, priority, ?, COUNT(*),
				COALESCE(SUM(CASE WHEN ack_status = 'ACK' THEN 1 ELSE 0 END), 0),
				COALESCE(SUM(CASE WHEN ack_status = 'TIMEOUT' THEN 1 ELSE 0 END), 0),
				COALESCE(SUM(CASE WHEN ack_status = 'NACK' THEN 1 ELSE 0 END), 0),
				AVG(CASE WHEN ack_status = 'ACK' THEN processing_time_ms END)
				FROM message_acknowledgments WHERE receiver_agent = ? AND priority = ? AND sent_at >= ? AND sent_at < ?
				GROUP BY receiver_agent, priority
				ON CONFLICT (agent_id, priority, hour_bucket) DO UPDATE SET messages_sent = excluded.messages_sent,
				messages_acknowledged = excluded.messages_acknowledged, messages_timeout = excluded.messages_timeout,
				messages_nack = excluded.messages_nack, avg_ack_time_ms = excluded.avg_ack_time_ms`),
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
		messages_acknowledged, messages_timeout, messages_nack, avg_ack_time_ms FROM acknowledgment_metrics
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
		if err := rows.Scan(&m.Agent, &m.Priority, &h, &m.Sent, &m.Acked, &m.TimedOut, &m.Nacked, &avg); err != nil {
			return nil, fmt.Errorf("store: hourly: %w", err)
		}
		m.Hour, m.AvgAckTimeMS = time.UnixMicro(h).UTC(), avg.Float64
		out = append(out, m)
	}
	return out, rows.Err()
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
