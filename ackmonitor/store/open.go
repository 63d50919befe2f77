package store

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v4"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
	_ "modernc.org/sqlite"             // database/sql driver "sqlite"
)

// SQLiteFile is the ledger's file name in the data directory.
const SQLiteFile = "ackmonitor.db"

// OpenSQLite opens (creating if needed) the SQLite ledger at path, a file
// name or a directory (then [SQLiteFile] inside it), in WAL mode, and
// brings its schema up to date. The driver is pure Go (modernc.org/sqlite).
func OpenSQLite(ctx context.Context, path string) (Store, error) {
	db, d, err := openSQLite(ctx, path)
	if err != nil {
		return nil, err
	}
	return newSQLStore(ctx, db, d)
}

// openSQLite opens the database of OpenSQLite, its schema as it is.
func openSQLite(ctx context.Context, path string) (*sql.DB, dialect, error) {
	if fi, err := os.Stat(path); err == nil && fi.IsDir() {
		path = filepath.Join(path, SQLiteFile)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, dialect{}, fmt.Errorf("store: sqlite dir: %w", err)
	}
	q := url.Values{}
	q.Add("_pragma", "busy_timeout(10000)")
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "synchronous(NORMAL)")
	q.Add("_pragma", "foreign_keys(ON)")
	q.Set("_txlock", "immediate")
	// Two processes opening a new database race to switch it to WAL, and
	// SQLite answers the loser SQLITE_BUSY at once, without its busy
	// handler: that one try again.
	open := func() (*sql.DB, error) {
		db, err := sql.Open("sqlite", "file:"+path+"?"+q.Encode())
		if err != nil {
			return nil, backoff.Permanent(err)
		}
		db.SetMaxOpenConns(4)
		if err := db.PingContext(ctx); err != nil {
			db.Close()
			if !strings.Contains(err.Error(), "SQLITE_BUSY") {
				err = backoff.Permanent(err)
			}
			return nil, err
		}
		return db, nil
	}
	retry := backoff.WithContext(backoff.WithMaxRetries(backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(10*time.Millisecond), backoff.WithMaxInterval(time.Second)), 10), ctx)
	db, err := backoff.RetryWithData(open, retry)
	if err != nil {
		return nil, dialect{}, fmt.Errorf("store: open sqlite %s: %w", path, err)
	}
	return db, dialect{name: "sqlite", serialWrites: true, pendingIndex: " INDEXED BY idx_ack_pending"}, nil
}

// rowLockSpace is the first key of PostgreSQL's advisory locks on ledger
// rows ("am" in ASCII).
const rowLockSpace = "24941"

// OpenPostgres connects to PostgreSQL with dsn (a URL or key=value string;
// add search_path=... to use a schema other than public) and brings the
// schema up to date. Concurrent monitors migrate one at a time (advisory
// lock).
func OpenPostgres(ctx context.Context, dsn string) (Store, error) {
	db, d, err := openPostgres(ctx, dsn)
	if err != nil {
		return nil, err
	}
	return newSQLStore(ctx, db, d)
}

// openPostgres opens the database of OpenPostgres, its schema as it is.
func openPostgres(ctx context.Context, dsn string) (*sql.DB, dialect, error) {
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return nil, dialect{}, fmt.Errorf("store: open postgres: %w", err)
	}
	db.SetMaxOpenConns(8)
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, dialect{}, fmt.Errorf("store: open postgres: %w", err)
	}
	return db, dialect{
		name:      "postgres",
		dollar:    true,
		forUpdate: " FOR UPDATE",
		// Row locks live in their own space (first key), apart from the
		// migration lock.
		lockRows:      "SELECT pg_advisory_xact_lock(" + rowLockSpace + ", id) FROM unnest(CAST(? AS integer[])) AS id",
		migrationLock: "SELECT pg_advisory_xact_lock(4242424242)",
	}, nil
}
