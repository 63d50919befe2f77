package store_test

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/agentmesh-io/agentmesh/ackmonitor/store"
	"github.com/agentmesh-io/agentmesh/ackmonitor/store/storetest"
)

func TestSQLite(t *testing.T) {
	t.Parallel()
	storetest.Run(t, SQLiteDB)
}

func TestPostgres(t *testing.T) {
	t.Parallel()
	storetest.Run(t, PostgresDB)
}

// SQLiteDB is a storetest.Database in a temporary directory.
func SQLiteDB(t *testing.T) func() (store.Store, error) {
	dir := t.TempDir()
	return func() (store.Store, error) {
		return store.OpenSQLite(context.Background(), filepath.Join(dir, "ledger.db"))
	}
}

var schemaN atomic.Int64

// PostgresDB is a storetest.Database in a fresh schema of the database
// named by AGENTMESH_TEST_POSTGRES_DSN, dropped when the test ends. Without
// the DSN the test fails under CI=true and is skipped otherwise.
func PostgresDB(t *testing.T) func() (store.Store, error) {
	dsn := PostgresDSN(t)
	admin, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	schema := fmt.Sprintf("storetest_%d_%d", os.Getpid(), schemaN.Add(1))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := admin.ExecContext(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE; CREATE SCHEMA "+schema); err != nil {
		admin.Close()
		t.Fatalf("create schema: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := admin.ExecContext(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE"); err != nil {
			t.Errorf("drop schema: %v", err)
		}
		admin.Close()
	})
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatalf("AGENTMESH_TEST_POSTGRES_DSN must be a URL: %v", err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return func() (store.Store, error) { return store.OpenPostgres(context.Background(), u.String()) }
}

// PostgresDSN returns AGENTMESH_TEST_POSTGRES_DSN, failing under CI=true
// and skipping otherwise when it is unset.
func PostgresDSN(t testing.TB) string {
	t.Helper()
	dsn := os.Getenv("AGENTMESH_TEST_POSTGRES_DSN")
	if dsn == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("AGENTMESH_TEST_POSTGRES_DSN is not set and CI=true: the PostgreSQL store must be tested in CI")
		}
		t.Skip("AGENTMESH_TEST_POSTGRES_DSN is not set: skipping the PostgreSQL store tests (set it to run them)")
	}
	return dsn
}
