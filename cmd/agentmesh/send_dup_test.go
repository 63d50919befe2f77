package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/internal/natstest"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// TestRequest_DuplicateFailsFast: request --file with a message_id the
// stream already holds fails at once, as send does, instead of waiting out
// --timeout for a response to a message the stream did not store.
func TestRequest_DuplicateFailsFast(t *testing.T) {
	t.Parallel()
	srv := natstest.RunServer(t)
	js, _ := jetstream.New(natstest.Connect(t, srv))
	if err := agentkit.EnsureStream(context.Background(), js, agentkit.StreamConfig(subjects.Default, 1)); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "env.json")
	env := agentkit.NewEnvelope(agentkit.TypeRequest, "ops", "plan_workflow")
	env.ReceiverID = "planner_1"
	data, err := env.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, data, 0o600); err != nil {
		t.Fatal(err)
	}
	url := srv.ClientURL()
	if code, out, errOut := cli(t, "send", "-s", url, "--file", file); code != exitOK {
		t.Fatalf("send --file: exit %d: %s %s", code, out, errOut)
	}
	// No planner runs: without the check, request would wait the whole
	// --timeout and report a timeout.
	code, out, errOut := cli(t, "request", "-s", url, "--file", file, "--timeout", "5s")
	if code != exitFailure || !strings.Contains(errOut, "already holds message_id "+env.MessageID) || out != "" {
		t.Fatalf("request --file of a stored message_id: exit %d %q %s", code, out, errOut)
	}
}
