package agentkit_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
)

// exampleServer is an embedded JetStream server the examples run against.
var exampleServer *server.Server

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "agentkit-examples")
	if err != nil {
		panic(err)
	}
	exampleServer, err = server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: dir, NoLog: true, NoSigs: true})
	if err != nil {
		panic(err)
	}
	go exampleServer.Start()
	if !exampleServer.ReadyForConnections(10 * time.Second) {
		panic("example server not ready")
	}
	code := m.Run()
	exampleServer.Shutdown()
	exampleServer.WaitForShutdown()
	os.RemoveAll(dir)
	os.Exit(code)
}

// connect returns a connection to the example server; examples must
// share it cleanly, so each uses its own subject prefix.
func connect() *nats.Conn {
	nc, err := nats.Connect(exampleServer.ClientURL())
	if err != nil {
		panic(err)
	}
	return nc
}

// Two agents: a planner that answers plan_workflow requests and an
// orchestrator that asks it.
func Example() {
	ctx := context.Background()
	nc := connect()
	defer nc.Close()

	planner, _ := agentkit.New(nc, "planner_1", agentkit.WithType("planner"))
	planner.HandleFunc("plan_workflow", func(ctx context.Context, m *agentkit.Message) error {
		var req struct {
			CustomerID string `json:"customer_id"`
		}
		if err := m.DecodePayload(&req); err != nil {
			return agentkit.Reject(wire.CodeInvalid, err.Error())
		}
		return m.Reply(ctx, "plan_complete", map[string]any{"customer_id": req.CustomerID, "tasks": []string{"fetch", "update", "validate"}})
	})
	if err := planner.Start(ctx); err != nil {
		panic(err)
	}
	defer planner.Stop()

	orch, _ := agentkit.New(nc, "orch_1", agentkit.WithType("orchestrator"))
	if err := orch.Start(ctx); err != nil {
		panic(err)
	}
	defer orch.Stop()

	reply, err := orch.Request(ctx, "planner_1", "plan_workflow", map[string]string{"customer_id": "CUST001"},
		agentkit.WithPriority(wire.PriorityHigh), agentkit.WithWorkflowID("wf_abc"))
	if err != nil {
		panic(err)
	}
	fmt.Println(reply.Action, reply.Status, reply.WorkflowID)
	fmt.Println(string(reply.Payload))
	// Output:
	// plan_complete success wf_abc
	// {"customer_id":"CUST001","tasks":["fetch","update","validate"]}
}

// SendAndWait returns the receiver's ACK, or its NACK as an *agentkit.Error.
func ExampleAgent_SendAndWait() {
	ctx := context.Background()
	nc := connect()
	defer nc.Close()

	executor, _ := agentkit.New(nc, "executor_1")
	executor.HandleFunc("execute_operation", func(ctx context.Context, m *agentkit.Message) error {
		var op struct {
			CreditLimit int `json:"credit_limit"`
		}
		if err := m.DecodePayload(&op); err != nil || op.CreditLimit <= 0 {
			return agentkit.Reject(wire.CodeInvalid, "credit_limit must be positive")
		}
		return nil
	})
	if err := executor.Start(ctx); err != nil {
		panic(err)
	}
	defer executor.Stop()
	orch, _ := agentkit.New(nc, "orch_2")
	if err := orch.Start(ctx); err != nil {
		panic(err)
	}
	defer orch.Stop()

	ack, err := orch.SendAndWait(ctx, "executor_1", "execute_operation", map[string]int{"credit_limit": 100000})
	fmt.Println(ack.OK, err)

	ack, err = orch.SendAndWait(ctx, "executor_1", "execute_operation", map[string]int{"credit_limit": -5})
	var nack *wire.Error
	fmt.Println(ack.OK, errors.As(err, &nack), nack.Code, nack.Message)
	// Output:
	// true <nil>
	// false true INVALID credit_limit must be positive
}

