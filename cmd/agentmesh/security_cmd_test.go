package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/auth"
	"github.com/agentmesh-io/agentmesh/internal/natstest"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// isolatedMesh runs a server with the authorization auth generates for
// orch_1 and planner_1, provisioned, with planner_1 answering plan
// requests under its own credentials. It returns the server URL and the
// directory of the seed files.
func isolatedMesh(t *testing.T) (string, string) {
	t.Helper()
	t.Setenv("NATS_URL", "")
	t.Setenv("NATS_CREDS", "")
	dir := t.TempDir()
	specs := []auth.AgentSpec{{ID: "orch_1"}, {ID: "planner_1"}}
	b, err := auth.Generate(specs, auth.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.WriteDir(dir); err != nil {
		t.Fatal(err)
	}
	srv := natstest.RunServer(t, func(o *server.Options) {
		if err := o.ProcessConfigString(b.ServerConfig()); err != nil {
			t.Fatal(err)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	admin, err := b.Admin().Credentials.Options()
	if err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(natstest.Connect(t, srv, admin...))
	if err := auth.Provision(ctx, js, subjects.Default, specs, auth.ProvisionOptions{}); err != nil {
		t.Fatal(err)
	}
	popts, err := auth.SeedFileOptions(filepath.Join(dir, "planner_1.nk"))
	if err != nil {
		t.Fatal(err)
	}
	planner, err := agentkit.New(natstest.Connect(t, srv, popts...), "planner_1",
		agentkit.WithProvisioning(false), agentkit.WithRegistration(false))
	if err != nil {
		t.Fatal(err)
	}
	planner.HandleFunc("plan", func(ctx context.Context, m *agentkit.Message) error {
		return m.Reply(ctx, "planned", map[string]string{"plan": "ok"})
	})
	if err := planner.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(planner.Stop)
	return srv.ClientURL(), dir
}

// TestSecurity_RequestWithAgentCredentials: request works with the
// credentials auth generates for the requester.
func TestSecurity_RequestWithAgentCredentials(t *testing.T) {
	url, dir := isolatedMesh(t)
	code, out, errOut := cli(t, "request", "-s", url, "--creds", filepath.Join(dir, "orch_1.nk"), "--from", "orch_1",
		"--to", "planner_1", "--action", "plan", "--timeout", "20s")
	if code != exitOK || !strings.Contains(out, `"planned"`) {
		t.Fatalf("request as orch_1: exit %d\n%s\n%s", code, out, errOut)
	}
}

// TestSecurity_TraceDenied: trace with an agent's credentials reports the
// denial at once, once.
func TestSecurity_TraceDenied(t *testing.T) {
	url, dir := isolatedMesh(t)
	start := time.Now()
	code, out, errOut := cli(t, "trace", "-s", url, "--creds", filepath.Join(dir, "orch_1.nk"), "corr_x")
	if code != exitFailure || !strings.Contains(errOut, "permission denied") || time.Since(start) > 10*time.Second {
		t.Fatalf("trace as orch_1: exit %d after %v\n%s\n%s", code, time.Since(start), out, errOut)
	}
	if n := strings.Count(errOut, "ermission"); n != 1 {
		t.Fatalf("the denial is reported %d times:\n%s", n, errOut)
	}
}

// TestSecurity_RequestAsAnotherDenied: request as an agent the credentials
// are not for fails at once with the denial, reported once.
func TestSecurity_RequestAsAnotherDenied(t *testing.T) {
	url, dir := isolatedMesh(t)
	start := time.Now()
	code, out, errOut := cli(t, "request", "-s", url, "--creds", filepath.Join(dir, "orch_1.nk"), "--from", "planner_1",
		"--to", "orch_1", "--action", "plan", "--timeout", "20s")
	if code != exitFailure || strings.Count(errOut, "ermission") != 1 || time.Since(start) > 10*time.Second {
		t.Fatalf("request as planner_1 with orch_1's credentials: exit %d after %v\n%s\n%s", code, time.Since(start), out, errOut)
	}
}

// TestSecurity_DLQDenied: dlq with an agent's credentials fails at once.
func TestSecurity_DLQDenied(t *testing.T) {
	url, dir := isolatedMesh(t)
	start := time.Now()
	code, out, errOut := cli(t, "dlq", "ls", "-s", url, "--creds", filepath.Join(dir, "orch_1.nk"))
	if code != exitFailure || strings.Count(errOut, "ermission denied") != 1 || time.Since(start) > 10*time.Second {
		t.Fatalf("dlq ls as orch_1: exit %d after %v\n%s\n%s", code, time.Since(start), out, errOut)
	}
}

// TestSecurity_AgentsWithAgentCredentials: agents with an agent's
// credentials either lists the registry (agents may read it) or fails at
// once with the denial, reported once; it never waits out its timeout.
func TestSecurity_AgentsWithAgentCredentials(t *testing.T) {
	url, dir := isolatedMesh(t)
	start := time.Now()
	code, out, errOut := cli(t, "agents", "-s", url, "--creds", filepath.Join(dir, "orch_1.nk"))
	switch {
	case code == exitOK:
	case code == exitFailure && strings.Count(errOut, "ermission denied") == 1 && time.Since(start) < 10*time.Second:
	default:
		t.Fatalf("agents as orch_1: exit %d after %v\n%s\n%s", code, time.Since(start), out, errOut)
	}
}
