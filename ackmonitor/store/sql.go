package store

import (
	"context"
	"database/sql"
	"strconv"
	"strings"
	"sync"
	"time"
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
