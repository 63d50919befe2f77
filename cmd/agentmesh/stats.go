package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
)

// The parts of the ack monitor's /api/v1 answers stats prints
// (ackmonitor/http.go: Summary, AgentView, RateView; store.Alert).
type rateView struct {
	Sent        int64   `json:"sent"`
	Acked       int64   `json:"acked"`
	Nacked      int64   `json:"nacked"`
	TimedOut    int64   `json:"timed_out"`
	Resolved    int64   `json:"resolved"`
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
	LagSeconds    float64  `json:"lag_seconds"`
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
	Alerts []map[string]any `json:"alerts"`
}

func (a *app) statsCmd() *cobra.Command {
	var monitorURL string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "stats",
		Short: "Show ack rates and alerts from the ack monitor's HTTP API",
		Long: `stats asks a running ack monitor (--monitor, default monitor.url from the
configuration) for the mesh-wide ack, NACK and timeout rates over its sliding
window (/api/v1/summary), the per-agent and per-priority rates
(/api/v1/agents) and the active alerts (/api/v1/alerts). Default thresholds:
ack rate below 95% warning, below 90% critical; timeout rate above 5% warning,
above 10% critical.` + exitCodesHelp,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if monitorURL == "" {
				monitorURL = a.cfg.Monitor.URL
			}
			return a.runStats(cmd.Context(), strings.TrimRight(monitorURL, "/"), asJSON)
		},
	}
	cmd.Flags().StringVar(&monitorURL, "monitor", "", "ack monitor base URL (default: monitor.url, http://127.0.0.1:8222)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the monitor's answers as JSON")
	return cmd
}

func getJSON(ctx context.Context, url string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s: %s", url, resp.Status, strings.TrimSpace(string(body)))
	}
	return json.Unmarshal(body, v)
}

func (a *app) runStats(ctx context.Context, base string, asJSON bool) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var sum summaryView
	if err := getJSON(ctx, base+"/api/v1/summary", &sum); err != nil {
		return fmt.Errorf("ack monitor at %s unreachable: %w", base, err)
	}
	var agents agentsView
	if err := getJSON(ctx, base+"/api/v1/agents", &agents); err != nil {
		return err
	}
	var alerts alertsView
	if err := getJSON(ctx, base+"/api/v1/alerts", &alerts); err != nil {
		return err
	}
	if asJSON {
		enc := json.NewEncoder(a.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(map[string]any{"summary": sum, "agents": agents.Agents, "alerts": alerts.Alerts})
	}
	w := a.stdout
	fmt.Fprintf(w, "monitor %s (active=%v, lag %.1fs), window %v\n", sum.Monitor, sum.Active, sum.LagSeconds, time.Duration(sum.WindowSeconds*float64(time.Second)))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "agent\tpriority\tsent\tacked\tnacked\ttimed out\tack %\ttimeout %\tavg ack ms\t")
	row := func(agent, prio string, r rateView) {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%.1f\t%.1f\t%.1f\t\n", agent, prio, r.Sent, r.Acked, r.Nacked, r.TimedOut, r.AckRate*100, r.TimeoutRate*100, r.AvgAckMS)
	}
	row("(mesh)", "all", sum.Window)
	for _, ag := range agents.Agents {
		row(ag.Agent, "all", ag.Window)
		for _, p := range ag.Priorities {
			row(ag.Agent, p.Priority, p.Window)
		}
	}
	tw.Flush()
	if len(alerts.Alerts) == 0 {
		fmt.Fprintln(w, "no active alerts")
		return nil
	}
	fmt.Fprintf(w, "%d active alerts:\n", len(alerts.Alerts))
	for _, al := range alerts.Alerts {
		fmt.Fprintf(w, "  %-8v %-12v agent=%v value=%v threshold=%v samples=%v since %v\n",
			al["severity"], al["kind"], al["agent"], al["value"], al["threshold"], al["samples"], al["raised_at"])
	}
	return nil
}
