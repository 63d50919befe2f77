package ackmonitor

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/agentmesh-io/agentmesh/ackmonitor/store"
	"github.com/agentmesh-io/agentmesh/dlq"
	"github.com/agentmesh-io/agentmesh/subjects"
)

//go:embed web
var webFS embed.FS

// RateView is a [store.Rate] with its ratios.
type RateView struct {
	store.Rate
	Resolved    int64   `json:"resolved"`
	AckRate     float64 `json:"ack_rate"`
	NackRate    float64 `json:"nack_rate"`
	TimeoutRate float64 `json:"timeout_rate"`
}

func view(r store.Rate) RateView {
	return RateView{Rate: r, Resolved: r.Resolved(), AckRate: r.AckRate(), NackRate: r.NackRate(), TimeoutRate: r.TimeoutRate()}
}

// SenderRateView is a [store.SenderRate] with its ratio.
type SenderRateView struct {
	Resolved    int64   `json:"resolved"`
	Invalid     int64   `json:"invalid"`
	InvalidRate float64 `json:"invalid_rate"`
}

func senderView(r store.SenderRate) SenderRateView {
	return SenderRateView{Resolved: r.Resolved, Invalid: r.Invalid, InvalidRate: r.InvalidRate()}
}

// SenderView is one sender's messages terminated as invalid input, over
// the window and in total (GET /api/v1/senders): the sender is blamed for
// them, not their receivers.
type SenderView struct {
	Sender string         `json:"sender"`
	Window SenderRateView `json:"window"`
	Total  SenderRateView `json:"total"`
}

// Senders returns every sender's invalid rate over the window and in
// total, senders with invalid messages in the window first (highest rate
// first), then by name.
func (m *Monitor) Senders(ctx context.Context) ([]SenderView, error) {
	win, err := m.cfg.Store.SenderRates(ctx, time.Now().Add(-m.cfg.Window))
	if err != nil {
		return nil, err
	}
	all, err := m.cfg.Store.SenderRates(ctx, time.Time{})
	if err != nil {
		return nil, err
	}
	by := map[string]*SenderView{}
	for _, r := range all {
		by[r.Sender] = &SenderView{Sender: r.Sender, Total: senderView(r)}
	}
	for _, r := range win {
		v := by[r.Sender]
		if v == nil {
			v = &SenderView{Sender: r.Sender}
			by[r.Sender] = v
		}
		v.Window = senderView(r)
	}
	out := make([]SenderView, 0, len(by))
	for _, v := range by {
		out = append(out, *v)
	}
	sort.Slice(out, func(i, j int) bool {
		if a, b := out[i].Window.InvalidRate, out[j].Window.InvalidRate; a != b {
			return a > b
		}
		return out[i].Sender < out[j].Sender
	})
	return out, nil
}

// Summary is the mesh-wide view (GET /api/v1/summary).
type Summary struct {
	Monitor       string    `json:"monitor"`
	Active        bool      `json:"active"`
	WindowSeconds float64   `json:"window_seconds"`
	GeneratedAt   time.Time `json:"generated_at"`
	// EvaluatedAt is when the rates the last completed alert evaluation
	// judged were read (zero before the first): alerts reflect every
	// message the ledger held then.
	EvaluatedAt  time.Time `json:"evaluated_at,omitzero"`
	Window       RateView  `json:"window"` // over the sliding window
	Total        RateView  `json:"total"`  // everything in the ledger
	ActiveAlerts int       `json:"active_alerts"`
	Unavailable  int       `json:"unavailable_agents"`
	// UnknownReceivers is the number of receivers without a consumer
	// this instance saw direct messages sent to (GET
	// /api/v1/unknown_receivers lists them).
	UnknownReceivers int `json:"unknown_receivers"`
	// Thresholds are the alert thresholds, for the dashboard's colours.
	Thresholds      ThresholdsView `json:"thresholds"`
	EventsProcessed uint64         `json:"events_processed"`
	LagSeconds      float64        `json:"lag_seconds"`
}

