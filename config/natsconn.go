package config

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/auth"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// Options returns the nats.go options of n: credentials (creds file, nkey
// seed or user/password), TLS, connection name, timeouts and reconnection.
//
// A seed file given as creds (the <user>.nk files of agentmesh auth) is
// used as nkey_seed. A seed file written by auth.Bundle.WriteDir also sets
// its user's private inbox prefix, the only inbox the user may subscribe to.
func (n NATS) Options() ([]nats.Option, error) {
	opts := []nats.Option{
		nats.Name(n.Name),
		nats.Timeout(n.ConnectTimeout),
		nats.ReconnectWait(n.ReconnectWait),
		nats.MaxReconnects(n.MaxReconnects),
	}
	switch {
	case n.Creds != "":
		data, err := os.ReadFile(n.Creds)
		if err != nil {
			return nil, fmt.Errorf("config: nats.creds: %w", err)
		}
		seed := auth.IsSeedFile(data)
		clear(data)
		if !seed {
			opts = append(opts, nats.UserCredentials(n.Creds))
			break
		}
		o, err := auth.SeedFileOptions(n.Creds)
		if err != nil {
			return nil, fmt.Errorf("config: nats.creds %q: %w", n.Creds, err)
		}
		opts = append(opts, o...)
	case n.NKeySeed != "":
		o, err := auth.SeedFileOptions(n.NKeySeed)
		if err != nil {
			return nil, fmt.Errorf("config: nats.nkey_seed %q: %w", n.NKeySeed, err)
		}
		opts = append(opts, o...)
	case n.User != "":
		opts = append(opts, nats.UserInfo(n.User, n.Password))
	}
	if n.TLS.CA != "" {
		opts = append(opts, nats.RootCAs(n.TLS.CA))
	}
	if n.TLS.Cert != "" {
		opts = append(opts, nats.ClientCert(n.TLS.Cert, n.TLS.Key))
	}
	return opts, nil
}

// Connect dials the servers of n with [NATS.Options] plus extra (later
// options win). ctx's deadline, when sooner, bounds the connection attempt.
// The caller owns the connection and closes (or drains) it.
func (n NATS) Connect(ctx context.Context, extra ...nats.Option) (*nats.Conn, error) {
	opts, err := n.Options()
	if err != nil {
		return nil, err
	}
	if dl, ok := ctx.Deadline(); ok {
		if d := time.Until(dl); d < n.ConnectTimeout {
			opts = append(opts, nats.Timeout(max(d, time.Millisecond)))
		}
	}
	opts = append(opts, extra...)
	if err := ctx.Err(); err != nil {
		return nil, &ConnectError{URLs: strings.Join(n.URLs, ","), Err: err}
	}
	nc, err := nats.Connect(strings.Join(n.URLs, ","), opts...)
	if err != nil {
		return nil, &ConnectError{URLs: strings.Join(n.URLs, ","), Err: err}
	}
	return nc, nil
}

// ConnectError is a failure to reach the NATS servers: none answered, or
// one refused the connection (credentials, TLS). It is not a configuration
// error, so it carries no "config:" prefix.
type ConnectError struct {
	URLs string // the servers dialled, comma separated
	Err  error  // why, from nats.go
}

func (e *ConnectError) Error() string {
	return fmt.Sprintf("cannot connect to nats at %s: %v", e.URLs, e.Err)
}

func (e *ConnectError) Unwrap() error { return e.Err }

// Scheme returns the naming scheme of the mesh prefix.
func (c *Config) Scheme() (subjects.Scheme, error) {
	s, err := subjects.New(c.Mesh.Prefix)
	if err != nil {
		return subjects.Scheme{}, &FieldError{Field: "mesh.prefix", Value: c.Mesh.Prefix, Reason: err.Error()}
	}
	return s, nil
}

// AgentOptions returns the agentkit options the mesh and agent sections
// describe: scheme, replicas, the five delivery policies, concurrency and
// timeouts, and the consumers' ack sampling for the ack monitor
// (monitor.sample_frequency). Append agent-specific options (WithType,
// ...) after them.
func (c *Config) AgentOptions() ([]agentkit.Option, error) {
	s, err := c.Scheme()
	if err != nil {
		return nil, err
	}
	opts := []agentkit.Option{
		agentkit.WithScheme(s),
		agentkit.WithReplicas(c.Mesh.Replicas),
		agentkit.WithConcurrency(c.Agent.Concurrency),
		agentkit.WithRequestTimeout(c.Agent.RequestTimeout),
		agentkit.WithPublishTimeout(c.Agent.PublishTimeout),
		agentkit.WithSampleFrequency(strconv.Itoa(c.Monitor.SampleFrequency)),
	}
	for _, p := range wire.Priorities {
		opts = append(opts, agentkit.WithPolicy(p, c.Agent.Policy(p)))
	}
	return opts, nil
}
