package ackmonitor_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/agentmesh-io/agentmesh/ackmonitor/store"
	"github.com/agentmesh-io/agentmesh/internal/natstest"
)

// apiGet returns the status, the body and the decoded JSON object of a GET.
func apiGet(t *testing.T, url string) (int, string, map[string]any) {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	if ct := res.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("GET %s: Content-Type %q", url, ct)
	}
	var v map[string]any
	if err := json.Unmarshal(body, &v); err != nil {
		t.Fatalf("GET %s: %v in %q", url, err, body)
	}
	return res.StatusCode, string(body), v
}

// Bad query parameters are answered 400 with a message naming the
// parameter, before they reach the store (on PostgreSQL a NUL byte or
// invalid UTF-8 used to come back as a 500 with the database's error);
// ranges and series beyond the limits are refused too.
func TestHTTP_BadParameters(t *testing.T) {
	t.Parallel()
	for _, kind := range []storeKind{sqliteStore, postgresStore} {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			m := newMesh(t)
			mon := startMonitor(t, m.s, fastConfig(openStore(t, kind)))
			srv := httptest.NewServer(mon.Handler())
			t.Cleanup(srv.Close)
			for _, tc := range []struct {
				path, param string
			}{
				{"/api/v1/messages?agent=%00", "agent"},
				{"/api/v1/messages?agent=%ff", "agent"},
				{"/api/v1/messages?agent=worker.>", "agent"},
				{"/api/v1/messages?agent=" + strings.Repeat("a", 65), "agent"},
				{"/api/v1/messages?status=%ff", "status"},
				{"/api/v1/messages?status=%00", "status"},
				{"/api/v1/messages?status=PENDING", "status"},
				{"/api/v1/messages?status=ack", "status"},
				{"/api/v1/messages?limit=abc", "limit"},
				{"/api/v1/messages?limit=0", "limit"},
				{"/api/v1/alerts?limit=-1", "limit"},
				{"/api/v1/escalations?limit=1.5", "limit"},
				{"/api/v1/dlq?limit=%00", "limit"},
				{"/api/v1/timeseries?agent=%00", "agent"},
				{"/api/v1/timeseries?range=2562047h&step=1s", "range"},
				{"/api/v1/timeseries?range=745h&step=1h", "range"},
				{"/api/v1/timeseries?range=abc", "range"},
				{"/api/v1/timeseries?range=-1h", "range"},
				{"/api/v1/timeseries?range=744h&step=1s", "step"},
				{"/api/v1/timeseries?range=744h&step=267839ms", "step"}, // 10,001 points
				{"/api/v1/timeseries?step=1ms", "step"},
				{"/api/v1/timeseries?step=0s", "step"},
				{"/api/v1/timeseries?step=abc", "step"},
				{"/api/v1/hourly?range=2562047h", "range"},
				{"/api/v1/hourly?range=0s", "range"},
				{"/api/v1/hourly?range=%00", "range"},
			} {
				t.Run(tc.path, func(t *testing.T) {
					code, body, v := apiGet(t, srv.URL+tc.path)
					if code != http.StatusBadRequest {
						t.Fatalf("status %d, want 400; body %s", code, body)
					}
					msg, _ := v["error"].(string)
					if v["parameter"] != tc.param || !strings.HasPrefix(msg, "parameter "+tc.param+": ") {
						t.Errorf("body %s does not name parameter %q", body, tc.param)
					}
				})
			}
		})
	}
}