// ThresholdsView is the ack and timeout rate thresholds of the alerts.
type ThresholdsView struct {
	AckWarning      float64 `json:"ack_warning"`
	AckCritical     float64 `json:"ack_critical"`
	TimeoutWarning  float64 `json:"timeout_warning"`
	TimeoutCritical float64 `json:"timeout_critical"`
}

// PriorityView is one agent's figures at one priority.
type PriorityView struct {
	Priority string   `json:"priority"`
	Window   RateView `json:"window"`
	Total    RateView `json:"total"`
}

// AgentView is one receiving agent's figures (GET /api/v1/agents).
type AgentView struct {
	Agent            string         `json:"agent"`
	UnavailableSince time.Time      `json:"unavailable_since,omitzero"`
	UnavailableWhy   string         `json:"unavailable_reason,omitempty"`
	Window           RateView       `json:"window"`
	Total            RateView       `json:"total"`
	Priorities       []PriorityView `json:"priorities"`
}

// Agents returns every receiving agent's rates over the window and in total.
func (m *Monitor) Agents(ctx context.Context) ([]AgentView, error) {
	win, err := m.cfg.Store.Rates(ctx, time.Now().Add(-m.cfg.Window))
	if err != nil {
		return nil, err
	}
	all, err := m.cfg.Store.Rates(ctx, time.Time{})
	if err != nil {
		return nil, err
	}
	health, err := m.cfg.Store.Health(ctx)
	if err != nil {
		return nil, err
	}
	type acc struct {
		win, total store.Rate
		prios      map[string]*PriorityView
	}
	by := map[string]*acc{}
	get := func(agent string) *acc {
		a := by[agent]
		if a == nil {
			a = &acc{prios: map[string]*PriorityView{}}
			by[agent] = a
		}
		return a
	}
	prio := func(a *acc, p string) *PriorityView {
		v := a.prios[p]
		if v == nil {
			v = &PriorityView{Priority: p}
			a.prios[p] = v
		}
		return v
	}
	for _, r := range all {
		a := get(r.Agent)
		a.total = a.total.Merge(r)
		prio(a, r.Priority).Total = view(r)
	}
	for _, r := range win {
		a := get(r.Agent)
		a.win = a.win.Merge(r)
		prio(a, r.Priority).Window = view(r)
	}
	out := make([]AgentView, 0, len(by))
	for name, a := range by {
		a.win.Agent, a.total.Agent = name, name
		v := AgentView{Agent: name, Window: view(a.win), Total: view(a.total)}
		for _, h := range health {
			if h.Agent == name {
				v.UnavailableSince, v.UnavailableWhy = h.UnavailableSince, h.Reason
			}
		}
		for _, p := range a.prios {
			p.Window.Agent, p.Window.Priority, p.Total.Agent, p.Total.Priority = name, p.Priority, name, p.Priority
			v.Priorities = append(v.Priorities, *p)
		}
		sort.Slice(v.Priorities, func(i, j int) bool { return prioRank(v.Priorities[i].Priority) < prioRank(v.Priorities[j].Priority) })
		out = append(out, v)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Agent < out[j].Agent })
	return out, nil
}

func prioRank(p string) int {
	for i, v := range []string{"critical", "high", "normal", "low", "batch"} {
		if v == p {
			return i
		}
	}
	return 9
}

