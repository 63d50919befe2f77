package registry

import (
	"context"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/subjects"
)

// views shares one registry view among the agents on a connection.
// A view watches the whole bucket, so one per agent would cost the server
// a watcher per agent and deliver every heartbeat to every agent: N² with
// N agents. Per connection it is one watcher per process (or per
// connection a process opens), and every agent on it reads the same cache.
var views = struct {
	mu sync.Mutex
	m  map[viewKey]*sharedView
}{m: map[viewKey]*sharedView{}}

type viewKey struct {
	nc     *nats.Conn
	bucket string
}

// sharedView is one view and the agents holding it.
type sharedView struct {
	ready chan struct{} // closed once reg or err is set
	reg   *View
	err   error
	refs  int
}

// Acquire returns the registry view of scheme on nc, opening it (see
// [Open]) unless a holder on nc has one already, and the function that
// gives it back: the last holder to give it back closes it. A view whose
// watch has ended is not handed out again. The agents on a connection
// share their view this way; a holder does not Close it.
func Acquire(ctx context.Context, nc *nats.Conn, js jetstream.JetStream, scheme subjects.Scheme, replicas int, create bool) (*View, func(), error) {
	k := viewKey{nc, scheme.RegistryBucket()}
	views.mu.Lock()
	sr := views.m[k]
	if sr != nil && sr.reg != nil && sr.reg.Err() != nil {
		delete(views.m, k) // its holders keep it until they stop
		sr = nil
	}
	opening := sr == nil
	if opening {
		sr = &sharedView{ready: make(chan struct{})}
		views.m[k] = sr
	}
	sr.refs++
	views.mu.Unlock()

	release := sync.OnceFunc(func() {
		views.mu.Lock()
		sr.refs--
		last := sr.refs == 0
		if last && views.m[k] == sr {
			delete(views.m, k)
		}
		views.mu.Unlock()
		if last && sr.reg != nil {
			sr.reg.Close()
		}
	})
	if opening {
		reg, err := Open(ctx, js, scheme, replicas, create)
		views.mu.Lock()
		sr.reg, sr.err = reg, err
		if err != nil && views.m[k] == sr {
			delete(views.m, k) // the next agent tries again
		}
		views.mu.Unlock()
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
