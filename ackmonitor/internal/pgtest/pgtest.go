// Package pgtest gives tests a PostgreSQL schema of their own in the
// database named by AGENTMESH_TEST_POSTGRES_DSN. It imports nothing of
// the monitor, so the store's own tests can use it as well.
package pgtest

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"os"
	"sync/atomic"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
)

// EnvDSN names the environment variable holding the test database's DSN.
const EnvDSN = "AGENTMESH_TEST_POSTGRES_DSN"

var schemaN atomic.Int64

// DSN returns the test database's DSN. Without one, t fails under
// CI=true, where PostgreSQL must be tested, and is skipped otherwise.
func DSN(t testing.TB) string {
	t.Helper()
	dsn := os.Getenv(EnvDSN)
	if dsn == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal(EnvDSN + " is not set and CI=true: PostgreSQL must be tested in CI")
		}
		t.Skip(EnvDSN + " is not set: skipping the PostgreSQL tests (set it to run them)")
	}
	return dsn
}

// Schema creates a fresh schema, named after prefix, in the test database
// and returns a DSN whose search path is that schema; the schema is
// dropped when t ends. Without a DSN, t fails or is skipped as in DSN.
func Schema(t testing.TB, prefix string) string {
	t.Helper()
	dsn := DSN(t)
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatalf("%s must be a URL: %v", EnvDSN, err)
	}
	admin, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	schema := fmt.Sprintf("%s_%d_%d", prefix, os.Getpid(), schemaN.Add(1))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// A schema of the same name is left over from a killed run.
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
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String()
}
