package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/registry"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/internal/natstest"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// TestScale_AgentsOverRuntimes is the scale benchmark's scenario at a size
// for CI (agentmesh bench --scale 100,300,1000 is the full run, with its
// figures): 50 agents, registered with heartbeats and handlers, spread
// over 20 connections as 20 processes would hold them, the agents of each
// in its group, on one server with default limits. Every agent starts and
// shows in the registry, the message stream holds the groups' five
// consumers each and no other, a burst spread over the agents is handled
// exactly once per message by its addressee, and every Drain returns,
// leaving each agent STOPPED in the registry. No timing is asserted:
// speed is the benchmark's business. AGENTMESH_SCALE_AGENTS sets the
// number of agents:
//
//	AGENTMESH_SCALE_AGENTS=1000 go test -modfile=go_test.mod -run TestScale_AgentsOverRuntimes -v ./e2e
func TestScale_AgentsOverRuntimes(t *testing.T) {
	const (
		runtimes = 20
		parallel = 8 // agents starting at once
	)
	agents := 50
	if v := os.Getenv("AGENTMESH_SCALE_AGENTS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("AGENTMESH_SCALE_AGENTS=%q: want a positive count", v)
		}
		agents = n
	}
	burst := 20 * agents
	srv := natstest.RunServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	conns := make([]*nats.Conn, runtimes)
	groups := make([]*agentkit.Group, runtimes)
	for i := range conns {
		conns[i] = natstest.Connect(t, srv, nats.Name(fmt.Sprintf("runtime-%d", i)))
		g, err := agentkit.NewGroup(conns[i], fmt.Sprintf("runtime_%d", i))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(g.Close) // after the agents' Stop (cleanups run last first)
		groups[i] = g
	}

	l := &ledger{seen: map[string]int{}}
	var misrouted atomic.Int64
	ids := make([]string, agents)
	mesh := make([]*agentkit.Agent, agents)
	for i := range agents {
		ids[i] = fmt.Sprintf("scale_%d", i)
		a, err := agentkit.New(conns[i%runtimes], ids[i], agentkit.WithGroup(groups[i%runtimes]), agentkit.WithFanoutActions())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(a.Stop) // a no-op once drained; before the connections close
		id := ids[i]
		if err := a.HandleFunc("work", func(ctx context.Context, m *agentkit.Message) error {
			if m.ReceiverID != id {
				misrouted.Add(1)
			}
			l.record(m)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		mesh[i] = a
	}
	forAll(t, mesh, parallel, func(a *agentkit.Agent) error { return a.Start(ctx) })

	admin := natstest.Connect(t, srv)
	js, err := jetstream.New(admin)
	if err != nil {
		t.Fatal(err)
	}
	reg, err := registry.Open(ctx, js, subjects.Default, 1, false)
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	waitRegistry(t, reg, ids, agentkit.StatusReady)
	stream, err := js.Stream(ctx, subjects.Default.Stream())
	if err != nil {
		t.Fatal(err)
	}
	if n := stream.CachedInfo().State.Consumers; n != 5*min(runtimes, agents) {
		t.Errorf("%d consumers on the message stream, want the groups' %d", n, 5*min(runtimes, agents))
	}

	sender, err := agentkit.New(natstest.Connect(t, srv), "scale_sender", agentkit.WithRegistration(false))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sender.Stop)
	payload := json.RawMessage(`{"n":1}`)
	envs := make([]*wire.Envelope, 0, 250)
	for i := range burst {
		e, err := sender.NewRequest(ctx, ids[i%agents], "work", payload)
		if err != nil {
			t.Fatal(err)
		}
		if envs = append(envs, e); len(envs) == cap(envs) || i == burst-1 {
			if err := sender.SendBatch(ctx, envs); err != nil {
				t.Fatal(err)
			}
			envs = envs[:0]
		}
	}
	waitHandled(t, l, burst)
	// Nothing pending or unacknowledged: no redelivery can still come.
	waitSettled(t, ctx, mesh...)
	if got, dups, wrong := l.unique.Load(), l.dups.Load(), misrouted.Load(); got != int64(burst) || dups != 0 || wrong != 0 {
		t.Errorf("%d distinct messages handled (want %d), %d handled again, %d by an agent they were not addressed to", got, burst, dups, wrong)
	}

	forAll(t, mesh, agents, func(a *agentkit.Agent) error { return a.Drain(ctx) })
	waitRegistry(t, reg, ids, agentkit.StatusStopped)
}

// forAll calls f for every agent, at most parallel at a time, and fails
// the test with every error.
func forAll(t *testing.T, agents []*agentkit.Agent, parallel int, f func(*agentkit.Agent) error) {
	t.Helper()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	sem := make(chan struct{}, parallel)
	for _, a := range agents {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if err := f(a); err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("%s: %w", a.ID(), err))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
}

// waitRegistry waits until the registry shows every agent in ids with
// status.
func waitRegistry(t *testing.T, reg *registry.View, ids []string, status agentkit.AgentStatus) {
	t.Helper()
	natstest.WaitFor(t, 60*time.Second, func() error {
		wrong := 0
		var example string
		for _, id := range ids {
			if rec, ok := reg.Get(id); !ok || rec.Status != status {
				if wrong++; example == "" {
					example = fmt.Sprintf("%s: %q (known: %t)", id, rec.Status, ok)
				}
			}
		}
		if wrong > 0 {
			return fmt.Errorf("%d of %d agents not %s in the registry, e.g. %s", wrong, len(ids), status, example)
		}
		return nil
	})
}