// Topics reach every subscribed agent; the publisher does not hear itself.
func ExampleAgent_Publish() {
	ctx := context.Background()
	nc := connect()
	defer nc.Close()

	got := make(chan string, 2)
	for _, id := range []string{"auditor", "notifier"} {
		a, _ := agentkit.New(nc, id, agentkit.WithTopics("findings"))
		a.HandleFunc("new_finding", func(ctx context.Context, m *agentkit.Message) error {
			got <- id
			return nil
		})
		if err := a.Start(ctx); err != nil {
			panic(err)
		}
		defer a.Stop()
	}
	analyzer, _ := agentkit.New(nc, "analyzer")
	defer analyzer.Stop()
	if _, err := analyzer.Publish(ctx, "findings", "new_finding", map[string]string{"severity": "HIGH"}); err != nil {
		panic(err)
	}
	a, b := <-got, <-got
	fmt.Println(a == "auditor" && b == "notifier" || a == "notifier" && b == "auditor")
	// Output:
	// true
}

// Invalid ids never reach NATS.
func ExampleAgent_Send_invalidID() {
	nc := connect()
	defer nc.Close()
	a, _ := agentkit.New(nc, "orch_3")
	defer a.Stop()
	_, err := a.Send(context.Background(), "planner.1", "plan_workflow", nil)
	fmt.Println(errors.Is(err, agentkit.ErrInvalidID))
	fmt.Println(err)
	// Output:
	// true
	// agentkit: invalid id: subjects: invalid receiver id "planner.1": character '.' at byte 7 is not in [A-Za-z0-9_-]
}

// A Send whose publish could not be confirmed may have been stored:
// Resend sends the same envelope again under its message id, which the
// stream stores at most once, and tells whether it held it already.
func ExampleAgent_Resend() {
	ctx := context.Background()
	nc := connect()
	defer nc.Close()
	orch, _ := agentkit.New(nc, "orch_4")
	if err := orch.Start(ctx); err != nil {
		panic(err)
	}
	defer orch.Stop()

	env, err := orch.Send(ctx, "archiver_1", "archive", map[string]string{"doc": "q3.pdf"})
	if err != nil && !errors.Is(err, agentkit.ErrPublishUnconfirmed) {
		panic(err) // not stored: a resend under any id is safe
	}
	// Here the Send was confirmed; after ErrPublishUnconfirmed the resend
	// is the same, and held tells whether the first one got through.
	held, err := orch.Resend(ctx, env)
	fmt.Println(held, err)
	// Output:
	// true <nil>
}

// Middleware wraps every handler: here the outer one logs what each
// message came to and the inner one refuses senders it does not know,
// before the handler runs.
func ExampleWithMiddleware() {
	ctx := context.Background()
	nc := connect()
	defer nc.Close()

	logged := func(next agentkit.Handler) agentkit.Handler {
		return agentkit.HandlerFunc(func(ctx context.Context, m *agentkit.Message) error {
			err := next.Handle(ctx, m)
			fmt.Printf("%s from %s: %v\n", m.Action, m.SenderID, err)
			return err
		})
	}
	known := func(next agentkit.Handler) agentkit.Handler {
		return agentkit.HandlerFunc(func(ctx context.Context, m *agentkit.Message) error {
			if m.SenderID != "orch_4" {
				return agentkit.Reject(wire.CodeRejected, "unknown sender "+m.SenderID)
			}
			return next.Handle(ctx, m)
		})
	}
	worker, _ := agentkit.New(nc, "worker_4", agentkit.WithMiddleware(logged, known))
	worker.HandleFunc("work", func(context.Context, *agentkit.Message) error { return nil })
	if err := worker.Start(ctx); err != nil {
		panic(err)
	}
	defer worker.Stop()
	for _, id := range []string{"orch_4", "stranger_4"} {
		sender, _ := agentkit.New(nc, id, agentkit.WithRegistration(false))
		if err := sender.Start(ctx); err != nil {
			panic(err)
		}
		_, err := sender.SendAndWait(ctx, "worker_4", "work", nil)
		fmt.Println(id, "heard:", err)
		sender.Stop()
	}
	// Output:
	// work from orch_4: <nil>
	// orch_4 heard: <nil>
	// work from stranger_4: agentkit: REJECTED: unknown sender stranger_4
	// stranger_4 heard: agentkit: remote: REJECTED: unknown sender stranger_4
}
