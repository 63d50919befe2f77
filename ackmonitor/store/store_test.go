package store_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/agentmesh-io/agentmesh/ackmonitor/internal/pgtest"
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

// PostgresDB is a storetest.Database in a fresh schema of the database
// named by AGENTMESH_TEST_POSTGRES_DSN, dropped when the test ends. Without
// the DSN the test fails under CI=true and is skipped otherwise.
func PostgresDB(t *testing.T) func() (store.Store, error) {
	dsn := pgtest.Schema(t, "storetest")
	return func() (store.Store, error) { return store.OpenPostgres(context.Background(), dsn) }
}