// Summary returns the mesh-wide figures.
func (m *Monitor) Summary(ctx context.Context) (Summary, error) {
	agents, err := m.Agents(ctx)
	if err != nil {
		return Summary{}, err
	}
	alerts, err := m.cfg.Store.Alerts(ctx, true, 10000)
	if err != nil {
		return Summary{}, err
	}
	var win, total store.Rate
	s := Summary{Monitor: m.cfg.MonitorID, Active: m.Active(), WindowSeconds: m.cfg.Window.Seconds(),
		GeneratedAt: time.Now().UTC(), EvaluatedAt: unixNano(m.evaluatedAt.Load()), ActiveAlerts: len(alerts), EventsProcessed: m.intake.processed(),
		LagSeconds: m.intake.lag().Seconds(), UnknownReceivers: len(m.unknown.list()),
		Thresholds: ThresholdsView{AckWarning: m.cfg.Thresholds.AckWarning, AckCritical: m.cfg.Thresholds.AckCritical,
			TimeoutWarning: m.cfg.Thresholds.TimeoutWarning, TimeoutCritical: m.cfg.Thresholds.TimeoutCritical}}
	for _, a := range agents {
		win, total = win.Merge(a.Window.Rate), total.Merge(a.Total.Rate)
		if !a.UnavailableSince.IsZero() {
			s.Unavailable++
		}
	}
	s.Window, s.Total = view(win), view(total)
	return s, nil
}

// Handler serves the dashboard (/), the JSON API (/api/v1/...), Prometheus
// metrics (/metrics) and /healthz.
func (m *Monitor) Handler() http.Handler {
	mux := http.NewServeMux()
	static, _ := fs.Sub(webFS, "web")
	mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		http.ServeFileFS(w, r, static, "index.html")
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(m.metrics.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		ready := false
		select {
		case <-m.ready:
			ready = true
		default:
		}
		writeJSON(w, map[string]any{"status": "ok", "ready": ready, "active": m.Active(), "monitor": m.cfg.MonitorID})
	})
	api := func(path string, f func(*http.Request) (any, error)) {
		mux.HandleFunc("GET /api/v1/"+path, func(w http.ResponseWriter, r *http.Request) {
			v, err := f(r)
			var pe *paramError
			switch {
			case errors.As(err, &pe):
				writeJSONStatus(w, http.StatusBadRequest, map[string]string{"error": pe.Error(), "parameter": pe.name})
			case err != nil:
				// Store errors can carry SQL, hosts or user names: they
				// go to the log, not to the client.
				m.cfg.Logger.Error("api request failed", "path", r.URL.Path, "err", err)
				writeJSONStatus(w, http.StatusInternalServerError, map[string]string{"error": "internal error (see the monitor's log)"})
			default:
				writeJSONStatus(w, http.StatusOK, v)
			}
		})
	}
	api("summary", func(r *http.Request) (any, error) { return m.Summary(r.Context()) })
	api("agents", func(r *http.Request) (any, error) {
		a, err := m.Agents(r.Context())
		return map[string]any{"window_seconds": m.cfg.Window.Seconds(), "agents": a}, err
	})
	api("senders", func(r *http.Request) (any, error) {
		s, err := m.Senders(r.Context())
		return map[string]any{"window_seconds": m.cfg.Window.Seconds(), "senders": s}, err
	})
	api("unknown_receivers", func(*http.Request) (any, error) {
		return map[string]any{"unknown_receivers": m.unknown.list()}, nil
	})
	api("alerts", func(r *http.Request) (any, error) {
		p := params{q: r.URL.Query()}
		limit := p.limit("limit", 100)
		if p.err != nil {
			return nil, p.err
		}
		a, err := m.cfg.Store.Alerts(r.Context(), p.q.Get("all") == "", limit)
		return map[string]any{"alerts": nonNil(a)}, err
	})
	api("escalations", func(r *http.Request) (any, error) {
		p := params{q: r.URL.Query()}
		limit := p.limit("limit", 50)
		if p.err != nil {
			return nil, p.err
		}
		recs, err := m.cfg.Store.Messages(r.Context(), store.Query{Escalated: true, Limit: limit})
		return map[string]any{"escalations": nonNil(recs)}, err
	})
	api("dlq", func(r *http.Request) (any, error) {
		p := params{q: r.URL.Query()}
		limit := p.limit("limit", 50)
		if p.err != nil {
			return nil, p.err
		}
		recs, err := m.cfg.Store.Messages(r.Context(), store.Query{DeadLetter: true, Limit: limit})
		return map[string]any{"dead_letters": nonNil(recs)}, err
	})
	// The dead letters themselves, as MESH_DLQ holds them: what replay
	// (agentmesh dlq replay <seq>) would send, with the reason recorded.
	api("dlq/letters", func(r *http.Request) (any, error) {
		p := params{q: r.URL.Query()}
		limit := p.limit("limit", 50)
		if p.err != nil {
			return nil, p.err
		}
		letters, err := dlq.Read(r.Context(), m.js, m.cfg.Scheme, limit)
		if errors.Is(err, dlq.ErrNoStream) {
			err = nil
		}
		views := make([]LetterView, 0, len(letters))
		for i := len(letters) - 1; i >= 0; i-- { // newest first, as the ledger views
			views = append(views, letterView(m.cfg.Scheme, letters[i]))
		}
		return map[string]any{"letters": views}, err
	})
	api("messages", func(r *http.Request) (any, error) {
		p := params{q: r.URL.Query()}
		q := store.Query{Receiver: p.agent("agent"), Status: p.status("status"), Limit: p.limit("limit", 100)}
		switch q.Status {
		case statusPending:
			q.Status, q.Pending = "", true
		case statusGivenUp:
			q.Status, q.GivenUp = "", true
		}
		if p.err != nil {
			return nil, p.err
		}
		recs, err := m.cfg.Store.Messages(r.Context(), q)
		return map[string]any{"messages": nonNil(recs)}, err
	})
	api("timeseries", func(r *http.Request) (any, error) {
		p := params{q: r.URL.Query()}
		agent := p.agent("agent")
		rng, step := p.series(time.Hour, time.Minute)
		if p.err != nil {
			return nil, p.err
		}
		pts, err := m.cfg.Store.Series(r.Context(), agent, time.Now().Add(-rng), step)
		return map[string]any{"range_seconds": rng.Seconds(), "step_seconds": step.Seconds(), "points": nonNil(pts)}, err
	})
	api("hourly", func(r *http.Request) (any, error) {
		p := params{q: r.URL.Query()}
		rng := p.duration("range", 24*time.Hour)
		if p.err != nil {
			return nil, p.err
		}
		h, err := m.cfg.Store.Hourly(r.Context(), time.Now().Add(-rng))
		return map[string]any{"hours": nonNil(h)}, err
	})
	return mux
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

