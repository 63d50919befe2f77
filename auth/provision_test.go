package auth_test

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/auth"
	"github.com/agentmesh-io/agentmesh/internal/natstest"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// consumerConfigs returns the server's configuration of agent id's five
// consumers.
func consumerConfigs(t *testing.T, ctx context.Context, js jetstream.JetStream, id string) map[wire.Priority]jetstream.ConsumerConfig {
	t.Helper()
	out := map[wire.Priority]jetstream.ConsumerConfig{}
	for _, p := range wire.Priorities {
		name, _ := subjects.Default.Consumer(id, string(p))
		c, err := js.Consumer(ctx, subjects.Default.Stream(), name)
		if err != nil {
			t.Fatalf("consumer %s: %v", name, err)
		}
		out[p] = c.CachedInfo().Config
	}
	return out
}

// TestProvision_matchesAgentkit guards the replica of agentkit's consumer
// configuration: the consumers Provision creates must be exactly those a
// provisioning agent creates for itself, as the server stores them.
func TestProvision_matchesAgentkit(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	nc := natstest.Connect(t, s)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	spec := auth.AgentSpec{ID: "P", Topics: []string{"news", "ops"}}
	a, err := agentkit.New(nc, spec.ID, agentkit.WithRegistration(false), agentkit.WithTopics(spec.Topics...))
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(ctx); err != nil {
		t.Fatal(err)
	}
	a.Stop()
	want := consumerConfigs(t, ctx, js, spec.ID)
	for _, p := range wire.Priorities {
		name, _ := subjects.Default.Consumer(spec.ID, string(p))
		if err := js.DeleteConsumer(ctx, subjects.Default.Stream(), name); err != nil {
			t.Fatal(err)
		}
	}
	if err := auth.Provision(ctx, js, subjects.Default, []auth.AgentSpec{spec}, auth.ProvisionOptions{}); err != nil {
		t.Fatal(err)
	}
	got := consumerConfigs(t, ctx, js, spec.ID)
	for _, p := range wire.Priorities {
		if !reflect.DeepEqual(got[p], want[p]) {
			t.Errorf("%s consumer:\nProvision: %+v\nagentkit:  %+v", p, got[p], want[p])
		}
	}
	// Provision is idempotent.
	if err := auth.Provision(ctx, js, subjects.Default, []auth.AgentSpec{spec}, auth.ProvisionOptions{}); err != nil {
		t.Fatalf("second Provision: %v", err)
	}
}

// TestRegistration runs isolated agents with registration on, given the
// registry rights of Options.Registration: they see each other, and still
// cannot write each other's records.
func TestRegistration(t *testing.T) {
	t.Parallel()
	b := generate(t, []auth.AgentSpec{{ID: "A"}, {ID: "B"}}, auth.Options{Registration: true})
	s := natstest.RunServer(t, withAuth(t, b))
	provision(t, s, b, auth.ProvisionOptions{Registry: true})
	ncA, wA := conn(t, s, b, "A")
	ncB, wB := conn(t, s, b, "B")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var agents []*agentkit.Agent
	for _, x := range []struct {
		nc *nats.Conn
		id string
	}{{ncA, "A"}, {ncB, "B"}} {
		ag := isolatedAgent(t, x.nc, x.id, agentkit.WithRegistration(true), agentkit.WithHeartbeat(400*time.Millisecond))
		if err := ag.HandleFunc("noop", func(context.Context, *agentkit.Message) error { return nil }); err != nil {
			t.Fatal(err)
		}
		if err := ag.Start(ctx); err != nil {
			t.Fatalf("Start %s with registration: %v", x.id, err)
		}
		agents = append(agents, ag)
	}
	natstest.Eventually(t, 5*time.Second, "A and B to see each other READY", func() bool {
		ra, ok1 := agents[0].Registry().Get("B")
		rb, ok2 := agents[1].Registry().Get("A")
		return ok1 && ok2 && ra.Status == agentkit.StatusReady && rb.Status == agentkit.StatusReady
	})
	// Heartbeats renewed the records without a violation.
	natstest.Eventually(t, 5*time.Second, "a heartbeat", func() bool {
		r, _ := agents[1].Registry().Get("A")
		return time.Since(r.LastHeartbeat) < 300*time.Millisecond
	})
	if n := wA.Count() + wB.Count(); n != 0 {
		t.Fatalf("%d violations with registration on: %v %v", n, wA.Recent(), wB.Recent())
	}
	// A cannot write B's record or delete it.
	for _, subj := range []string{"$KV.mesh_registry.agent.B.forged", "$KV.mesh_registry.other"} {
		n := wA.Count()
		if err := ncA.Publish(subj, []byte(`{"id":"B","status":"STOPPED"}`)); err != nil {
			t.Fatal(err)
		}
		expectViolation(t, wA, n, "publish", subj)
	}
	// A answers its own instances' probes (above, without a violation),
	// and may neither answer nor send B's.
	probeB, _ := subjects.Default.Probe("B", "forged")
	n := wA.Count()
	if _, err := ncA.Subscribe(probeB, func(m *nats.Msg) { _ = m.Respond(nil) }); err != nil {
		t.Fatal(err)
	}
	expectViolation(t, wA, n, "subscribe", probeB)
	n = wA.Count()
	if err := ncA.Publish(probeB, nil); err != nil {
		t.Fatal(err)
	}
	expectViolation(t, wA, n, "publish", probeB)
	// Stopping deregisters without a violation.
	before := wA.Count()
	agents[0].Stop()
	natstest.Eventually(t, 5*time.Second, "B to see A stopped", func() bool {
		r, ok := agents[1].Registry().Get("A")
		return ok && r.Status == agentkit.StatusStopped
	})
	if wA.Count() != before {
		t.Fatalf("violations while stopping: %v", wA.Recent())
	}
}

