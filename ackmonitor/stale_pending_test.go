package ackmonitor_test

import (
	"bufio"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentmesh-io/agentmesh/ackmonitor"
	"github.com/agentmesh-io/agentmesh/ackmonitor/store"
)

// /api/v1/messages?status=pending lists the rows without a final status,
// oldest first (the rows pending longest come first), with the agent and
// limit filters; there was no way to ask for them.
func TestHTTP_PendingMessages(t *testing.T) {
	t.Parallel()
	for _, kind := range []storeKind{sqliteStore, postgresStore} {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			m := newMesh(t)
			st := openStore(t, kind)
			stalePendingLedger(t, st)
			mon := startMonitor(t, m.s, fastConfig(st))
			srv := httptest.NewServer(mon.Handler())
			t.Cleanup(srv.Close)
			for _, tc := range []struct {
				path string
				want string // stream_seq/ack_status of the rows, in order
			}{
				{"/api/v1/messages?status=pending", "[2000/ 2001/ 2002/]"},
				{"/api/v1/messages?status=pending&limit=1", "[2000/]"},
				{"/api/v1/messages?status=pending&agent=worker", "[2002/]"},
				{"/api/v1/messages?status=pending&agent=nobody", "[]"},
				{"/api/v1/messages?status=ACK", "[2003/ACK]"},
				{"/api/v1/messages", "[2003/ACK 2002/ 2001/ 2000/]"},
			} {
				t.Run(tc.path, func(t *testing.T) {
					code, body, v := apiGet(t, srv.URL+tc.path)
					if code != http.StatusOK {
						t.Fatalf("status %d, want 200; body %s", code, body)
					}
					msgs, _ := v["messages"].([]any)
					got := []string{}
					for _, x := range msgs {
						r, _ := x.(map[string]any)
						got = append(got, fmt.Sprintf("%v/%v", r["stream_seq"], r["ack_status"]))
					}
					if fmt.Sprint(got) != tc.want {
						t.Errorf("rows %v, want %s", got, tc.want)
					}
				})
			}
		})
	}
}

// The active instance reports ackmonitor_stale_pending_rows, the rows
// pending since longer than StalePendingAfter (a refused TERM's included);
// a standby reports nothing, and the instance taking over reports the
// count. It follows rows that get their final status.
func TestStalePendingGauge_ActiveInstanceCounts(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	st := openStore(t, sqliteStore)
	ctx := testCtx(t)
	stalePendingLedger(t, st)
	cfg := haConfig(st)
	cfg.StalePendingAfter = time.Hour
	a, b := startMonitor(t, m.s, cfg), startMonitor(t, m.s, cfg)
	var active, standby *running
	var gotActive, gotStandby string
	defer func() {
		if t.Failed() {
			t.Logf("last ackmonitor_stale_pending_rows reads: active %s, standby %s", gotActive, gotStandby)
		}
	}()
	// reads reports whether the active instance reports wantActive and
	// the other wantStandby.
	reads := func(wantActive, wantStandby string) func() bool {
		return func() bool {
			var ok bool
			if active, standby, ok = activeOf(a, b); !ok {
				return false
			}
			gotActive, gotStandby = staleGauge(t, active.Monitor), staleGauge(t, standby.Monitor)
			return gotActive == wantActive && gotStandby == wantStandby
		}
	}
	eventually(t, 30*time.Second, "2 stale rows reported by the active instance only", reads("2", "none"))

	if _, err := st.Apply(ctx, store.Batch{Events: []store.Event{{ID: "late-ack", Kind: store.EventAck,
		Consumer: "gone_normal", Receiver: "gone", Priority: "normal", StreamSeq: 2000, Deliveries: 1,
		At: time.Now().UTC()}}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "1 stale row once the other is acked", reads("1", "none"))

	// The active instance loses the server but keeps running: it steps
	// down, and the other takes over once the pin expires.
	first, second := active, standby
	first.nc.Close()
	eventually(t, 20*time.Second, "the takeover", func() bool { return !first.Active() && second.Active() })
	eventually(t, 10*time.Second, "the stale row reported by the new active instance only", reads("1", "none"))
	if active != second {
		t.Fatal("the instance that lost the server reports as the active one")
	}
}

// stalePendingLedger writes four direct messages: 2000 and 2001 to "gone"
// sent 3 hours ago and pending (2001's TERM refused by the ledger), 2002
// to "worker" sent just now and pending, and 2003 to "worker" sent 3
// hours ago and acked. No consumer of either agent exists, so no monitor
// infers their ACKs.
func stalePendingLedger(t *testing.T, st store.Store) {
	t.Helper()
	now := time.Now().UTC()
	old := now.Add(-3 * time.Hour)
	snd := func(seq uint64, to string, at time.Time) store.Send {
		return store.Send{StreamSeq: seq, MessageID: fmt.Sprintf("msg-%d", seq), Sender: "client", Receiver: to,
			Kind: "agent", Priority: "normal", Action: "work", SentAt: at}
	}
	if _, err := st.Apply(testCtx(t), store.Batch{
		Sends: []store.Send{snd(2000, "gone", old), snd(2001, "gone", old), snd(2002, "worker", now), snd(2003, "worker", old)},
		Events: []store.Event{{ID: "ack-2003", Kind: store.EventAck, Consumer: "worker_normal", Receiver: "worker",
			Priority: "normal", StreamSeq: 2003, Deliveries: 1, AckTime: time.Millisecond, At: now}},
		Refused: []store.Event{{ID: "term-2001", Kind: store.EventTerm, Consumer: "gone_normal", Receiver: "gone",
			Priority: "normal", StreamSeq: 2001, Deliveries: 1, At: now}},
	}); err != nil {
		t.Fatal(err)
	}
}

// staleGauge reads ackmonitor_stale_pending_rows from mon's /metrics:
// its value, or "none" without the series.
func staleGauge(t *testing.T, mon *ackmonitor.Monitor) string {
	t.Helper()
	rec := httptest.NewRecorder()
	mon.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("GET /metrics: %d %s", rec.Code, rec.Body)
	}
	sc := bufio.NewScanner(rec.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "ackmonitor_stale_pending_rows "); ok {
			if _, err := strconv.ParseFloat(v, 64); err != nil {
				t.Fatalf("metrics line %q", sc.Text())
			}
			return v
		}
	}
	return "none"
}
