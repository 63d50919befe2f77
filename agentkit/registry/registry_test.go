package registry_test

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/registry"
	"github.com/agentmesh-io/agentmesh/internal/natstest"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// The records a running agent writes read back, director included,
// without the runtime's watched registry.
func TestDirector_ReadsTheRecordsAgentsWrite(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	a, err := agentkit.New(natstest.Connect(t, s), "planner", agentkit.WithDirector("ops_director"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Stop)
	if err := a.Start(ctx); err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(natstest.Connect(t, s))
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, subjects.Default.RegistryBucket())
	if err != nil {
		t.Fatal(err)
	}
	ins, err := registry.Instances(ctx, kv, "planner")
	if err != nil || len(ins) != 1 || ins[0].ID != "planner" || ins[0].Director != "ops_director" {
		t.Fatalf("Instances = %+v, %v; want planner's one instance, director ops_director", ins, err)
	}
	// The default heartbeat is 5s: the key lives three of them.
	if ins[0].TTLSeconds != 15 {
		t.Errorf("the record states TTL %ds, want 15", ins[0].TTLSeconds)
	}
	for agent, want := range map[string]string{"planner": "ops_director", "unknown": ""} {
		if d, err := registry.Director(ctx, kv, agent); err != nil || d != want {
			t.Errorf("Director(%s) = %q, %v; want %q", agent, d, err, want)
		}
	}
	if _, err := registry.Director(ctx, kv, "a.b"); err == nil {
		t.Error("Director of an invalid agent id: no error")
	}
}

