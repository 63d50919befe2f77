package ackmonitor_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/ackmonitor"
	"github.com/agentmesh-io/agentmesh/ackmonitor/internal/pgtest"
	"github.com/agentmesh-io/agentmesh/ackmonitor/store"
	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/internal/natstest"
)

func testCtx(t testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return c
}

// eventually polls cond until it holds or d passes.
var eventually = natstest.Eventually

// storeKind names the two ledger implementations.
type storeKind string

const (
	sqliteStore   storeKind = "sqlite"
	postgresStore storeKind = "postgres"
)

// openStore returns a fresh ledger of kind, closed when the test ends.
func openStore(t testing.TB, kind storeKind) store.Store {
	t.Helper()
	open := store.OpenSQLite
	if kind == postgresStore {
		open = store.OpenPostgres
	}
	s, err := open(context.Background(), ledgerAt(t, kind))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// ledgerAt returns where a fresh ledger of kind goes: a SQLite file path,
// or the DSN of a PostgreSQL schema of its own, dropped when the test
// ends. PostgreSQL needs AGENTMESH_TEST_POSTGRES_DSN (required when
// CI=true).
func ledgerAt(t testing.TB, kind storeKind) string {
	t.Helper()
	if kind == sqliteStore {
		return filepath.Join(t.TempDir(), "ledger.db")
	}
	return pgtest.Schema(t, "ackmonitor_test")
}

// fastConfig is a monitor configuration with test-sized intervals. Its
// lease is the default's: a loaded machine stalls a process for longer
// than a short one, and a lone monitor that loses its pin stops consuming
// until it takes it back. Failover tests shorten it (see haConfig).
func fastConfig(st store.Store) ackmonitor.Config {
	return ackmonitor.Config{
		Store: st, PinnedTTL: 10 * time.Second, AckWait: 2 * time.Second, FetchWait: 50 * time.Millisecond,
		EvaluateInterval: 100 * time.Millisecond, RollupInterval: 200 * time.Millisecond,
		StatusInterval: 100 * time.Millisecond, ReconcileInterval: 200 * time.Millisecond,
	}
}

// haConfig is fastConfig with a 1s lease, for tests of the takeover
// between two instances.
func haConfig(st store.Store) ackmonitor.Config {
	cfg := fastConfig(st)
	cfg.PinnedTTL = time.Second
	return cfg
}

// running is a monitor running in the background.
type running struct {
	*ackmonitor.Monitor
	nc     *nats.Conn
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
}

// activeOf returns which of a and b is active and which stands by; ok is
// false unless exactly one is active. Tests of two instances read it at
// each poll: on a loaded machine haConfig's one-second pin may pass from
// one to the other.
func activeOf(a, b *running) (active, standby *running, ok bool) {
	switch aa, ba := a.Active(), b.Active(); {
	case aa && !ba:
		return a, b, true
	case ba && !aa:
		return b, a, true
	}
	return nil, nil, false
}

// startMonitor runs a monitor on its own connection until stop or the end
// of the test.
func startMonitor(t *testing.T, s *server.Server, cfg ackmonitor.Config) *running {
	t.Helper()
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Logger == nil { // shown when the test fails
		cfg.Logger = slog.New(slog.NewTextHandler(t.Output(), nil))
	}
	m, err := ackmonitor.New(nc, cfg)
	if err != nil {
		nc.Close()
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{Monitor: m, nc: nc, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- m.Run(ctx) }()
	select {
	case <-m.Ready():
	case err := <-r.done:
		t.Fatalf("monitor Run: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("monitor not ready")
	}
	t.Cleanup(r.stop)
	return r
}

// stop cancels Run, waits for it and closes the connection.
func (r *running) stop() {
	r.once.Do(func() {
		r.cancel()
		<-r.done
		r.nc.Close()
	})
}

// kill closes the connection first (a crash as seen by the server), then stops.
func (r *running) kill() {
	r.nc.Close()
	r.stop()
}

// mesh is an embedded server with helpers for agents.
type mesh struct {
	t *testing.T
	s *server.Server
}

func newMesh(t *testing.T) *mesh { return &mesh{t: t, s: natstest.RunServer(t)} }

func (m *mesh) conn() *nats.Conn { return natstest.Connect(m.t, m.s) }

// jetstream returns a JetStream context on a new connection.
func (m *mesh) jetstream() jetstream.JetStream {
	m.t.Helper()
	js, err := jetstream.New(m.conn())
	if err != nil {
		m.t.Fatal(err)
	}
	return js
}

// agent starts an agent with handlers (none: a sender only, not started).
func (m *mesh) agent(id string, handlers map[string]agentkit.HandlerFunc, opts ...agentkit.Option) *agentkit.Agent {
	m.t.Helper()
	a, err := agentkit.New(m.conn(), id, opts...)
	if err != nil {
		m.t.Fatal(err)
	}
	m.t.Cleanup(a.Stop)
	if handlers == nil {
		return a
	}
	for action, h := range handlers {
		if err := a.Handle(action, h); err != nil {
			m.t.Fatal(err)
		}
	}
	if err := a.Start(testCtx(m.t)); err != nil {
		m.t.Fatal(err)
	}
	return a
}

// alertLog records the alert events published on mesh.alert.>.
type alertLog struct {
	mu  sync.Mutex
	got []alertMsg
}

type alertMsg struct {
	Subject string
	Event   ackmonitor.AlertEvent
}

func (m *mesh) watchAlerts() *alertLog {
	l := &alertLog{}
	nc := m.conn()
	_, err := nc.Subscribe("mesh.alert.>", func(msg *nats.Msg) {
		var ev ackmonitor.AlertEvent
		if err := json.Unmarshal(msg.Data, &ev); err != nil {
			m.t.Errorf("alert %s: %v", msg.Subject, err)
			return
		}
		l.mu.Lock()
		l.got = append(l.got, alertMsg{msg.Subject, ev})
		l.mu.Unlock()
	})
	if err != nil {
		m.t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		m.t.Fatal(err)
	}
	return l
}

func (l *alertLog) find(subject, kind, state string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, a := range l.got {
		if a.Subject == subject && a.Event.Kind == kind && a.Event.State == state {
			return true
		}
	}
	return false
}

// rateOf returns the all-time rate of agent at priority.
func rateOf(t testing.TB, st store.Store, agent, prio string) store.Rate {
	t.Helper()
	rates, err := st.Rates(testCtx(t), time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rates {
		if r.Agent == agent && r.Priority == prio {
			return r
		}
	}
	return store.Rate{Agent: agent, Priority: prio}
}

// progressing waits until done holds, failing t only when the ledger
// makes no progress for agent (its sent and resolved counts stay the
// same) for stall: a test of what the monitor records, not of how fast a
// loaded machine records it. A message the monitor dropped stalls the
// count, and fails the test, long before any redelivery.
func progressing(t *testing.T, st store.Store, agent string, stall time.Duration, what string, done func() bool) {
	t.Helper()
	last, since := int64(-1), time.Now()
	for !done() {
		rates, err := st.Rates(testCtx(t), time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		var n int64
		for _, r := range rates {
			if r.Agent == agent {
				n += r.Sent + r.Resolved()
			}
		}
		if n != last {
			last, since = n, time.Now()
		} else if time.Since(since) > stall {
			t.Fatalf("no progress in the ledger for %v (at %d) waiting for %s", stall, n, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// steadyTraffic sends action to agent to from sender every interval until
// stop, which returns how many were sent and the first error, if any.
func steadyTraffic(ctx context.Context, sender *agentkit.Agent, to, action string, every time.Duration) (stop func() (int, error)) {
	quit, done := make(chan struct{}), make(chan error, 1)
	sent := 0 // the sender goroutine's until done
	go func() {
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-quit:
				done <- nil
				return
			case <-tick.C:
				if _, err := sender.Send(ctx, to, action, nil); err != nil {
					done <- err
					return
				}
				sent++
			}
		}
	}()
	return func() (int, error) {
		close(quit)
		err := <-done
		return sent, err
	}
}
