package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/agentmesh-io/agentmesh/config"
)

// The parts of the ack monitor's /api/v1 answers stats prints
// (ackmonitor/http.go: Summary, AgentView, RateView; store.Alert;
// ackmonitor.UnknownReceiver).
type rateView struct {
	Sent     int64 `json:"sent"`
	Acked    int64 `json:"acked"`
	Nacked   int64 `json:"nacked"`
	TimedOut int64 `json:"timed_out"`
	// NakExhausted counts the TimedOut messages NAKed on every delivery:
	// the timeout rate leaves them out.
	NakExhausted int64 `json:"nak_exhausted"`
	// Timeouts counts the redeliveries after an ack timeout, LateAcks
	// those of messages already handled whose ack was lost or late.
	Timeouts    int64   `json:"delivery_timeouts"`
	LateAcks    int64   `json:"late_acks"`
	Resolved    int64   `json:"resolved"`
	Pending     int64   `json:"pending"`
	AckRate     float64 `json:"ack_rate"`
	NackRate    float64 `json:"nack_rate"`
	TimeoutRate float64 `json:"timeout_rate"`
	AvgAckMS    float64 `json:"avg_ack_time_ms"`
}

type summaryView struct {
	Monitor       string   `json:"monitor"`
	Active        bool     `json:"active"`
	WindowSeconds float64  `json:"window_seconds"`
	Window        rateView `json:"window"`
	Total         rateView `json:"total"`
	ActiveAlerts  int      `json:"active_alerts"`
	Unavailable   int      `json:"unavailable_agents"`
	// UnknownReceivers is how many receivers without a consumer the
	// monitor saw direct messages sent to.
	UnknownReceivers int     `json:"unknown_receivers"`
	LagSeconds       float64 `json:"lag_seconds"`
	// EvaluatedAt is when the last alert evaluation read the rates.
	EvaluatedAt time.Time `json:"evaluated_at"`
}

type agentsView struct {
	Agents []struct {
		Agent      string   `json:"agent"`
		Window     rateView `json:"window"`
		Total      rateView `json:"total"`
		Priorities []struct {
			Priority string   `json:"priority"`
			Window   rateView `json:"window"`
		} `json:"priorities"`
		UnavailableWhy string `json:"unavailable_reason"`
	} `json:"agents"`
}

type alertsView struct {
	Alerts []json.RawMessage `json:"alerts"`
}

type unknownView struct {
	Receivers []json.RawMessage `json:"unknown_receivers"`
}

// unknownReceiverView is what stats prints of an unknown receiver.
type unknownReceiverView struct {
	Receiver string `json:"receiver"`
	Messages int64  `json:"messages"` // since the monitor started
}

// maxUnknownShown is how many unknown receivers stats names; the API
// lists them all.
const maxUnknownShown = 5

// alertView is what stats prints of an alert; value and threshold are
// fractions of one.
type alertView struct {
	Agent     string    `json:"agent"`
	Kind      string    `json:"kind"`
	Severity  string    `json:"severity"`
	Value     float64   `json:"value"`
	Threshold float64   `json:"threshold"`
	Samples   int64     `json:"samples"`
	RaisedAt  time.Time `json:"raised_at"`
}

// resolved is the number of messages with a final outcome, which the
// rates divide by.
func (r rateView) resolved() int64 { return max(r.Resolved, r.Acked+r.Nacked+r.TimedOut) }

// idle reports whether r saw no traffic: nothing sent, pending or resolved.
func (r rateView) idle() bool { return r.Sent == 0 && r.Pending == 0 && r.resolved() == 0 }

// pct formats the fraction f of r's resolved messages as a percentage, or
// "–" when nothing is resolved, so no rate is made up from zero samples.
func (r rateView) pct(f float64) string {
	if r.resolved() == 0 {
		return "–"
	}
	return fmt.Sprintf("%.1f%%", f*100)
}

// errUnreachable marks a monitor that did not answer at all, as opposed
// to one that answered something other than the ack monitor's API.
var errUnreachable = errors.New("unreachable")

// monitorBase returns the base URL of --monitor or monitor.url: host:port
// is taken as http://host:port; anything but an http(s) URL with a host
// is a usage error.
func monitorBase(given string) (string, error) {
	s := strings.TrimSpace(given)
	if !strings.Contains(s, "://") {
		s = "http://" + s
	}
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", usageErr(fmt.Errorf("--monitor %q: want host:port or an http(s):// URL of the ack monitor", given))
	}
	return strings.TrimRight(s, "/"), nil
}

func (a *app) statsCmd() *cobra.Command {
	var monitorURL string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "stats",
		Short: "Show ack rates and alerts from the ack monitor's HTTP API",
		Long: `stats asks a running ack monitor (--monitor, default monitor.url from the
configuration, else the dashboard of an agentmesh up running on
dev.data_dir) for the mesh-wide ack, NACK and timeout rates over its sliding
window (/api/v1/summary), the per-agent and per-priority rates
(/api/v1/agents), the active alerts (/api/v1/alerts) and the receivers
without a consumer that direct messages were sent to
(/api/v1/unknown_receivers). A message NAKed on every delivery until
exhausted counts in "timed out" and in "nak exhausted" beside it, but not in
the timeout rate: nothing timed out. Default thresholds:
ack rate below 95% warning, below 90% critical; timeout rate above 5% warning,
above 10% critical.` + exitCodesHelp,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if monitorURL == "" {
				monitorURL = a.defaultMonitorURL()
			}
			base, err := monitorBase(monitorURL)
			if err != nil {
				return err
			}
			return a.runStats(cmd.Context(), base, asJSON)
		},
	}
	cmd.Flags().StringVar(&monitorURL, "monitor", "", "ack monitor address, host:port or base URL (default: monitor.url, the one agentmesh up serves, http://127.0.0.1:8281)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the monitor's answers as JSON")
	return cmd
}

