package ackmonitor

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"time"

	"github.com/agentmesh-io/agentmesh/ackmonitor/store"
)

// Alert kinds.
const (
	AlertAckRate     = "ack_rate"     // a receiver's ack rate below the thresholds
	AlertTimeoutRate = "timeout_rate" // a receiver's timeout rate above the thresholds
	// AlertInvalidRate: a sender's invalid rate (its messages terminated
	// as invalid input) above the thresholds; the alert's agent is the
	// sender.
	AlertInvalidRate = "invalid_rate"
)

// MeshAgent is the agent of the mesh-wide alerts: the ack and timeout
// rates over the messages to every agent ([AlertAckRate],
// [AlertTimeoutRate]), at the same thresholds but with their own minimum
// of samples (Thresholds.MeshMinSamples), so a failing workflow whose
// messages are spread over agents with too few samples each still raises
// an alert. Agent ids may start with "_", but no agent should be called
// this.
const MeshAgent = "_mesh"

// Alert states in [AlertEvent].
const (
	AlertRaised   = "raised"
	AlertResolved = "resolved"
)

// AlertEvent is the JSON published (core NATS) on
// mesh.alert.<severity>.<agent> when an alert is raised, changes severity
// or is resolved; resolutions are published with severity "info".
type AlertEvent struct {
	store.Alert
	State         string  `json:"state"`
	WindowSeconds float64 `json:"window_seconds"`
	Monitor       string  `json:"monitor"`
	// Previous is the severity before a change ("" for a new alert).
	Previous string `json:"previous_severity,omitempty"`
}

// severityOf returns the severity rates call for, or "".
func (t Thresholds) severityOf(kind string, r store.Rate) (sev string, value, threshold float64) {
	switch kind {
	case AlertAckRate:
		v := r.AckRate()
		switch {
		case v < t.AckCritical:
			return "critical", v, t.AckCritical
		case v < t.AckWarning:
			return "warning", v, t.AckWarning
		}
		return "", v, t.AckWarning
	default:
		return above(r.TimeoutRate(), t.TimeoutWarning, t.TimeoutCritical)
	}
}

// above returns the severity of a rate v with thresholds warning and
// critical, or "".
func above(v, warning, critical float64) (sev string, value, threshold float64) {
	switch {
	case v > critical:
		return "critical", v, critical
	case v > warning:
		return "warning", v, warning
	}
	return "", v, warning
}

func (m *Monitor) alertLoop(ctx context.Context) {
	everyTick(ctx, m.cfg.EvaluateInterval, func() {
		if !m.Active() {
			return
		}
		start := time.Now()
		if err := m.evaluate(ctx, start); err != nil {
			if ctx.Err() == nil {
				m.cfg.Logger.Warn("alert evaluation", "err", err)
			}
			return
		}
		m.evaluatedAt.Store(start.UnixNano())
	})
}

// check is one rate of an agent compared with its thresholds.
type check struct {
	agent, kind      string
	sev              string // "" below the thresholds
	value, threshold float64
	samples          int64
}

// checks compares the rates over the window with the thresholds: each
// receiver's ack and timeout rates, in agent order, then the mesh-wide
// ones (MeshAgent), then each sender's invalid rate, in sender order.
// Agents with fewer than MinSamples resolved messages (the mesh: fewer
// than MeshMinSamples) are left out. resolved tells, for an agent and
// kind, how many messages resolved in the window.
func (m *Monitor) checks(ctx context.Context, since time.Time) (out []check, resolved func(agent, kind string) int64, err error) {
	rates, err := m.cfg.Store.Rates(ctx, since)
	if err != nil {
		return nil, nil, err
	}
	senders, err := m.cfg.Store.SenderRates(ctx, since)
	if err != nil {
		return nil, nil, err
	}
	byAgent := map[string]store.Rate{}
	var mesh store.Rate
	for _, r := range rates {
		byAgent[r.Agent] = byAgent[r.Agent].Merge(r)
		mesh = mesh.Merge(r)
	}
	bySender := map[string]int64{}
	agents := make([]string, 0, len(byAgent))
	for a := range byAgent {
		agents = append(agents, a)
	}
	sort.Strings(agents)
	t := m.cfg.Thresholds
	rateChecks := func(agent string, r store.Rate, need int64) {
		if need <= 0 || r.Resolved() < need {
			return
		}
		for _, kind := range []string{AlertAckRate, AlertTimeoutRate} {
			sev, value, threshold := t.severityOf(kind, r)
			out = append(out, check{agent, kind, sev, value, threshold, r.Resolved()})
		}
	}
	for _, agent := range agents {
		rateChecks(agent, byAgent[agent], t.MinSamples)
	}
	rateChecks(MeshAgent, mesh, t.MeshMinSamples)
	for _, r := range senders { // in sender order
		bySender[r.Sender] = r.Resolved
		if r.Resolved < t.MinSamples {
			continue
		}
		sev, value, threshold := above(r.InvalidRate(), t.InvalidWarning, t.InvalidCritical)
		out = append(out, check{r.Sender, AlertInvalidRate, sev, value, threshold, r.Resolved})
	}
	resolved = func(agent, kind string) int64 {
		switch {
		case kind == AlertInvalidRate:
			return bySender[agent]
		case agent == MeshAgent:
			return mesh.Resolved()
		}
		return byAgent[agent].Resolved()
	}
	return out, resolved, nil
}

// pct formats a rate for the logs as a percentage with one decimal.
func pct(v float64) string { return strconv.FormatFloat(v*100, 'f', 1, 64) + "%" }

