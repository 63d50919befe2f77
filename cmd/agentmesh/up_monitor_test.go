package main

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentmesh-io/agentmesh/internal/natstest"
)

// An explicitly set monitor.http_addr that is taken is an error naming it,
// for up and demo alike, not a dashboard moved elsewhere unannounced.
func TestMonitorHTTPAddr_ExplicitTaken(t *testing.T) {
	t.Setenv("NATS_URL", "")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	t.Setenv("AGENTMESH_MONITOR_HTTP_ADDR", l.Addr().String())
	for _, args := range [][]string{
		{"up", "--data", t.TempDir(), "--listen", "127.0.0.1:0"},
		{"demo"},
	} {
		code, _, errOut := cli(t, args...)
		if code != exitFailure || !strings.Contains(errOut, "monitor.http_addr "+l.Addr().String()) || !strings.Contains(errOut, "address taken") {
			t.Errorf("%v: exit %d, stderr %q", args[0], code, errOut)
		}
	}
}

// The default monitor.http_addr, when taken, falls back to a free port:
// up says so, and stats finds the dashboard through the data directory.
func TestMonitorHTTPAddr_DefaultFallsBack(t *testing.T) {
	t.Setenv("NATS_URL", "")
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	def := held.Addr().String()
	restore := defaultHTTPAddr
	defaultHTTPAddr = func() string { return def }
	t.Cleanup(func() { defaultHTTPAddr = restore })
	t.Setenv("AGENTMESH_MONITOR_HTTP_ADDR", def)
	dir := t.TempDir()
	t.Setenv("AGENTMESH_DEV_DATA_DIR", dir)
	var out, errOut natstest.SyncBuffer
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan int, 1)
	go func() { done <- run(ctx, []string{"up", "--listen", "127.0.0.1:0"}, &out, &errOut) }()
	natstest.WaitFor(t, 30*time.Second, func() error {
		if !strings.Contains(out.String(), "export NATS_URL=") {
			return errMsg("not up yet: " + out.String() + errOut.String())
		}
		return nil
	})
	if !strings.Contains(out.String(), "monitor.http_addr "+def+" is taken") || !strings.Contains(out.String(), "--monitor http://127.0.0.1:") {
		t.Errorf("up does not say where the dashboard went:\n%s", out.String())
	}
	if code, sout, serr := cli(t, "stats"); code != exitOK || !strings.Contains(sout, "(mesh)") {
		t.Errorf("stats did not find up's monitor: exit %d\n%s\n%s", code, sout, serr)
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
	if _, err := os.Stat(filepath.Join(dir, monitorURLFile)); !os.IsNotExist(err) {
		t.Errorf("%s left behind: %v", monitorURLFile, err)
	}
}