// defaultMonitorURL is monitor.url when set, else the dashboard of an up
// running on the dev data directory, else the default monitor.url.
func (a *app) defaultMonitorURL() string {
	if a.cfg.Monitor.URL != config.Default().Monitor.URL {
		return a.cfg.Monitor.URL
	}
	if dir, err := devDataDir(a.cfg.Dev.DataDir); err == nil {
		if u := runningMonitorURL(dir); u != "" {
			return u
		}
	}
	return a.cfg.Monitor.URL
}

func getJSON(ctx context.Context, url string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("%w: %w", errUnreachable, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s: %s", url, resp.Status, strings.TrimSpace(string(body)))
	}
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("%s: not an ack monitor's answer: %w", url, err)
	}
	return nil
}

func (a *app) runStats(ctx context.Context, base string, asJSON bool) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var sum summaryView
	if err := getJSON(ctx, base+"/api/v1/summary", &sum); err != nil {
		if errors.Is(err, errUnreachable) {
			return fmt.Errorf("ack monitor at %s %w (is it running? `agentmesh up` starts one; --monitor names another)", base, err)
		}
		return fmt.Errorf("ack monitor at %s: %w", base, err)
	}
	var agents agentsView
	if err := getJSON(ctx, base+"/api/v1/agents", &agents); err != nil {
		return err
	}
	var alerts alertsView
	if err := getJSON(ctx, base+"/api/v1/alerts", &alerts); err != nil {
		return err
	}
	// Asked only when the summary counts some, so a monitor without the
	// endpoint still answers stats.
	unknown := unknownView{Receivers: []json.RawMessage{}}
	if sum.UnknownReceivers > 0 {
		if err := getJSON(ctx, base+"/api/v1/unknown_receivers", &unknown); err != nil {
			return err
		}
	}
	if asJSON {
		enc := json.NewEncoder(a.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(map[string]any{"summary": sum, "agents": agents.Agents, "alerts": alerts.Alerts,
			"unknown_receivers": unknown.Receivers})
	}
	w := a.stdout
	fmt.Fprintf(w, "monitor %s (active=%v, lag %.1fs), window %v\n", sum.Monitor, sum.Active, sum.LagSeconds, time.Duration(sum.WindowSeconds*float64(time.Second)))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "agent\tpriority\tsent\tpending\tacked\tnacked\ttimed out\tnak exhausted\tdelivery timeouts\tlate acks\tack rate\ttimeout rate\tavg ack ms\t")
	row := func(agent, prio string, r rateView) {
		avg := "–"
		if r.Acked > 0 {
			avg = fmt.Sprintf("%.1f", r.AvgAckMS)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t%s\t%s\t\n", agent, prio, r.Sent, r.Pending, r.Acked, r.Nacked, r.TimedOut,
			r.NakExhausted, r.Timeouts, r.LateAcks, r.pct(r.AckRate), r.pct(r.TimeoutRate), avg)
	}
	row("(mesh)", "all", sum.Window)
	idle := 0
	for _, ag := range agents.Agents {
		if ag.Window.idle() {
			idle++
			continue
		}
		row(ag.Agent, "all", ag.Window)
		for _, p := range ag.Priorities {
			if !p.Window.idle() {
				row(ag.Agent, p.Priority, p.Window)
			}
		}
	}
	tw.Flush()
	if idle > 0 {
		fmt.Fprintf(w, "(%d agents without traffic in the window not shown)\n", idle)
	}
	if n := len(unknown.Receivers); n > 0 {
		var names []string
		for _, raw := range unknown.Receivers[:min(n, maxUnknownShown)] {
			var u unknownReceiverView
			if err := json.Unmarshal(raw, &u); err != nil {
				return fmt.Errorf("ack monitor at %s: unknown receiver: %w", base, err)
			}
			names = append(names, fmt.Sprintf("%s (%d)", u.Receiver, u.Messages))
		}
		if n > maxUnknownShown {
			names = append(names, fmt.Sprintf("and %d more", n-maxUnknownShown))
		}
		fmt.Fprintf(w, "messages to %d receivers without a consumer: %s\n", n, strings.Join(names, ", "))
	}
	if len(alerts.Alerts) == 0 {
		fmt.Fprintln(w, "no active alerts")
		return nil
	}
	fmt.Fprintf(w, "%d active alerts:\n", len(alerts.Alerts))
	for _, raw := range alerts.Alerts {
		var al alertView
		if err := json.Unmarshal(raw, &al); err != nil {
			return fmt.Errorf("ack monitor at %s: alert: %w", base, err)
		}
		since := ""
		if !al.RaisedAt.IsZero() {
			since = " since " + al.RaisedAt.Local().Format(time.DateTime)
		}
		fmt.Fprintf(w, "  %-8s %-12s agent=%s value=%.1f%% threshold=%.1f%% samples=%d%s\n",
			al.Severity, al.Kind, al.Agent, al.Value*100, al.Threshold*100, al.Samples, since)
	}
	return nil
}
