package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/agentmesh-io/agentmesh/internal/natstest"
)

// A second up on the data directory of a running one fails at once,
// naming the first; once the first stopped, the directory is free again.
func TestUp_DataDirLocked(t *testing.T) {
	t.Setenv("NATS_URL", "")
	t.Setenv("AGENTMESH_MONITOR_HTTP_ADDR", "127.0.0.1:0")
	dir := t.TempDir()
	var out, errOut natstest.SyncBuffer
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan int, 1)
	go func() { done <- run(ctx, []string{"up", "--data", dir, "--listen", "127.0.0.1:0"}, &out, &errOut) }()
	natstest.WaitFor(t, 30*time.Second, func() error {
		if !strings.Contains(out.String(), "export NATS_URL=") {
			return errMsg("not up yet: " + out.String() + errOut.String())
		}
		return nil
	})
	code, _, stderr := cli(t, "up", "--data", dir, "--listen", "127.0.0.1:0")
	if code != exitFailure || !strings.Contains(stderr, dir+" is used by another agentmesh up") || !strings.Contains(stderr, fmt.Sprintf("pid %d", os.Getpid())) {
		t.Errorf("second up: exit %d, stderr %q", code, stderr)
	}
	cancel()
	select {
	case code := <-done:
		if code != exitOK {
			t.Fatalf("up exited %d: %s", code, errOut.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("up did not stop")
	}
	release, err := lockDataDir(dir)
	if err != nil {
		t.Fatalf("data directory still locked after up stopped: %v", err)
	}
	release()
}
