package state_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/agentmesh-io/agentmesh/internal/natstest"
)

// mesh is one embedded JetStream server of a test.
type mesh struct {
	t *testing.T
	s *server.Server
}

func newMesh(t *testing.T) *mesh {
	t.Helper()
	return &mesh{t: t, s: natstest.RunServer(t)}
}

// conn opens a new connection to m's server, closed at the test's end.
func (m *mesh) conn() *nats.Conn { return natstest.Connect(m.t, m.s) }

// ctx returns a context that ends with the test, or after 30s.
func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

var eventually = natstest.Eventually
