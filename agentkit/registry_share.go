package agentkit

import (
	"context"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/subjects"
)

// registries shares one registry view among the agents on a connection.
// A view watches the whole bucket, so one per agent would cost the server
// a watcher per agent and deliver every heartbeat to every agent: N² with
// N agents. Per connection it is one watcher per process (or per
// connection a process opens), and every agent on it reads the same cache.
var registries = struct {
	mu sync.Mutex
	m  map[registryKey]*sharedRegistry
}{m: map[registryKey]*sharedRegistry{}}

type registryKey struct {
	nc     *nats.Conn
	bucket string
}

// sharedRegistry is one view and the agents holding it.
type sharedRegistry struct {
	ready chan struct{} // closed once reg or err is set
	reg   *Registry
	err   error
	refs  int
}

// acquireRegistry returns the registry view of scheme on nc, opening it
// (see OpenRegistry) unless an agent on nc holds one already, and the
// function that gives it back: the last agent to give it back closes it.
// A view whose watch has ended is not handed out again.
func acquireRegistry(ctx context.Context, nc *nats.Conn, js jetstream.JetStream, scheme subjects.Scheme, replicas int, create bool) (*Registry, func(), error) {
	k := registryKey{nc, scheme.RegistryBucket()}
	registries.mu.Lock()
	sr := registries.m[k]
	if sr != nil && sr.reg != nil && sr.reg.Err() != nil {
		delete(registries.m, k) // its holders keep it until they stop
		sr = nil
	}
	opening := sr == nil
	if opening {
		sr = &sharedRegistry{ready: make(chan struct{})}
		registries.m[k] = sr
	}
	sr.refs++
	registries.mu.Unlock()

	release := sync.OnceFunc(func() {
		registries.mu.Lock()
		sr.refs--
		last := sr.refs == 0
		if last && registries.m[k] == sr {
			delete(registries.m, k)
		}
		registries.mu.Unlock()
		if last && sr.reg != nil {
			sr.reg.Close()
		}
	})
	if opening {
		reg, err := OpenRegistry(ctx, js, scheme, replicas, create)
		registries.mu.Lock()
		sr.reg, sr.err = reg, err
		if err != nil && registries.m[k] == sr {
			delete(registries.m, k) // the next agent tries again
		}
		registries.mu.Unlock()
		close(sr.ready)
	} else {
		select {
		case <-sr.ready:
		case <-ctx.Done():
			release()
			return nil, nil, ctx.Err()
		}
	}
	if sr.err != nil {
		release()
		return nil, nil, sr.err
	}
	return sr.reg, release, nil
}
