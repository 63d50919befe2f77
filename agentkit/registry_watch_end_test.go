package agentkit_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/registry"
	"github.com/agentmesh-io/agentmesh/internal/natstest"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// A registry watch that ends before its initial load (here: the load is
// stalled on flow control, then the connection closes) makes registry.Open
// return an error at once, even with a context that never ends.
func TestRegistryOpen_WatchEndsBeforeLoad(t *testing.T) {
	t.Parallel()
	// "slow" may not answer the server's flow control: a watch delivers
	// the first 2 MB of the bucket and then stalls, so its initial load
	// never completes.
	s := natstest.RunServer(t, func(o *server.Options) {
		o.Users = []*server.User{
			{Username: "admin", Password: "pw"},
			{Username: "slow", Password: "pw", Permissions: &server.Permissions{
				Publish: &server.SubjectPermission{Deny: []string{"$JS.FC.>"}},
			}},
		}
	})
	js, err := jetstream.New(natstest.Connect(t, s, nats.UserInfo("admin", "pw")))
	if err != nil {
		t.Fatal(err)
	}
	reg, err := registry.Open(ctx(t), js, subjects.Default, 1, true)
	if err != nil {
		t.Fatal(err)
	}
	reg.Close()
	kv, err := js.KeyValue(ctx(t), subjects.Default.RegistryBucket())
	if err != nil {
		t.Fatal(err)
	}
	big := []byte(strings.Repeat("x", 100<<10))
	for i := range 40 { // 4 MB
		if _, err := kv.Put(ctx(t), fmt.Sprintf("filler.%d", i), big); err != nil {
			t.Fatal(err)
		}
	}

	nc := natstest.Connect(t, s, nats.UserInfo("slow", "pw"), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	slow, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		reg *registry.View
		err error
	}
	done := make(chan result, 1)
	go func() {
		reg, err := registry.Open(context.Background(), slow, subjects.Default, 1, false)
		done <- result{reg, err}
	}()
	// Close the connection once the watch is stalled: the first 2 MB of
	// the bucket (20 values) reached the client, half of it.
	eventually(t, 10*time.Second, "the watch's first 2 MB", func() bool { return nc.Stats().InMsgs >= 20 })
	nc.Close()
	select {
	case r := <-done:
		if r.err == nil {
			r.reg.Close()
			t.Fatal("registry.Open succeeded though its initial load could not complete")
		}
		if !errors.Is(r.err, registry.ErrWatchEnded) {
			t.Fatalf("registry.Open: %v, want ErrWatchEnded", r.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("registry.Open still waiting 10s after its watch ended")
	}
}

// A registry whose watch ends by itself (its connection closed) says so in
// Err instead of freezing its cache silently; Close is not such an end.
func TestRegistry_ErrAfterWatchEnds(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	open := func(nc *nats.Conn) *registry.View {
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		reg, err := registry.Open(ctx(t), js, subjects.Default, 1, true)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(reg.Close)
		if err := reg.Err(); err != nil {
			t.Fatalf("Err of a live registry: %v", err)
		}
		return reg
	}
	nc := m.conn()
	lost, closed := open(nc), open(m.conn())
	nc.Close()
	eventually(t, 10*time.Second, "Err after the connection closed", func() bool {
		return errors.Is(lost.Err(), registry.ErrWatchEnded)
	})
	if _, ok := <-lost.Watch(context.Background()); ok {
		t.Fatal("Watch of an ended registry delivered an event")
	}
	closed.Close()
	if err := closed.Err(); err != nil {
		t.Fatalf("Err after Close: %v", err)
	}
}

// An agent whose registry watch ends by itself (here: its bucket is
// deleted; nats.go gives up on the watch after its heartbeats fail, about
// 20s) reports it to its error handler instead of answering discovery
// from a frozen cache without a word.
func TestAgent_ReportsRegistryWatchEnd(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	errs := make(chan error, 16)
	m.started("watcher", nil, agentkit.WithHeartbeat(testHeartbeat), agentkit.WithErrorHandler(func(err error) {
		if errors.Is(err, registry.ErrWatchEnded) {
			errs <- err
		}
	}))
	js, err := jetstream.New(m.conn())
	if err != nil {
		t.Fatal(err)
	}
	if err := js.DeleteKeyValue(ctx(t), subjects.Default.RegistryBucket()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-errs:
	case <-time.After(60 * time.Second):
		t.Fatal("no ErrWatchEnded reported after the registry bucket was deleted")
	}
}