func writeJSON(w http.ResponseWriter, v any) { writeJSONStatus(w, http.StatusOK, v) }

func writeJSONStatus(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v)
}

// Limits of the API's query parameters (see the package doc).
const (
	maxLimit        = 1000                // larger limits are lowered to it
	maxRange        = 31 * 24 * time.Hour // /timeseries and /hourly
	minStep         = time.Second         // the store's smallest /timeseries step
	maxSeriesPoints = 10000               // /timeseries: range/step, rounded up
)

// paramError is a bad query parameter: a 400 naming the parameter.
type paramError struct {
	name string
	err  error
}

func (e *paramError) Error() string { return "parameter " + e.name + ": " + e.err.Error() }

func (e *paramError) Unwrap() error { return e.err }

// params reads query parameters, keeping the first error.
type params struct {
	q   url.Values
	err error
}

func (p *params) fail(name string, err error) {
	if p.err == nil {
		p.err = &paramError{name: name, err: err}
	}
}

// agent returns an agent id parameter ("" when absent).
func (p *params) agent(name string) string {
	v := p.q.Get(name)
	if v == "" {
		return ""
	}
	if err := subjects.ValidateToken("agent id", v); err != nil {
		p.fail(name, err)
		return ""
	}
	return v
}

// The status parameters of rows without a final status, and of rows
// whose follow-up was given up.
const (
	statusPending = "pending"
	statusGivenUp = "given_up"
)

