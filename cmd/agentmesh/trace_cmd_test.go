package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/internal/natstest"
)

// TestTrace_Outcomes: trace ends each direct message with its outcome.
func TestTrace_Outcomes(t *testing.T) {
	srv := natstest.RunServer(t)
	t.Setenv("NATS_URL", srv.ClientURL())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	planner, _ := agentkit.New(natstest.Connect(t, srv), "planner_1")
	planner.HandleFunc("plan", func(context.Context, *agentkit.Message) error { return nil })
	if err := planner.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer planner.Stop()
	for _, to := range []string{"planner_1", "nobody_1"} {
		if code, out, errOut := cli(t, "send", "--to", to, "--action", "plan", "--correlation", "corr_out"); code != exitOK {
			t.Fatalf("send to %s: exit %d %s %s", to, code, out, errOut)
		}
	}
	var out string
	natstest.WaitFor(t, 10*time.Second, func() error {
		_, out, _ = cli(t, "trace", "corr_out")
		if !strings.Contains(out, "cli → planner_1  notification plan [normal]") || !strings.Contains(out, "→ settled (acked, or exhausted") {
			return errMsg(out)
		}
		return nil
	})
	if !strings.Contains(out, "cli → nobody_1  notification plan [normal]") || !strings.Contains(out, "→ no consumer") {
		t.Fatalf("trace:\n%s", out)
	}
	code, js, errOut := cli(t, "trace", "--json", "corr_out")
	if code != exitOK || !strings.Contains(js, `"outcome": "no consumer`) {
		t.Fatalf("trace --json: exit %d %s %s", code, js, errOut)
	}
}
