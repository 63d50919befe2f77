package monitorsvc_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/agentmesh-io/agentmesh/ackmonitor/store"
	"github.com/agentmesh-io/agentmesh/cmd/internal/monitorsvc"
)

// OpenSQLite treats its argument as a directory, created if needed, and
// still opens a ledger file an earlier version created at that path.
func TestOpenSQLite_Directory(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "a", "b")
	st, err := monitorsvc.OpenSQLite(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
	if _, err := os.Stat(filepath.Join(dir, store.SQLiteFile)); err != nil {
		t.Fatalf("no ledger in the new directory: %v", err)
	}
	legacy := filepath.Join(t.TempDir(), "data")
	if st, err = store.OpenSQLite(ctx, legacy); err != nil { // the file earlier versions made
		t.Fatal(err)
	}
	st.Close()
	if st, err = monitorsvc.OpenSQLite(ctx, legacy); err != nil {
		t.Fatalf("legacy ledger file: %v", err)
	}
	st.Close()
	if fi, err := os.Stat(legacy); err != nil || fi.IsDir() {
		t.Fatalf("legacy ledger file replaced: %v", err)
	}
}
