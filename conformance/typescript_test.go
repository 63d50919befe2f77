package conformance_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentmesh-io/agentmesh/conformance"
	"github.com/agentmesh-io/agentmesh/internal/natstest"
)

// TestTypeScriptAgent runs the kit against the TypeScript reference agent
// (examples/ts-agent) on an embedded server. It needs Node.js; it skips
// without it, except in CI (CI=true), where it installs the agent's
// packages from its package-lock.json.
func TestTypeScriptAgent(t *testing.T) {
	t.Parallel()
	inCI := os.Getenv("CI") == "true"
	need := func(tool string) string {
		p, err := exec.LookPath(tool)
		if err != nil {
			if inCI {
				t.Fatalf("%s is required in CI: %v", tool, err)
			}
			t.Skipf("%s not installed", tool)
		}
		return p
	}
	node := need("node")
	npm := need("npm")
	dir := filepath.Join("..", "examples", "ts-agent")
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "@nats-io", "jetstream")); err != nil {
		cmd := exec.CommandContext(ctx, npm, "ci", "--no-audit", "--no-fund")
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("npm ci in %s: %v\n%s", dir, err, out)
		}
	}
	build := exec.CommandContext(ctx, npm, "run", "--silent", "build")
	build.Dir = dir
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("npm run build in %s: %v\n%s", dir, err, out)
	}

	srv := natstest.RunServer(t)
	const id = "conformance_ts"
	var output natstest.SyncBuffer
	agent := exec.Command(node, filepath.Join("dist", "agent.js"))
	agent.Dir = dir
	agent.Env = append(os.Environ(), "NATS_URL="+srv.ClientURL(), "AGENT_ID="+id, "HEARTBEAT_MS=1000")
	agent.Stdout, agent.Stderr = &output, &output
	if err := agent.Start(); err != nil {
		t.Fatalf("start the agent: %v", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- agent.Wait() }()
	// Registered after the server's shutdown, so it runs first: the agent
	// stops cleanly (SIGTERM) while the server is up, or is killed.
	t.Cleanup(func() {
		_ = agent.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			_ = agent.Process.Kill()
			<-exited
			t.Errorf("the agent did not stop within 5s of SIGTERM")
		}
		if t.Failed() {
			t.Logf("agent output:\n%s", output.String())
		}
	})

	// The agent says "ready" once it consumes; if it dies first, say so now
	// rather than after the kit's start timeout.
	started := time.Now()
	for !strings.Contains(output.String(), ": ready") {
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("the agent exited before it was ready: %v", err)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Since(started) > time.Minute {
			t.Fatalf("the agent was not ready within a minute")
		}
	}
	conformance.Run(t, conformance.Config{
		Conn: natstest.Connect(t, srv), AgentID: id, StartTimeout: time.Minute, HeartbeatTimeout: 5 * time.Second,
	})
}
