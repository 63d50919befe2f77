package auth_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/auth"
	"github.com/agentmesh-io/agentmesh/internal/natstest"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// withAuth applies b's authorization to an embedded server's options.
func withAuth(tb testing.TB, b *auth.Bundle) natstest.Option {
	return func(o *server.Options) {
		if err := o.ProcessConfigString(b.ServerConfig()); err != nil {
			tb.Fatalf("server config: %v\n%s", err, b.ServerConfig())
		}
	}
}

// generate returns a bundle for specs or fails the test.
func generate(tb testing.TB, specs []auth.AgentSpec, opts auth.Options) *auth.Bundle {
	tb.Helper()
	b, err := auth.Generate(specs, opts)
	if err != nil {
		tb.Fatalf("Generate: %v", err)
	}
	return b
}

// conn connects to s as user name of b, with a Watcher for its violations.
func conn(tb testing.TB, s *server.Server, b *auth.Bundle, name string, extra ...nats.Option) (*nats.Conn, *auth.Watcher) {
	tb.Helper()
	u, ok := b.User(name)
	if !ok {
		tb.Fatalf("no user %q", name)
	}
	opts, err := u.Credentials.Options()
	if err != nil {
		tb.Fatalf("Options: %v", err)
	}
	w := auth.NewWatcher(nil)
	opts = append(opts, w.Option())
	opts = append(opts, extra...)
	return natstest.Connect(tb, s, opts...), w
}

// provision creates the stream and every agent's consumers as the admin.
func provision(tb testing.TB, s *server.Server, b *auth.Bundle, po auth.ProvisionOptions, extra ...nats.Option) {
	tb.Helper()
	nc, _ := conn(tb, s, b, b.Admin().Name, extra...)
	js, err := jetstream.New(nc)
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := auth.Provision(ctx, js, b.Options.Scheme, b.Specs(), po); err != nil {
		tb.Fatalf("Provision: %v", err)
	}
}

// adminJS returns a JetStream context of the admin.
func adminJS(tb testing.TB, s *server.Server, b *auth.Bundle) jetstream.JetStream {
	tb.Helper()
	nc, _ := conn(tb, s, b, b.Admin().Name)
	js, err := jetstream.New(nc)
	if err != nil {
		tb.Fatal(err)
	}
	return js
}

// isolatedAgent returns an agent bound to pre-created consumers, without
// registration, that is stopped when the test ends.
func isolatedAgent(tb testing.TB, nc *nats.Conn, id string, opts ...agentkit.Option) *agentkit.Agent {
	tb.Helper()
	opts = append([]agentkit.Option{agentkit.WithProvisioning(false), agentkit.WithRegistration(false)}, opts...)
	a, err := agentkit.New(nc, id, opts...)
	if err != nil {
		tb.Fatalf("agentkit.New(%q): %v", id, err)
	}
	tb.Cleanup(a.Stop)
	return a
}

// pending returns the messages waiting on consumer name of MESH.
func pending(tb testing.TB, js jetstream.JetStream, name string) uint64 {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := js.Consumer(ctx, subjects.Default.Stream(), name)
	if err != nil {
		tb.Fatalf("consumer %s: %v", name, err)
	}
	info, err := c.Info(ctx)
	if err != nil {
		tb.Fatalf("consumer %s info: %v", name, err)
	}
	return info.NumPending + uint64(info.NumAckPending)
}
