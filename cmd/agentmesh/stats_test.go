package main

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// statsMonitor serves the monitor API answers stats reads: planner_1 with
// traffic, executor_1 with messages pending and none resolved, worker_1
// whose failures were all exhausted by NAKs, idle_1 without traffic in
// the window, and seven receivers without a consumer.
func statsMonitor(t *testing.T) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/api/v1/summary":
			w.Write([]byte(`{"monitor":"m1","active":true,"window_seconds":300,"unknown_receivers":7,
				"window":{"sent":114,"pending":4,"acked":101,"timed_out":9,"nak_exhausted":2,"resolved":110,"ack_rate":0.918,"timeout_rate":0.0636}}`))
		case "/api/v1/agents":
			w.Write([]byte(`{"agents":[
				{"agent":"planner_1","window":{"sent":100,"acked":93,"timed_out":7,"resolved":100,"ack_rate":0.93,"timeout_rate":0.07},
				 "priorities":[{"priority":"high","window":{"sent":100,"acked":93,"timed_out":7,"resolved":100,"ack_rate":0.93,"timeout_rate":0.07}},{"priority":"low","window":{}}]},
				{"agent":"executor_1","window":{"sent":4,"pending":4},"priorities":[{"priority":"normal","window":{"sent":4,"pending":4}}]},
				{"agent":"worker_1","window":{"sent":10,"acked":8,"timed_out":2,"nak_exhausted":2,"resolved":10,"ack_rate":0.8,"timeout_rate":0},
				 "priorities":[{"priority":"normal","window":{"sent":10,"acked":8,"timed_out":2,"nak_exhausted":2,"delivery_timeouts":1,"late_acks":3,"resolved":10,"ack_rate":0.8,"timeout_rate":0}}]},
				{"agent":"idle_1","window":{},"total":{"sent":9,"acked":9},"priorities":[]}]}`))
		case "/api/v1/alerts":
			w.Write([]byte(`{"alerts":[{"agent":"planner_1","kind":"timeout_rate","severity":"warning","value":0.07,"threshold":0.05,"samples":100}]}`))
		case "/api/v1/unknown_receivers":
			w.Write([]byte(`{"unknown_receivers":[{"receiver":"ghost_1","messages":12,"last_sender":"orch_1"},
				{"receiver":"ghost_2","messages":3},{"receiver":"ghost_3","messages":1},{"receiver":"ghost_4","messages":1},
				{"receiver":"ghost_5","messages":1},{"receiver":"ghost_6","messages":1},{"receiver":"ghost_7","messages":1}]}`))
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

func TestStats_Table(t *testing.T) {
	t.Setenv("NATS_URL", "")
	srv := statsMonitor(t)
	hostPort := strings.TrimPrefix(srv.URL, "http://")
	code, out, errOut := cli(t, "stats", "--monitor", hostPort)
	if code != exitOK {
		t.Fatalf("--monitor host:port: exit %d\n%s\n%s", code, out, errOut)
	}
	for _, want := range []string{"pending", "93.0%", "7.0%", "value=7.0% threshold=5.0%", "1 agents without traffic"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "idle_1") || strings.Contains(out, " low ") {
		t.Errorf("an agent or priority without traffic is listed:\n%s", out)
	}
	var executor string
	for line := range strings.SplitSeq(out, "\n") {
		if strings.Contains(line, "executor_1") && strings.Contains(line, " all ") {
			executor = line
		}
	}
	if f := strings.Fields(executor); len(f) != 13 || f[3] != "4" || f[10] != "–" || f[11] != "–" || strings.Contains(executor, "0.0") {
		t.Errorf("executor_1 with nothing resolved: %q; want pending 4 and – for its rates", executor)
	}
}

// Messages exhausted by NAKs get a column (timed out, but no timeout),
// and the receivers without a consumer a line naming the first few.
func TestStats_NakExhaustedAndUnknownReceivers(t *testing.T) {
	t.Setenv("NATS_URL", "")
	srv := statsMonitor(t)
	code, out, errOut := cli(t, "stats", "--monitor", srv.URL)
	if code != exitOK {
		t.Fatalf("exit %d\n%s\n%s", code, out, errOut)
	}
	if !strings.Contains(out, "nak exhausted") {
		t.Errorf("no nak exhausted column:\n%s", out)
	}
	var worker string
	for line := range strings.SplitSeq(out, "\n") {
		if strings.Contains(line, "worker_1") && strings.Contains(line, " all ") {
			worker = line
		}
	}
	if f := strings.Fields(worker); len(f) != 13 || f[6] != "2" || f[7] != "2" || f[10] != "80.0%" || f[11] != "0.0%" {
		t.Errorf("worker_1 = %q; want 2 timed out, 2 of them NAK-exhausted, timeout rate 0.0%%", worker)
	}
	// Redeliveries after a timeout and those of handled messages whose
	// ack was lost or late, apart.
	lateAcks := false
	for line := range strings.SplitSeq(out, "\n") {
		if f := strings.Fields(line); len(f) == 13 && f[0] == "worker_1" && f[1] == "normal" {
			lateAcks = f[8] == "1" && f[9] == "3"
		}
	}
	if !lateAcks || !strings.Contains(out, "late acks") {
		t.Errorf("no worker_1 normal line with 1 delivery timeout and 3 late acks:\n%s", out)
	}
	want := "messages to 7 receivers without a consumer: ghost_1 (12), ghost_2 (3), ghost_3 (1), ghost_4 (1), ghost_5 (1), and 2 more"
	if !strings.Contains(out, want) {
		t.Errorf("output lacks %q:\n%s", want, out)
	}
	code, out, errOut = cli(t, "stats", "--monitor", srv.URL, "--json")
	if code != exitOK || !strings.Contains(out, `"nak_exhausted": 2`) || !strings.Contains(out, `"receiver": "ghost_7"`) ||
		!strings.Contains(out, `"last_sender": "orch_1"`) {
		t.Errorf("--json: exit %d\n%s\n%s", code, out, errOut)
	}
}

func TestStats_MonitorAddress(t *testing.T) {
	t.Setenv("NATS_URL", "")
	notMonitor := httptest.NewServer(http.NotFoundHandler())
	defer notMonitor.Close()
	for _, tt := range []struct {
		monitor  string
		code     int
		want     string
		unwanted string
	}{
		{"ftp://127.0.0.1:1", exitUsage, "want host:port", "unreachable"},
		{"127.0.0.1:1", exitFailure, "http://127.0.0.1:1 unreachable", ""},
		{notMonitor.URL, exitFailure, "404", "unreachable"},
	} {
		code, _, errOut := cli(t, "stats", "--monitor", tt.monitor)
		if code != tt.code || !strings.Contains(errOut, tt.want) || tt.unwanted != "" && strings.Contains(errOut, tt.unwanted) {
			t.Errorf("--monitor %s: exit %d, stderr %q; want exit %d and %q", tt.monitor, code, errOut, tt.code, tt.want)
		}
	}
}
