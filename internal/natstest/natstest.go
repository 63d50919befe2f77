// Package natstest runs embedded NATS servers with JetStream for tests:
// a random client port, a temporary store directory, and shutdown plus
// cleanup registered on the test.
package natstest

import (
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// Option adjusts the server options before the server starts.
type Option func(*server.Options)

// nodeOptions are the options every test server starts from: JetStream on
// 127.0.0.1, a random client port, a store in tb.TempDir(), no logs and
// no signal handlers.
func nodeOptions(tb testing.TB, name string) *server.Options {
	return &server.Options{
		ServerName: name,
		Host:       "127.0.0.1",
		Port:       -1,
		JetStream:  true,
		StoreDir:   tb.TempDir(),
		NoLog:      true,
		NoSigs:     true,
	}
}

// RunServer starts a single-node JetStream server on 127.0.0.1 with a
// random port and a store in tb.TempDir(); it is shut down when the test
// ends.
func RunServer(tb testing.TB, opts ...Option) *server.Server {
	tb.Helper()
	o := nodeOptions(tb, "natstest")
	for _, opt := range opts {
		opt(o)
	}
	return Start(tb, o)
}

// Start starts a server with o and registers its shutdown on tb.
func Start(tb testing.TB, o *server.Options) *server.Server {
	tb.Helper()
	s, err := server.NewServer(o)
	if err != nil {
		tb.Fatalf("natstest: new server: %v", err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		tb.Fatalf("natstest: server not ready for connections")
	}
	tb.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	return s
}

// Connect connects to s and closes the connection when the test ends.
func Connect(tb testing.TB, s *server.Server, opts ...nats.Option) *nats.Conn {
	tb.Helper()
	nc, err := nats.Connect(s.ClientURL(), opts...)
	if err != nil {
		tb.Fatalf("natstest: connect: %v", err)
	}
	tb.Cleanup(nc.Close)
	return nc
}

// Eventually polls cond every 10ms until it holds, failing tb with what
// after d. Tests poll with it instead of sleeping.
func Eventually(tb testing.TB, d time.Duration, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
