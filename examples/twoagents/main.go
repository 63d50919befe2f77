// Command twoagents runs two agents on an embedded NATS server: an
// orchestrator asks a planner for a plan (request/response), then sends the
// plan's first task (execute_operation) to the same planner, which also
// executes operations so that two agents suffice, and waits for its ACK
// (SendAndWait), then a bad task that the planner NACKs.
//
//	go run ./examples/twoagents
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
)

func main() {
	if err := run(); err != nil {
		log.Fatal(err)
	}
}

func run() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// An embedded JetStream server with a throw-away store.
	dir, err := os.MkdirTemp("", "twoagents")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: dir, NoSigs: true})
	if err != nil {
		return err
	}
	go srv.Start()
	defer srv.WaitForShutdown()
	defer srv.Shutdown()
	if !srv.ReadyForConnections(10 * time.Second) {
		return errors.New("nats server did not start")
	}
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		return err
	}
	defer nc.Close()

	// The planner answers plan_workflow and executes operations.
	planner, err := agentkit.New(nc, "planner_1", agentkit.WithType("planner"))
	if err != nil {
		return err
	}
	planner.HandleFunc("plan_workflow", func(ctx context.Context, m *agentkit.Message) error {
		fmt.Printf("planner_1    <- %s from %s (priority %s)\n", m.Action, m.SenderID, m.Priority)
		return m.Reply(ctx, "plan_complete", map[string]any{"tasks": []map[string]string{
			{"task_id": "t1", "description": "Update credit limit", "agent_type": "executor"},
		}})
	})
	planner.HandleFunc("execute_operation", func(ctx context.Context, m *agentkit.Message) error {
		var op struct {
			CustomerID  string `json:"customer_id"`
			CreditLimit int    `json:"credit_limit"`
		}
		if err := m.DecodePayload(&op); err != nil {
			return agentkit.Reject(wire.CodeInvalid, err.Error())
		}
		if op.CreditLimit <= 0 {
			return agentkit.Reject(wire.CodeInvalid, "credit_limit must be positive")
		}
		fmt.Printf("planner_1    <- %s: %s credit limit → %d\n", m.Action, op.CustomerID, op.CreditLimit)
		return nil
	})
	if err := planner.Start(ctx); err != nil {
		return err
	}
	defer planner.Drain(ctx)

	orch, err := agentkit.New(nc, "orch_1", agentkit.WithType("orchestrator"))
	if err != nil {
		return err
	}
	if err := orch.Start(ctx); err != nil {
		return err
	}
	defer orch.Drain(ctx)

	corr := wire.NewCorrelationID("session_demo", "update CUST001 credit limit", time.Now())
	reply, err := orch.Request(ctx, "planner_1", "plan_workflow",
		map[string]any{"operation": "update", "target_customer_id": "CUST001", "parameters": map[string]int{"credit_limit": 100000}},
		agentkit.WithPriority(wire.PriorityHigh), agentkit.WithWorkflowID("wf_abc"), agentkit.WithCorrelationID(corr))
	if err != nil {
		return err
	}
	fmt.Printf("orch_1       <- %s %s: %s\n", reply.Action, reply.Status, reply.Payload)

	ack, err := orch.SendAndWait(ctx, "planner_1", "execute_operation", map[string]any{"customer_id": "CUST001", "credit_limit": 100000},
		agentkit.WithWorkflowID("wf_abc"), agentkit.WithTaskID("t1"), agentkit.WithCorrelationID(corr))
	if err != nil {
		return err
	}
	fmt.Printf("orch_1       <- ACK (processing_time_ms=%d)\n", ack.ProcessingTime.Milliseconds())

	_, err = orch.SendAndWait(ctx, "planner_1", "execute_operation", map[string]any{"customer_id": "CUST001", "credit_limit": -1},
		agentkit.WithWorkflowID("wf_abc"), agentkit.WithTaskID("t1"), agentkit.WithCorrelationID(corr))
	var nack *wire.Error
	if !errors.As(err, &nack) {
		return fmt.Errorf("expected a NACK, got %v", err)
	}
	fmt.Printf("orch_1       <- NACK %s: %s\n", nack.Code, nack.Message)
	fmt.Printf("correlation  %s\n", corr)
	return nil
}