// evaluate compares the rates over the window with the thresholds
// (checks). The state machine per agent and kind is the set of active
// alerts in the store (so it survives restarts and failovers): no alert →
// raise when a threshold is crossed; an alert → change severity or resolve
// when the rates say so. Agents with fewer than MinSamples resolved
// messages in the window keep their state, so a few messages cannot
// resolve an alert, except when none is left: an alert whose agent has no
// resolved message in the window (it went quiet, or stopped) is resolved,
// as nothing in the window supports it any more. Afterwards the
// ackmonitor_alert_active gauge shows the active alerts as the evaluation
// left them (see reportAlerts).
func (m *Monitor) evaluate(ctx context.Context, now time.Time) error {
	checks, resolved, err := m.checks(ctx, now.Add(-m.cfg.Window))
	if err != nil {
		return err
	}
	active, err := m.cfg.Store.Alerts(ctx, true, 10000)
	if err != nil {
		return err
	}
	current := map[[2]string]store.Alert{}
	for _, a := range active {
		current[[2]string{a.Agent, a.Kind}] = a
	}
	// current follows the store's writes, so it is right even when one fails.
	defer func() { m.reportAlerts(current) }()
	resolve := func(key [2]string, cur store.Alert, value float64, samples int64, why string) error {
		cur.ResolvedAt, cur.Value, cur.Samples = now.UTC(), value, samples
		if err := m.cfg.Store.SaveAlert(ctx, cur); err != nil {
			return err
		}
		delete(current, key)
		m.publishAlert(AlertEvent{Alert: cur, State: AlertResolved}, "info")
		m.cfg.Logger.Info("alert resolved", "agent", cur.Agent, "kind", cur.Kind, "severity", cur.Severity,
			"value", pct(value), "samples", samples, "why", why)
		return nil
	}
	checked := map[[2]string]bool{}
	for _, c := range checks {
		key := [2]string{c.agent, c.kind}
		checked[key] = true
		cur, firing := current[key]
		switch {
		case !firing && c.sev == "":
		case firing && c.sev == cur.Severity:
			cur.Value, cur.Samples = c.value, c.samples
			if err := m.cfg.Store.SaveAlert(ctx, cur); err != nil {
				return err
			}
			current[key] = cur
		case firing && c.sev == "":
			if err := resolve(key, cur, c.value, c.samples, "below the thresholds"); err != nil {
				return err
			}
		default: // a new alert, or a severity change: the old one is resolved, a new one raised
			prev := ""
			if firing {
				prev = cur.Severity
				cur.ResolvedAt = now.UTC()
				if err := m.cfg.Store.SaveAlert(ctx, cur); err != nil {
					return err
				}
				delete(current, key)
			}
			a := store.Alert{ID: c.agent + "/" + c.kind + "/" + strconv.FormatInt(now.UnixMicro(), 10), Agent: c.agent,
				Kind: c.kind, Severity: c.sev, Value: c.value, Threshold: c.threshold, Samples: c.samples, RaisedAt: now.UTC()}
			if err := m.cfg.Store.SaveAlert(ctx, a); err != nil {
				return err
			}
			current[key] = a
			m.publishAlert(AlertEvent{Alert: a, State: AlertRaised, Previous: prev}, c.sev)
			m.cfg.Logger.Warn("alert raised", "agent", c.agent, "kind", c.kind, "severity", c.sev, "value", pct(c.value),
				"threshold", pct(c.threshold), "samples", c.samples)
		}
	}
	quiet := make([][2]string, 0, len(current))
	for key := range current {
		if !checked[key] && resolved(key[0], key[1]) == 0 {
			quiet = append(quiet, key)
		}
	}
	sort.Slice(quiet, func(i, j int) bool { return quiet[i][0]+"/"+quiet[i][1] < quiet[j][0]+"/"+quiet[j][1] })
	for _, key := range quiet {
		cur := current[key]
		if err := resolve(key, cur, cur.Value, 0, "no resolved message in the window"); err != nil {
			return err
		}
	}
	return nil
}

// reportAlerts makes the ackmonitor_alert_active gauge show exactly alerts
// (keyed by agent and kind) while this instance is active, and nothing
// otherwise: only the active instance reports alerts, so the sum over
// instances counts each once, and an instance that restarts, takes over or
// steps down never reports a stale set. The lock orders a step-down's
// reset after any evaluation that saw this instance active.
func (m *Monitor) reportAlerts(alerts map[[2]string]store.Alert) {
	m.metrics.alertsMu.Lock()
	defer m.metrics.alertsMu.Unlock()
	m.metrics.alerts.Reset()
	if !m.Active() {
		return
	}
	for _, a := range alerts {
		m.metrics.alerts.WithLabelValues(a.Agent, a.Kind, a.Severity).Set(1)
	}
}

// publishAlert publishes ev on the alert subject (core NATS, at most once).
func (m *Monitor) publishAlert(ev AlertEvent, severity string) {
	ev.WindowSeconds, ev.Monitor = m.cfg.Window.Seconds(), m.cfg.MonitorID
	subject, err := m.cfg.Scheme.Alert(severity, ev.Agent)
	if err != nil {
		m.cfg.Logger.Warn("alert subject", "err", err)
		return
	}
	data, err := json.Marshal(ev)
	if err != nil {
		m.cfg.Logger.Warn("alert encode", "err", err)
		return
	}
	if err := m.nc.Publish(subject, data); err != nil {
		m.cfg.Logger.Warn("alert publish", "subject", subject, "err", fmt.Errorf("ackmonitor: %w", err))
	}
}
