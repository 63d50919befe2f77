package main

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/auth"
	"github.com/agentmesh-io/agentmesh/config"
	"github.com/agentmesh-io/agentmesh/internal/natstest"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// The binary wires flags to a running monitor, serves HTTP, and shuts
// down cleanly on SIGINT.
func TestRun_FlagsServeAndSignal(t *testing.T) {
	s := natstest.RunServer(t)
	data := filepath.Join(t.TempDir(), "not", "yet") // -data is a directory, created if needed
	t.Setenv("AGENTMESH_NATS_URLS", s.ClientURL())
	addr, done := serve(t, func(addr string) []string {
		return []string{"-data", data, "-http", addr, "-log-level", "error", "-pinned-ttl", "1s"}
	}, os.Stderr)
	health := waitHealthy(t, addr, done)
	if health["status"] != "ok" || health["monitor"] != "ackmonitor" {
		t.Fatalf("healthz = %v", health)
	}
	if m, _ := filepath.Glob(filepath.Join(data, "ackmonitor.db")); len(m) == 0 {
		t.Fatal("no SQLite ledger in the data directory")
	}
	stop(t, done)
}

func TestRun_BadFlags(t *testing.T) {
	if err := run([]string{"-log-level", "loud"}); err == nil {
		t.Fatal("bad log level accepted")
	}
	if err := run([]string{"-prefix", "Bad.Prefix"}); err == nil {
		t.Fatal("bad prefix accepted")
	}
}

// serve runs the monitor with args(addr), logging to stderr, on an HTTP
// address of its own, and returns the address once /healthz answers, with
// the channel run's outcome arrives on. freeAddr closes the port it found
// before run listens on it, so another process may take it meanwhile: run
// then fails with EADDRINUSE, and serve tries another address.
func serve(t *testing.T, args func(addr string) []string, stderr io.Writer) (string, <-chan error) {
	t.Helper()
	for attempt := 1; ; attempt++ {
		addr := freeAddr(t)
		done := make(chan error, 1)
		go func() { done <- runTo(args(addr), io.Discard, stderr) }()
		_, err := awaitHealth(addr, done, func(map[string]any) bool { return true })
		if err == nil {
			return addr, done
		}
		if !errors.Is(err, syscall.EADDRINUSE) || attempt == 3 {
			t.Fatalf("monitor on %s: %v", addr, err)
		}
		t.Logf("monitor on %s: %v; trying another address", addr, err)
	}
}

// awaitHealth polls /healthz on addr until its answer satisfies ok and
// returns it; it returns why not if run returns first (on done) or 30
// seconds pass.
func awaitHealth(addr string, done <-chan error, ok func(map[string]any) bool) (map[string]any, error) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		if health := getHealth(addr); health != nil && ok(health) {
			return health, nil
		}
		select {
		case err := <-done:
			return nil, fmt.Errorf("run returned before serving: %w", cmp.Or(err, errors.New("no error")))
		default:
		}
		if time.Now().After(deadline) {
			return nil, errors.New("healthz never answered as wanted")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// freeAddr returns a free 127.0.0.1 address.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// waitHealthy polls /healthz on addr until the monitor is ready and
// returns its answer; it fails if run returns first (on done).
func waitHealthy(t *testing.T, addr string, done <-chan error) map[string]any {
	t.Helper()
	health, err := awaitHealth(addr, done, func(h map[string]any) bool { return h["ready"] == true })
	if err != nil {
		t.Fatalf("monitor on %s not ready: %v", addr, err)
	}
	return health
}

// stop interrupts run like Ctrl-C and waits for it to return nil.
func stop(t *testing.T, done <-chan error) {
	t.Helper()
	if err := syscall.Kill(syscall.Getpid(), syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("run did not stop on SIGINT")
	}
}

// The monitor connects with the seed file agentmesh auth generated for
// it, on a server with the generated authorization: its requests must use
// its private inbox.
func TestRun_GeneratedCredentials(t *testing.T) {
	b, err := auth.Generate([]auth.AgentSpec{{ID: "orch_1"}}, auth.Options{})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := b.WriteDir(dir); err != nil {
		t.Fatal(err)
	}
	s := natstest.RunServer(t, func(o *server.Options) {
		if err := o.ProcessConfigString(b.ServerConfig()); err != nil {
			t.Fatal(err)
		}
	})
	opts, err := b.Admin().Credentials.Options()
	if err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(natstest.Connect(t, s, opts...))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := auth.Provision(ctx, js, subjects.Default, b.Specs(), auth.ProvisionOptions{}); err != nil {
		t.Fatal(err)
	}
	data := t.TempDir()
	addr, done := serve(t, func(addr string) []string {
		return []string{"-nats", s.ClientURL(), "-creds", filepath.Join(dir, "ackmonitor.nk"),
			"-data", data, "-http", addr, "-log-level", "error"}
	}, os.Stderr)
	waitHealthy(t, addr, done)
	stop(t, done)
}

func TestExitCode(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want int
	}{
		{[]string{"-help"}, 0},
		{[]string{"-h"}, 0},
		{[]string{"-nope"}, 2},
		{[]string{"-replicas", "x"}, 2},
		{[]string{"-log-level", "loud"}, 2},
		{[]string{"-prefix", "Bad.Prefix"}, 2},
		{[]string{"stray"}, 2},
	} {
		var stderr bytes.Buffer
		if got := exitCode(run(tt.args), &stderr); got != tt.want {
			t.Errorf("%v: exit %d (%s), want %d", tt.args, got, stderr.String(), tt.want)
		}
	}
}

// A flag overrides an invalid value of the environment: the configuration
// is validated once, after the flags.
func TestConfigure_FlagOverridesInvalidEnv(t *testing.T) {
	t.Setenv("AGENTMESH_NATS_URLS", "bogus")
	t.Setenv("AGENTMESH_MONITOR_LOG_LEVEL", "loud")
	cfg, err := configure([]string{"-nats", "nats://127.0.0.1:1", "-log-level", "warn"})
	if err != nil {
		t.Fatalf("configure: %v", err)
	}
	if cfg.NATS.URLs[0] != "nats://127.0.0.1:1" || cfg.Monitor.LogLevel != "warn" {
		t.Fatalf("flags not applied: %v %q", cfg.NATS.URLs, cfg.Monitor.LogLevel)
	}
	if _, err := configure(nil); !errors.Is(err, config.ErrInvalid) {
		t.Fatalf("invalid environment without the flags: %v", err)
	}
}
