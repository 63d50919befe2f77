package ackmonitor_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/agentmesh-io/agentmesh/ackmonitor"
	"github.com/agentmesh-io/agentmesh/ackmonitor/store"
	"github.com/agentmesh-io/agentmesh/agentkit"
)

// A monitor on an embedded server records a message from "planner" to
// "executor" and its ack.
func Example() {
	dir, _ := os.MkdirTemp("", "ackmonitor-example")
	defer os.RemoveAll(dir)
	srv, _ := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: dir, NoLog: true, NoSigs: true})
	go srv.Start()
	defer srv.Shutdown()
	srv.ReadyForConnections(10 * time.Second)
	nc, _ := nats.Connect(srv.ClientURL())
	defer nc.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	ledger, err := store.OpenSQLite(ctx, filepath.Join(dir, "ledger.db"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer ledger.Close()
	mon, err := ackmonitor.New(nc, ackmonitor.Config{Store: ledger, FetchWait: 50 * time.Millisecond})
	if err != nil {
		fmt.Println(err)
		return
	}
	done := make(chan error, 1)
	go func() { done <- mon.Run(ctx) }()
	<-mon.Ready()

	executor, _ := agentkit.New(nc, "executor")
	executor.HandleFunc("execute_operation", func(context.Context, *agentkit.Message) error { return nil })
	executor.Start(ctx)
	defer executor.Stop()
	planner, _ := agentkit.New(nc, "planner")
	defer planner.Stop()
	planner.Send(ctx, "executor", "execute_operation", map[string]string{"op": "deploy"})

	for {
		agents, _ := mon.Agents(ctx)
		if len(agents) == 1 && agents[0].Total.Sent == 1 && agents[0].Total.Acked == 1 {
			a := agents[0]
			fmt.Printf("%s: sent %d, acked %d, ack rate %.0f%%\n", a.Agent, a.Total.Sent, a.Total.Acked, 100*a.Total.AckRate)
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	<-done
	// Output:
	// executor: sent 1, acked 1, ack rate 100%
}
