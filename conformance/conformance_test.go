package conformance_test

import (
	"context"
	"flag"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/conformance"
	"github.com/agentmesh-io/agentmesh/internal/natstest"
)

// Flags of TestAgent, which checks a running agent:
//
//	go test -modfile=go_test.mod ./conformance -run 'TestAgent$' -args -nats=nats://127.0.0.1:4222 -agent=planner_1
var (
	flagNATS      = flag.String("nats", nats.DefaultURL, "NATS URL of the mesh (TestAgent)")
	flagAgent     = flag.String("agent", "", "id of the running agent to check (TestAgent); empty skips TestAgent")
	flagCreds     = flag.String("creds", "", "NATS credentials file for the kit's connection (TestAgent)")
	flagPrefix    = flag.String("prefix", "mesh", "the mesh's subject prefix (TestAgent)")
	flagTimeout   = flag.Duration("timeout-answer", 10*time.Second, "how long to wait for each answer (TestAgent)")
	flagHeartbeat = flag.Duration("timeout-heartbeat", 20*time.Second, "how long to wait for a registry renewal (TestAgent)")
)

// TestAgent runs the kit against a running agent named by -agent.
func TestAgent(t *testing.T) {
	if *flagAgent == "" {
		t.Skip("no agent to check: go test ./conformance -run 'TestAgent$' -args -nats=URL -agent=ID")
	}
	var opts []nats.Option
	if *flagCreds != "" {
		opts = append(opts, nats.UserCredentials(*flagCreds))
	}
	conformance.Run(t, conformance.Config{
		URL: *flagNATS, Options: opts, AgentID: *flagAgent, Prefix: *flagPrefix,
		Timeout: *flagTimeout, HeartbeatTimeout: *flagHeartbeat,
	})
}

// TestAgentkit runs the kit against an agentkit agent implementing the
// test actions, on an embedded server.
func TestAgentkit(t *testing.T) {
	t.Parallel()
	srv := natstest.RunServer(t)
	a, err := agentkit.New(natstest.Connect(t, srv), "conformance_agentkit", agentkit.WithHeartbeat(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Handle(conformance.ActionEcho, agentkit.HandlerFunc(echo)); err != nil {
		t.Fatal(err)
	}
	if err := a.Handle(conformance.ActionReject, agentkit.HandlerFunc(reject)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := a.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Stop)
	conformance.Run(t, conformance.Config{
		Conn: natstest.Connect(t, srv), AgentID: "conformance_agentkit", HeartbeatTimeout: 5 * time.Second,
	})
}

// echo answers a request with its own payload.
func echo(ctx context.Context, m *agentkit.Message) error {
	if m.MessageType != wire.TypeRequest {
		return nil
	}
	return m.Reply(ctx, conformance.ActionEcho, m.Payload)
}

// reject rejects with the code and message of the payload.
func reject(_ context.Context, m *agentkit.Message) error {
	var p struct {
		Code    wire.ErrorCode `json:"code"`
		Message string         `json:"message"`
	}
	if err := m.DecodePayload(&p); err != nil {
		return agentkit.Reject(wire.CodeInvalid, err.Error())
	}
	return agentkit.Reject(p.Code, p.Message)
}
