package ackmonitor_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/agentmesh-io/agentmesh/ackmonitor"
	"github.com/agentmesh-io/agentmesh/ackmonitor/store"
	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/internal/natstest"
)

// chromiumPath returns the headless browser, failing under CI=true and
// skipping otherwise when it is missing.
func chromiumPath(t *testing.T) string {
	t.Helper()
	for _, p := range []string{os.Getenv("AGENTMESH_CHROMIUM"), "/usr/bin/chromium", "/usr/bin/chromium-browser"} {
		if p == "" {
			continue
		}
		if _, err := exec.LookPath(p); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("chromium not found and CI=true: the dashboard must be checked in a real browser (apt-get install chromium)")
	}
	t.Skip("chromium not found (apt-get install chromium): skipping the browser test of the dashboard")
	return ""
}

func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", url, res.Status)
	}
	if err := json.NewDecoder(res.Body).Decode(v); err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
}

// The dashboard, loaded in headless Chromium, shows the API's numbers.
func TestDashboard_InBrowser(t *testing.T) {
	t.Parallel()
	exe := chromiumPath(t)
	m := newMesh(t)
	st := openStore(t, sqliteStore)
	ctx := testCtx(t)
	m.agent("director", map[string]agentkit.HandlerFunc{ackmonitor.ActionEscalation: func(context.Context, *agentkit.Message) error { return nil }})
	m.agent("worker", map[string]agentkit.HandlerFunc{
		"ok": func(context.Context, *agentkit.Message) error { return nil },
		"reject": func(context.Context, *agentkit.Message) error {
			return agentkit.Reject(wire.CodeRejected, "bad order")
		},
		"never": func(context.Context, *agentkit.Message) error { return agentkit.Busy(10 * time.Millisecond) },
	}, agentkit.WithPolicy(wire.PriorityNormal, agentkit.DeliveryPolicy{BackOff: []time.Duration{5 * time.Second},
		MaxDeliver: 2, ProcessingLimit: 5 * time.Second, Prefetch: 16, MaxAckPending: 100}))
	m.agent("planner", map[string]agentkit.HandlerFunc{
		"plan": func(context.Context, *agentkit.Message) error { return nil },
	})
	client := m.agent("client", nil)
	cfg := fastConfig(st)
	cfg.Thresholds.MinSamples = 5   // so the small test traffic shows alerts
	cfg.PinnedTTL = 5 * time.Second // a long lease: /healthz and /metrics must report this instance active
	mon := startMonitor(t, m.s, cfg)
	for i := range 12 {
		action := "ok"
		if i%4 == 3 {
			action = "reject"
		}
		if _, err := client.Send(ctx, "worker", action, nil); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := client.Send(ctx, "worker", "never", nil); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		if _, err := client.Send(ctx, "planner", "plan", nil, agentkit.WithPriority(wire.PriorityHigh)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := client.Send(ctx, "ghost", "plan", nil, agentkit.WithPriority(wire.PriorityLow)); err != nil { // no such agent
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "traffic in the ledger", func() bool {
		w, p := rateOf(t, st, "worker", "normal"), rateOf(t, st, "planner", "high")
		return w.Sent == 13 && w.Resolved() == 13 && p.Sent == 5 && p.Acked == 5
	})
	// The page and the API are compared below, so the ledger must be still:
	// that includes the escalation's send and the director's ack of it,
	// which reach the ledger by different intakes, in either order.
	eventually(t, 20*time.Second, "dead letters and the escalation, sent and acked by the director", func() bool {
		rows, err := st.PendingFollowUps(ctx, store.Key{}, 10)
		esc, err2 := st.Messages(ctx, store.Query{Escalated: true})
		d := rateOf(t, st, "director", "high")
		return err == nil && len(rows) == 0 && err2 == nil && len(esc) == 1 && d.Sent == 1 && d.Acked == 1
	})
	eventually(t, 20*time.Second, "alerts", func() bool {
		as, err := st.Alerts(ctx, true, 10)
		return err == nil && len(as) == 2
	})
	srv := httptest.NewServer(mon.Handler())
	t.Cleanup(srv.Close)

	// /healthz, /metrics and the time series agree with the ledger.
	var health map[string]any
	getJSON(t, srv.URL+"/healthz", &health)
	if health["status"] != "ok" || health["active"] != true {
		t.Errorf("healthz = %v", health)
	}
	res, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	for _, want := range []string{
		`ackmonitor_outcomes_total{agent="worker",priority="normal",status="ACK"} 9`,
		`ackmonitor_outcomes_total{agent="worker",priority="normal",status="NACK"} 3`,
		`ackmonitor_messages_sent_total{priority="normal",sender="client"} 13`,
		`ackmonitor_outcomes_total{agent="worker",priority="normal",status="TIMEOUT"} 1`,
		`ackmonitor_dead_letters_total{agent="worker",priority="normal"} 4`,
		`ackmonitor_escalations_total{agent="worker",priority="normal"} 1`,
		`ackmonitor_alert_active{agent="worker",kind="ack_rate",severity="critical"} 1`,
		`ackmonitor_ack_time_seconds_count{agent="planner",priority="high"} 5`,
		`ackmonitor_active 1`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	var series struct {
		Points []struct {
			Acked, Nacked int64
		} `json:"points"`
	}
	getJSON(t, srv.URL+"/api/v1/timeseries?range=10m&step=10s", &series)
	var sAcked, sNacked int64
	for _, p := range series.Points {
		sAcked, sNacked = sAcked+p.Acked, sNacked+p.Nacked
	}
	if sAcked < 14 || sNacked != 3 { // 9 worker + 5 planner ACKs (+ the director's), 3 worker NACKs
		t.Errorf("time series acked %d nacked %d", sAcked, sNacked)
	}

	var agents struct {
		Agents []ackmonitor.AgentView `json:"agents"`
	}
	getJSON(t, srv.URL+"/api/v1/agents", &agents)
	var summary ackmonitor.Summary
	getJSON(t, srv.URL+"/api/v1/summary", &summary)
	if summary.EvaluatedAt.IsZero() || summary.EvaluatedAt.After(summary.GeneratedAt) {
		t.Errorf("summary evaluated_at %v (generated %v): alerts were raised, so an evaluation completed", summary.EvaluatedAt, summary.GeneratedAt)
	}
	var dlq struct {
		DeadLetters []json.RawMessage `json:"dead_letters"`
	}
	getJSON(t, srv.URL+"/api/v1/dlq", &dlq)
	if len(dlq.DeadLetters) != 4 {
		t.Fatalf("API dead letters = %d, want 4", len(dlq.DeadLetters))
	}
	var letters struct {
		Letters []ackmonitor.LetterView `json:"letters"`
	}
	getJSON(t, srv.URL+"/api/v1/dlq/letters", &letters)
	if len(letters.Letters) != 4 {
		t.Fatalf("API letters in the stream = %d, want 4", len(letters.Letters))
	}
	for _, l := range letters.Letters {
		if l.Seq == 0 || l.Receiver == "" || l.MessageID == "" || l.Status == "" || l.Reason == "" {
			t.Fatalf("letter view lacks fields: %+v", l)
		}
	}

	opts := append(chromedp.DefaultExecAllocatorOptions[:0:0],
		chromedp.ExecPath(exe), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.NoFirstRun, chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-dev-shm-usage", true), chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1400, 1000))
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancelA)
	bctx, cancelB := chromedp.NewContext(actx)
	t.Cleanup(cancelB)
	bctx, cancelT := context.WithTimeout(bctx, 60*time.Second)
	t.Cleanup(cancelT)

	row := func(agent, prio string) string {
		return `#agents tr[data-agent="` + agent + `"][data-priority="` + prio + `"]`
	}
	if err := chromedp.Run(bctx,
		chromedp.Navigate(srv.URL+"/"),
		chromedp.WaitVisible(`body[data-ready="1"]`, chromedp.ByQuery),
		chromedp.WaitVisible(row("worker", "normal"), chromedp.ByQuery),
		chromedp.WaitVisible(row("planner", "high"), chromedp.ByQuery),
		chromedp.WaitVisible(`#dlq tr[data-dlq-seq]`, chromedp.ByQuery),
		chromedp.WaitVisible(`#alerts li[data-agent="worker"][data-kind="ack_rate"][data-severity="critical"]`, chromedp.ByQuery),
		// The worker's one message exhausted by NAKs is no timeout; the
		// mesh-wide ack rate (15 of 19) is critical.
		chromedp.WaitVisible(`#alerts li[data-agent="_mesh"][data-kind="ack_rate"][data-severity="critical"]`, chromedp.ByQuery),
		chromedp.WaitVisible(`#escalations li[data-escalation]`, chromedp.ByQuery),
		chromedp.WaitVisible(`#unknown li[data-receiver="ghost"]`, chromedp.ByQuery),
	); err != nil {
		t.Fatalf("load dashboard: %v", err)
	}
	attr := func(sel, name string) string {
		var v string
		var ok bool
		if err := chromedp.Run(bctx, chromedp.AttributeValue(sel, name, &v, &ok, chromedp.ByQuery)); err != nil || !ok {
			t.Fatalf("attribute %s of %s: %v (present %v)", name, sel, err, ok)
		}
		return v
	}
	num := func(sel string) float64 {
		f, err := strconv.ParseFloat(attr(sel, "data-value"), 64)
		if err != nil {
			t.Fatalf("%s: %v", sel, err)
		}
		return f
	}
	for _, a := range agents.Agents {
		for _, p := range a.Priorities {
			w := p.Window
			sel := row(a.Agent, p.Priority)
			for field, want := range map[string]float64{"sent": float64(w.Sent), "acked": float64(w.Acked), "nacked": float64(w.Nacked),
				"timed_out": float64(w.TimedOut), "ack_rate": w.AckRate, "timeout_rate": w.TimeoutRate,
				"delivery_timeouts": float64(w.Timeouts), "late_acks": float64(w.LateAcks)} {
				if got := num(sel + ` td[data-field="` + field + `"]`); got != want {
					t.Errorf("%s/%s %s: page %v, API %v", a.Agent, p.Priority, field, got, want)
				}
			}
		}
	}
	worker := row("worker", "normal")
	if got := num(worker + ` td[data-field="acked"]`); got != 9 {
		t.Errorf("worker acked on the page = %v, want 9", got)
	}
	if got := num(worker + ` td[data-field="ack_rate"]`); got != 9.0/13 {
		t.Errorf("worker ack rate on the page = %v, want 9/13", got)
	}
	if got := num(worker + ` td[data-field="timed_out"]`); got != 1 {
		t.Errorf("worker timeouts on the page = %v, want 1", got)
	}
	if got, want := num(`#summary [data-field="ack_rate"]`), summary.Window.AckRate; got != want {
		t.Errorf("summary ack rate: page %v, API %v", got, want)
	}
	if got := num(`#summary [data-field="resolved"]`); got != float64(summary.Window.Resolved) {
		t.Errorf("summary resolved: page %v, API %v", got, summary.Window.Resolved)
	}
	// The headline cards take the alert thresholds' colours: the window's
	// ack rate (15 of 19) is critical, nothing timed out.
	for card, want := range map[string]string{"ack_rate": "bad", "timeout_rate": "good", "unknown_receivers": "warn"} {
		if got := attr(`#summary [data-card="`+card+`"]`, "data-state"); got != want {
			t.Errorf("card %s coloured %q, want %q", card, got, want)
		}
	}
	var text string
	if err := chromedp.Run(bctx, chromedp.Evaluate(`document.querySelector("#chart-y-unit").textContent`, &text)); err != nil || text != "messages per 30 s" {
		t.Errorf("chart axis unit %q (%v), want messages per 30 s", text, err)
	}
	// The page refreshes its table in place: read the cell once rendered.
	natstest.WaitFor(t, 20*time.Second, func() error {
		if err := chromedp.Run(bctx, chromedp.Evaluate(`(document.querySelector('`+worker+` td[data-field="ack_rate"]`+`') || {}).textContent || ""`, &text)); err != nil {
			return err
		}
		if text == "" {
			return errors.New("worker's ack rate cell not rendered")
		}
		return nil
	})
	if text != "69.2%" {
		t.Errorf("worker ack rate shown as %q, want 69.2%%", text)
	}
	var bars int
	if err := chromedp.Run(bctx, chromedp.Evaluate(`document.querySelectorAll("#chart-svg rect").length`, &bars)); err != nil {
		t.Fatal(err)
	}
	if bars == 0 {
		t.Error("the chart draws no bars")
	}

	// Live: new traffic shows up without a reload.
	for range 4 {
		if _, err := client.Send(ctx, "worker", "ok", nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := chromedp.Run(bctx, chromedp.WaitVisible(worker+` td[data-field="acked"][data-value="13"]`, chromedp.ByQuery)); err != nil {
		t.Fatalf("dashboard did not update: %v", err)
	}

	var png []byte
	if err := chromedp.Run(bctx, chromedp.FullScreenshot(&png, 100)); err != nil {
		t.Fatal(err)
	}
	dir := os.Getenv("AGENTMESH_SCREENSHOT_DIR")
	if dir == "" {
		dir = t.TempDir()
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "ackmonitor-dashboard.png")
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(png), "\x89PNG") {
		t.Errorf("screenshot is not a PNG (%d bytes)", len(png))
	}
	t.Logf("dashboard screenshot: %s (%d bytes)", path, len(png))
}
