package main

import (
	"encoding/json"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentmesh-io/agentmesh/internal/natstest"
)

// A second instance on its own SQLite ledger stands by with a ledger
// nobody shares: it warns that failover needs the PostgreSQL ledger.
func TestRun_StandbyOnSQLiteWarns(t *testing.T) {
	s := natstest.RunServer(t)
	t.Setenv("NATS_URL", s.ClientURL())
	args := func(addr string) []string {
		return []string{"--data", filepath.Join(t.TempDir(), "d"), "--http", addr, "--log-level", "warn", "--pinned-ttl", "1s"}
	}
	addr1, done1 := serve(t, args, io.Discard)
	waitHealthy(t, addr1, done1)
	natstest.WaitFor(t, 15*time.Second, func() error { // the first one is active
		if h := getHealth(addr1); h["active"] != true {
			return errMsg("first instance not active yet")
		}
		return nil
	})
	var log2 natstest.SyncBuffer
	_, done2 := serve(t, args, &log2)
	natstest.WaitFor(t, 15*time.Second, func() error {
		if !strings.Contains(log2.String(), "standby on a SQLite ledger") {
			return errMsg("no standby warning yet: " + log2.String())
		}
		return nil
	})
	if !strings.Contains(log2.String(), "--postgres") {
		t.Errorf("the warning does not say what to do: %s", log2.String())
	}
	stop(t, done1)
	select {
	case err := <-done2:
		if err != nil {
			t.Fatalf("second instance: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("second instance did not stop on SIGINT")
	}
}

type errMsg string

func (e errMsg) Error() string { return string(e) }

// healthClient gives up on an address that accepts but does not answer
// (another process's, which took a port freeAddr let go).
var healthClient = &http.Client{Timeout: 2 * time.Second}

// getHealth returns the /healthz answer at addr, or nil.
func getHealth(addr string) map[string]any {
	res, err := healthClient.Get("http://" + addr + "/healthz")
	if err != nil {
		return nil
	}
	defer res.Body.Close()
	var h map[string]any
	if json.NewDecoder(res.Body).Decode(&h) != nil {
		return nil
	}
	return h
}
