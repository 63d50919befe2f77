package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/internal/natstest"
)

// TestSend_UnknownReceiverAndType: a message to an agent with no consumer
// and no registry entry is stored with a warning; one to a known agent has
// none; send sends a notification unless told otherwise.
func TestSend_UnknownReceiverAndType(t *testing.T) {
	srv := natstest.RunServer(t)
	t.Setenv("NATS_URL", srv.ClientURL())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	planner, err := agentkit.New(natstest.Connect(t, srv), "planner_1")
	if err != nil {
		t.Fatal(err)
	}
	planner.HandleFunc("plan", func(context.Context, *agentkit.Message) error { return nil })
	if err := planner.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer planner.Stop()

	code, out, errOut := cli(t, "send", "--to", "planner_1", "--action", "plan")
	if code != exitOK || !strings.Contains(out, "sent notification plan to planner_1") || strings.Contains(errOut, "warning") {
		t.Fatalf("send to planner_1: exit %d %q %q", code, out, errOut)
	}
	code, out, errOut = cli(t, "send", "--to", "planner_1", "--action", "plan", "--type", "request")
	if code != exitOK || !strings.Contains(out, "sent request plan") {
		t.Fatalf("send --type request: exit %d %q %q", code, out, errOut)
	}
	code, out, errOut = cli(t, "send", "--to", "planer_1", "--action", "plan")
	if code != exitOK || !strings.Contains(out, "message_id=") || !strings.Contains(errOut, `warning: no agent "planer_1"`) {
		t.Fatalf("send to an unknown agent: exit %d %q %q; want exit 0 and a warning", code, out, errOut)
	}
	code, _, errOut = cli(t, "request", "--to", "planer_1", "--action", "plan", "--timeout", "1s")
	if code != exitFailure || !strings.Contains(errOut, `warning: no agent "planer_1"`) {
		t.Fatalf("request to an unknown agent: exit %d %q", code, errOut)
	}
}
