// Package natstest runs embedded NATS servers with JetStream for tests:
// a random client port, a temporary store directory, and shutdown plus
// cleanup registered on the test.
package natstest

import (
	"errors"
	"fmt"
	"strings"
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

// startTimeout bounds how long a server may take to listen.
const startTimeout = 30 * time.Second

// ErrPortTaken reports that a server could not listen on a port it was
// given: another process took it after [ReservePorts] released it.
var ErrPortTaken = errors.New("natstest: port taken")

// Start starts a server with o and registers its shutdown on tb.
func Start(tb testing.TB, o *server.Options) *server.Server {
	tb.Helper()
	s, err := start(o)
	if err != nil {
		tb.Fatalf("natstest: %v", err)
	}
	tb.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	return s
}

// start starts a server with o and waits until it listens. A server that
// cannot listen logs a fatal line and would never become ready, so start
// watches the log and returns that line (as [ErrPortTaken] when the
// address was in use) instead of waiting out the timeout.
func start(o *server.Options) (*server.Server, error) {
	s, err := server.NewServer(o)
	if err != nil {
		return nil, fmt.Errorf("new server: %w", err)
	}
	fatal := &fatalLog{lines: make(chan string, 1)}
	s.SetLogger(fatal, false, false)
	go s.Start()
	deadline := time.Now().Add(startTimeout)
	for !s.ReadyForConnections(50 * time.Millisecond) {
		select {
		case line := <-fatal.lines:
			s.Shutdown()
			s.WaitForShutdown()
			if strings.Contains(line, "address already in use") {
				return nil, fmt.Errorf("%w: %s: %s", ErrPortTaken, o.ServerName, line)
			}
			return nil, fmt.Errorf("%s: %s", o.ServerName, line)
		default:
		}
		if time.Now().After(deadline) {
			s.Shutdown()
			s.WaitForShutdown()
			return nil, fmt.Errorf("%s: not ready for connections after %v", o.ServerName, startTimeout)
		}
	}
	return s, nil
}

// fatalLog is a server logger that keeps the first fatal line and
// discards the rest, as NoLog would.
type fatalLog struct{ lines chan string }

func (l *fatalLog) Fatalf(format string, v ...any) {
	select {
	case l.lines <- fmt.Sprintf(format, v...):
	default:
	}
}

func (*fatalLog) Noticef(string, ...any) {}
func (*fatalLog) Warnf(string, ...any)   {}
func (*fatalLog) Errorf(string, ...any)  {}
func (*fatalLog) Debugf(string, ...any)  {}
func (*fatalLog) Tracef(string, ...any)  {}

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