// TestPayloads sends an envelope above the server's max payload between
// isolated agents given the object store rights of Options.Payloads.
func TestPayloads(t *testing.T) {
	t.Parallel()
	b := generate(t, []auth.AgentSpec{{ID: "A"}, {ID: "B"}}, auth.Options{Payloads: true})
	s := natstest.RunServer(t, withAuth(t, b), func(o *server.Options) { o.MaxPayload = 256 << 10 })
	provision(t, s, b, auth.ProvisionOptions{Payloads: true})
	ncA, wA := conn(t, s, b, "A")
	ncB, wB := conn(t, s, b, "B")
	got := make(chan int, 1)
	bAgent := isolatedAgent(t, ncB, "B")
	if err := bAgent.HandleFunc("big", func(_ context.Context, m *agentkit.Message) error {
		got <- len(m.Envelope.Payload)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := bAgent.Start(ctx); err != nil {
		t.Fatal(err)
	}
	aAgent := isolatedAgent(t, ncA, "A")
	big := strings.Repeat("x", 300<<10)
	if _, err := aAgent.Send(ctx, "B", "big", big); err != nil {
		t.Fatalf("Send of %d bytes: %v (violations: %v)", len(big), err, wA.Recent())
	}
	select {
	case n := <-got:
		if n < len(big) {
			t.Fatalf("B got %d bytes, want at least %d", n, len(big))
		}
	case <-ctx.Done():
		t.Fatalf("B never handled the large envelope (violations: %v)", wB.Recent())
	}
	// Once handled, B deletes the object (a purge of its chunks).
	store, err := adminJS(t, s, b).ObjectStore(ctx, subjects.Default.PayloadsBucket())
	if err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 5*time.Second, "the large envelope to be released", func() bool {
		l, err := store.List(ctx)
		if err != nil && !errors.Is(err, jetstream.ErrNoObjectsFound) {
			t.Fatal(err)
		}
		return len(l) == 0
	})
	if n := wA.Count() + wB.Count(); n != 0 {
		t.Fatalf("violations: %v %v", wA.Recent(), wB.Recent())
	}
}

// TestRegistration_InstancesTakeTurns runs two instances of one isolated
// agent with the registration right: the younger stands by, and takes
// the turn once the elder's connection closes (probes, then the elder's
// record read from the registry's stream leader), without a violation.
func TestRegistration_InstancesTakeTurns(t *testing.T) {
	t.Parallel()
	b := generate(t, []auth.AgentSpec{{ID: "A"}, {ID: "S"}}, auth.Options{Registration: true})
	s := natstest.RunServer(t, withAuth(t, b))
	provision(t, s, b, auth.ProvisionOptions{Registry: true})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	handled := make(chan string, 4)
	start := func(name string) (*nats.Conn, *auth.Watcher, *agentkit.Agent) {
		nc, w := conn(t, s, b, "A")
		ag := isolatedAgent(t, nc, "A", agentkit.WithRegistration(true), agentkit.WithHeartbeat(time.Second))
		if err := ag.HandleFunc("noop", func(context.Context, *agentkit.Message) error { handled <- name; return nil }); err != nil {
			t.Fatal(err)
		}
		if err := ag.Start(ctx); err != nil {
			t.Fatalf("Start instance %s of A: %v", name, err)
		}
		return nc, w, ag
	}
	ncElder, wElder, elder := start("elder")
	_, wYounger, younger := start("younger")
	natstest.Eventually(t, 10*time.Second, "the elder consumes, the younger stands by", func() bool { return elder.Consuming() && !younger.Consuming() })
	ncElder.Close()
	natstest.Eventually(t, 30*time.Second, "the younger consumes once the elder is gone", younger.Consuming)
	ncS, _ := conn(t, s, b, "S")
	sender := isolatedAgent(t, ncS, "S")
	if err := sender.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := sender.Send(ctx, "A", "noop", nil); err != nil {
		t.Fatal(err)
	}
	select {
	case by := <-handled:
		if by != "younger" {
			t.Fatalf("handled by the %s", by)
		}
	case <-ctx.Done():
		t.Fatal("the message was not handled")
	}
	if n := wElder.Count() + wYounger.Count(); n != 0 {
		t.Fatalf("%d violations: %v %v", n, wElder.Recent(), wYounger.Recent())
	}
}
