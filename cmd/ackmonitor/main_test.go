package main

import (
	"encoding/json"
	"net"
	"net/http"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/agentmesh-io/agentmesh/internal/natstest"
)

// The binary wires flags to a running monitor, serves HTTP, and shuts
// down cleanly on SIGINT.
func TestRun_FlagsServeAndSignal(t *testing.T) {
	s := natstest.RunServer(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	data := t.TempDir()
	t.Setenv("AGENTMESH_NATS_URLS", s.ClientURL())
	done := make(chan error, 1)
	go func() {
		done <- run([]string{"-data", data, "-http", addr, "-log-level", "error", "-pinned-ttl", "1s"})
	}()
	deadline := time.Now().Add(30 * time.Second)
	var health map[string]any
	for {
		res, err := http.Get("http://" + addr + "/healthz")
		if err == nil {
			err = json.NewDecoder(res.Body).Decode(&health)
			res.Body.Close()
			if err == nil && health["ready"] == true {
				break
			}
		}
		select {
		case err := <-done:
			t.Fatalf("run returned early: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("healthz never answered: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if health["status"] != "ok" || health["monitor"] != "ackmonitor" {
		t.Fatalf("healthz = %v", health)
	}
	if m, _ := filepath.Glob(filepath.Join(data, "ackmonitor.db*")); len(m) == 0 {
		t.Fatal("no SQLite ledger in the data directory")
	}
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

func TestRun_BadFlags(t *testing.T) {
	if err := run([]string{"-log-level", "loud"}); err == nil {
		t.Fatal("bad log level accepted")
	}
	if err := run([]string{"-prefix", "Bad.Prefix"}); err == nil {
		t.Fatal("bad prefix accepted")
	}
}