func TestInstance_Expired(t *testing.T) {
	t.Parallel()
	put := time.Date(2026, 1, 10, 14, 30, 0, 0, time.UTC)
	for _, tc := range []struct {
		name string
		ttl  int64
		put  time.Time
		age  time.Duration
		want bool
	}{
		{"within its TTL", 15, put, 15 * time.Second, false},
		{"past its TTL", 15, put, 15*time.Second + time.Millisecond, true},
		{"no TTL stated", 0, put, time.Hour, false},
		{"negative TTL", -1, put, time.Hour, false},
		{"TTL beyond a Duration", math.MaxInt64, put, time.Hour, false},
		{"put time unknown", 15, time.Time{}, 0, false},
	} {
		in := registry.Instance{TTLSeconds: tc.ttl}
		if got := in.Expired(tc.put, put.Add(tc.age)); got != tc.want {
			t.Errorf("%s: Expired = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// Instances skips a record older than the TTL it states, which a bucket
// without limit markers may still hold until the server's expiry scan,
// and keeps one that states none (an older writer's).
func TestInstances_SkipsExpired(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	js, err := jetstream.New(natstest.Connect(t, s))
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: subjects.Default.RegistryBucket(), History: 1})
	if err != nil {
		t.Fatal(err)
	}
	// Put without a per-key TTL, so only the record's own TTL ages them.
	for key, v := range map[string]string{
		"agent.worker.short": `{"id":"worker","instance":"short","status":"READY","ttl_seconds":1}`,
		"agent.worker.long":  `{"id":"worker","instance":"long","status":"READY","ttl_seconds":3600}`,
		"agent.worker.older": `{"id":"worker","instance":"older","status":"READY"}`,
	} {
		if _, err := kv.PutString(ctx, key, v); err != nil {
			t.Fatal(err)
		}
	}
	instances := func() string {
		ins, err := registry.Instances(ctx, kv, "worker")
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, in := range ins {
			ids = append(ids, in.Instance)
		}
		return strings.Join(ids, " ")
	}
	natstest.Eventually(t, 5*time.Second, "the short-lived record skipped", func() bool { return instances() == "long older" })
}

// openView opens the default registry on a server of its own.
func openView(t *testing.T, ctx context.Context) (jetstream.JetStream, *registry.View) {
	t.Helper()
	js, err := jetstream.New(natstest.Connect(t, natstest.RunServer(t)))
	if err != nil {
		t.Fatal(err)
	}
	view, err := registry.Open(ctx, js, subjects.Default, 1, true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(view.Close)
	return js, view
}

// View.Live reads the server, not the view: a record put behind the
// view's back is live at once; STOPPED, deleted, expired by its own TTL, or
// hosted by a host whose record is missing, it is not.
func TestView_LiveReadsTheServer(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	js, view := openView(t, ctx)
	kv, err := js.KeyValue(ctx, subjects.Default.RegistryBucket())
	if err != nil {
		t.Fatal(err)
	}
	put := func(inst, v string) {
		if _, err := kv.PutString(ctx, "agent.worker."+inst, v); err != nil {
			t.Fatal(err)
		}
	}
	live := func(inst string) bool {
		_, ok, err := view.Live(ctx, "worker", inst)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	put("a", `{"id":"worker","instance":"a","status":"READY","ttl_seconds":3600}`)
	put("b", `{"id":"worker","instance":"b","status":"STOPPED","ttl_seconds":3600}`)
	put("c", `{"id":"worker","instance":"c","status":"READY","ttl_seconds":1}`)
	put("d", `{"id":"worker","instance":"d","status":"READY","host":"g","ttl_seconds":3600}`)
	if !live("a") || live("b") || live("d") || live("missing") {
		t.Fatalf("live: a %v, b (STOPPED) %v, d (no host record) %v, missing %v", live("a"), live("b"), live("d"), live("missing"))
	}
	if _, err := kv.PutString(ctx, "host.g.d", `{"group":"g","instance":"d","members":{"worker":{"status":"READY","load":0,"in_flight":0}},"ttl_seconds":3600}`); err != nil {
		t.Fatal(err)
	}
	if !live("d") {
		t.Fatal("d is not live though its host's record lists it")
	}
	natstest.Eventually(t, 5*time.Second, "c's own TTL ran out", func() bool { return !live("c") })
	if err := kv.Delete(ctx, "agent.worker.a"); err != nil {
		t.Fatal(err)
	}
	if live("a") {
		t.Fatal("a is live after its deletion")
	}
}

// View.Expire removes a record only at the revision the caller read, and
// the view then reads the instance as crashed (UNAVAILABLE), not stopped.
func TestView_ExpireAtTheRevisionRead(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, view := openView(t, ctx)
	rec := registry.Instance{ID: "worker", Instance: "a", Status: registry.StatusReady, Probe: true}
	if err := view.Register(ctx, rec, time.Hour); err != nil {
		t.Fatal(err)
	}
	var first uint64
	natstest.Eventually(t, 5*time.Second, "the view holds the record", func() bool {
		in, rev, ok := view.Revision("worker", "a")
		first = rev
		return ok && in.Probe && rev > 0
	})
	if err := view.Register(ctx, rec, time.Hour); err != nil { // a renewal
		t.Fatal(err)
	}
	if err := view.Expire(ctx, "worker", "a", first); err == nil {
		t.Fatal("Expire at a revision the instance has renewed since removed its record")
	}
	if _, live, err := view.Live(ctx, "worker", "a"); err != nil || !live {
		t.Fatalf("after the refused Expire: live %v, %v", live, err)
	}
	var latest uint64
	natstest.Eventually(t, 5*time.Second, "the view holds the renewal", func() bool {
		_, rev, ok := view.Revision("worker", "a")
		latest = rev
		return ok && rev > first
	})
	if err := view.Expire(ctx, "worker", "a", latest); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 5*time.Second, "the view reads the agent UNAVAILABLE", func() bool {
		a, ok := view.Get("worker")
		return ok && a.Status == registry.StatusUnavailable
	})
	if _, live, err := view.Live(ctx, "worker", "a"); err != nil || live {
		t.Fatalf("after Expire: live %v, %v", live, err)
	}
}