// Parameters within the limits are accepted, and /timeseries reports the
// step the store used.
func TestHTTP_GoodParameters(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	mon := startMonitor(t, m.s, fastConfig(openStore(t, sqliteStore)))
	srv := httptest.NewServer(mon.Handler())
	t.Cleanup(srv.Close)
	for _, tc := range []struct {
		path string
		want map[string]any // fields of the answer
	}{
		{"/api/v1/messages?agent=worker_1&status=ACK&limit=5000", nil},
		{"/api/v1/messages?status=NACK", nil},
		{"/api/v1/messages?status=TIMEOUT", nil},
		{"/api/v1/messages?status=INVALID", nil},
		{"/api/v1/messages?status=given_up&limit=10", nil},
		{"/api/v1/senders", map[string]any{"window_seconds": 300.0}},
		{"/api/v1/alerts?all=1&limit=1", nil},
		{"/api/v1/escalations?limit=20", nil},
		{"/api/v1/dlq?limit=20", nil},
		{"/api/v1/hourly?range=744h", nil},
		{"/api/v1/timeseries", map[string]any{"range_seconds": 3600.0, "step_seconds": 60.0}},
		{"/api/v1/timeseries?range=30m&step=30s", map[string]any{"range_seconds": 1800.0, "step_seconds": 30.0}}, // the dashboard's
		{"/api/v1/timeseries?range=744h&step=267840ms", map[string]any{"step_seconds": 267.84}},                  // 10,000 points
		{"/api/v1/timeseries?agent=worker-1&step=1500ms", map[string]any{"step_seconds": 1.5}},
		{"/api/v1/timeseries?step=1.0000005s", map[string]any{"step_seconds": 1.0}}, // the store counts whole microseconds
	} {
		t.Run(tc.path, func(t *testing.T) {
			code, body, v := apiGet(t, srv.URL+tc.path)
			if code != http.StatusOK {
				t.Fatalf("status %d, want 200; body %s", code, body)
			}
			for k, want := range tc.want {
				if v[k] != want {
					t.Errorf("%s = %v, want %v", k, v[k], want)
				}
			}
		})
	}
}

// A store error is logged and answered 500 without the database's text.
func TestHTTP_StoreErrorHidden(t *testing.T) {
	t.Parallel()
	for _, kind := range []storeKind{sqliteStore, postgresStore} {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			st, db := openBreakableStore(t, kind)
			m := newMesh(t)
			var logs natstest.SyncBuffer
			cfg := fastConfig(st)
			cfg.Logger = slog.New(slog.NewTextHandler(io.MultiWriter(t.Output(), &logs), nil))
			mon := startMonitor(t, m.s, cfg)
			srv := httptest.NewServer(mon.Handler())
			t.Cleanup(srv.Close)
			if _, err := db.Exec("DROP TABLE message_acknowledgments"); err != nil {
				t.Fatal(err)
			}
			for _, path := range []string{"/api/v1/messages?agent=worker&status=ACK", "/api/v1/summary", "/api/v1/agents",
				"/api/v1/escalations", "/api/v1/dlq", "/api/v1/timeseries?agent=worker"} {
				t.Run(path, func(t *testing.T) {
					code, body, v := apiGet(t, srv.URL+path)
					if code != http.StatusInternalServerError {
						t.Fatalf("status %d, want 500; body %s", code, body)
					}
					if v["error"] != "internal error (see the monitor's log)" {
						t.Errorf("body %s", body)
					}
					for _, leak := range []string{"message_acknowledgments", "store:", "SQLSTATE", "no such table", "does not exist"} {
						if strings.Contains(body, leak) {
							t.Errorf("body %s shows %q", body, leak)
						}
					}
					if !strings.Contains(logs.String(), "path="+strings.SplitN(path, "?", 2)[0]) {
						t.Errorf("the failed request to %s is not logged", path)
					}
				})
			}
		})
	}
}

// openBreakableStore is openStore plus a separate connection to the same
// database, to break it under the store.
func openBreakableStore(t *testing.T, kind storeKind) (store.Store, *sql.DB) {
	t.Helper()
	at := ledgerAt(t, kind)
	open, driver, dsn := store.OpenSQLite, "sqlite", "file:"+at+"?_pragma=busy_timeout(10000)"
	if kind == postgresStore {
		open, driver, dsn = store.OpenPostgres, "pgx", at
	}
	st, err := open(context.Background(), at)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	db, err := sql.Open(driver, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return st, db
}
