package registry_test

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/agentkit/registry"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// A service that is no agent (a dashboard, a router) opens a view of the
// registry and finds agents by capability. Agents register themselves
// with their heartbeats; here one record is written by hand.
func ExampleView_Find() {
	dir, _ := os.MkdirTemp("", "registry-example")
	defer os.RemoveAll(dir)
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: dir, NoLog: true, NoSigs: true})
	if err != nil {
		panic(err)
	}
	go s.Start()
	defer s.Shutdown()
	s.ReadyForConnections(10 * time.Second)
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		panic(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	view, err := registry.Open(ctx, js, subjects.Default, 1, true)
	if err != nil {
		panic(err)
	}
	defer view.Close()
	planner := registry.Instance{ID: "planner_1", Instance: "i1", Status: registry.StatusReady,
		Capabilities: []registry.Capability{{Name: "planner", Actions: []string{"plan"}}}}
	if err := view.Register(ctx, planner, 15*time.Second); err != nil {
		panic(err)
	}
	for ctx.Err() == nil { // the view learns of the record through its watch
		if _, ok := view.Get("planner_1"); ok {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	found, err := view.Find(ctx, registry.Query{Capability: "planner", Status: registry.StatusReady})
	if err != nil {
		panic(err)
	}
	for _, a := range found {
		fmt.Println(a.ID, a.Status, a.Instances)
	}
	// Output: planner_1 READY 1
}
