package ackmonitor

import (
	"context"
	"embed"
	"encoding/json"
	"io/fs"
	"net/http"
	"sort"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/agentmesh-io/agentmesh/ackmonitor/store"
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

// Summary is the mesh-wide view (GET /api/v1/summary).
type Summary struct {
	Monitor         string    `json:"monitor"`
	Active          bool      `json:"active"`
	WindowSeconds   float64   `json:"window_seconds"`
	GeneratedAt     time.Time `json:"generated_at"`
	Window          RateView  `json:"window"` // over the sliding window
	Total           RateView  `json:"total"`  // everything in the ledger
	ActiveAlerts    int       `json:"active_alerts"`
	Unavailable     int       `json:"unavailable_agents"`
	EventsProcessed uint64    `json:"events_processed"`
	LagSeconds      float64   `json:"lag_seconds"`
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
		GeneratedAt: time.Now().UTC(), ActiveAlerts: len(alerts), EventsProcessed: m.applied.Load(),
		LagSeconds: time.Duration(m.lastLag.Load()).Seconds()}
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
			if err != nil {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusInternalServerError)
				json.NewEncoder(w).Encode(map[string]string{"error": err.Error()})
				return
			}
			writeJSON(w, v)
		})
	}
	api("summary", func(r *http.Request) (any, error) { return m.Summary(r.Context()) })
	api("agents", func(r *http.Request) (any, error) {
		a, err := m.Agents(r.Context())
		return map[string]any{"window_seconds": m.cfg.Window.Seconds(), "agents": a}, err
	})
	api("alerts", func(r *http.Request) (any, error) {
		a, err := m.cfg.Store.Alerts(r.Context(), r.URL.Query().Get("all") == "", intParam(r, "limit", 100))
		return map[string]any{"alerts": nonNil(a)}, err
	})
	api("escalations", func(r *http.Request) (any, error) {
		recs, err := m.cfg.Store.Messages(r.Context(), store.Query{Escalated: true, Limit: intParam(r, "limit", 50)})
		return map[string]any{"escalations": nonNil(recs)}, err
	})
	api("dlq", func(r *http.Request) (any, error) {
		recs, err := m.cfg.Store.Messages(r.Context(), store.Query{DeadLetter: true, Limit: intParam(r, "limit", 50)})
		return map[string]any{"dead_letters": nonNil(recs)}, err
	})
	api("messages", func(r *http.Request) (any, error) {
		q := r.URL.Query()
		recs, err := m.cfg.Store.Messages(r.Context(), store.Query{Receiver: q.Get("agent"), Status: q.Get("status"), Limit: intParam(r, "limit", 100)})
		return map[string]any{"messages": nonNil(recs)}, err
	})
	api("timeseries", func(r *http.Request) (any, error) {
		rng := durParam(r, "range", time.Hour)
		step := durParam(r, "step", time.Minute)
		pts, err := m.cfg.Store.Series(r.Context(), r.URL.Query().Get("agent"), time.Now().Add(-rng), step)
		return map[string]any{"range_seconds": rng.Seconds(), "step_seconds": step.Seconds(), "points": nonNil(pts)}, err
	})
	api("hourly", func(r *http.Request) (any, error) {
		h, err := m.cfg.Store.Hourly(r.Context(), time.Now().Add(-durParam(r, "range", 24*time.Hour)))
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

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	json.NewEncoder(w).Encode(v)
}

func intParam(r *http.Request, name string, def int) int {
	if n, err := strconv.Atoi(r.URL.Query().Get(name)); err == nil && n > 0 {
		return min(n, 1000)
	}
	return def
}

func durParam(r *http.Request, name string, def time.Duration) time.Duration {
	if d, err := time.ParseDuration(r.URL.Query().Get(name)); err == nil && d > 0 {
		return d
	}
	return def
}