// ledgerStatuses are the statuses a ledger query can filter on.
var ledgerStatuses = []string{store.StatusACK, store.StatusNACK, store.StatusTimeout, store.StatusInvalid, statusPending, statusGivenUp}

// status returns a ledger status parameter ("" when absent: any status).
func (p *params) status(name string) string {
	v := p.q.Get(name)
	if v == "" || slices.Contains(ledgerStatuses, v) {
		return v
	}
	p.fail(name, fmt.Errorf("%q is not one of %s", v, strings.Join(ledgerStatuses, ", ")))
	return ""
}

// limit returns a positive integer parameter, def when absent, at most maxLimit.
func (p *params) limit(name string, def int) int {
	v := p.q.Get(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		p.fail(name, fmt.Errorf("%q is not a positive integer", v))
		return def
	}
	return min(n, maxLimit)
}

// duration returns a range parameter (a Go duration such as "90m"), def
// when absent, positive and at most maxRange.
func (p *params) duration(name string, def time.Duration) time.Duration {
	v := p.q.Get(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	switch {
	case err != nil:
		p.fail(name, fmt.Errorf("%q is not a duration such as 30m or 24h", v))
	case d <= 0:
		p.fail(name, fmt.Errorf("%s is not positive", d))
	case d > maxRange:
		p.fail(name, fmt.Errorf("%s is above the maximum of %s (31 days)", d, maxRange))
	default:
		return d
	}
	return def
}

// series returns the range and step of /timeseries. The step is what the
// store uses: at least minStep, in whole microseconds.
func (p *params) series(defRange, defStep time.Duration) (rng, step time.Duration) {
	rng = p.duration("range", defRange)
	v := p.q.Get("step")
	if v == "" {
		step = defStep
	} else if d, err := time.ParseDuration(v); err != nil {
		p.fail("step", fmt.Errorf("%q is not a duration such as 30s or 5m", v))
	} else if d < minStep {
		p.fail("step", fmt.Errorf("%s is below the minimum of %s", d, minStep))
	} else {
		step = d.Truncate(time.Microsecond)
	}
	if p.err != nil {
		return rng, step
	}
	n := rng / step
	if rng%step != 0 {
		n++
	}
	if n > maxSeriesPoints {
		p.fail("step", fmt.Errorf("range %s / step %s is %d points, more than the maximum of %d: use a larger step",
			rng, step, n, maxSeriesPoints))
	}
	return rng, step
}

// LetterView is a dead letter in /api/v1/dlq/letters.
type LetterView struct {
	Seq         uint64    `json:"seq"` // in MESH_DLQ: agentmesh dlq replay <seq>
	Time        time.Time `json:"time"`
	Receiver    string    `json:"receiver"`
	Priority    string    `json:"priority"`
	Sender      string    `json:"sender"`
	Action      string    `json:"action"`
	MessageID   string    `json:"message_id"`
	Status      string    `json:"status"` // TIMEOUT, NACK or INVALID
	Reason      string    `json:"reason"`
	Deliveries  int       `json:"deliveries"`
	BodyOmitted bool      `json:"body_omitted,omitempty"` // too large to copy: replay cannot send it
}

func letterView(scheme subjects.Scheme, l dlq.Letter) LetterView {
	sub, _ := scheme.Parse(l.Subject) // a foreign subject leaves the names empty
	return LetterView{Seq: l.Seq, Time: l.Time, Receiver: sub.Receiver, Priority: sub.Priority, Sender: sub.Sender,
		Action: l.Action(), MessageID: l.MessageID(), Status: l.Status(), Reason: l.Reason(),
		Deliveries: l.Deliveries(), BodyOmitted: l.Header.Get(dlq.HeaderBodyOmitted) != ""}
}

// unixNano is the time of n nanoseconds since the epoch in UTC, zero for 0.
func unixNano(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n).UTC()
}
