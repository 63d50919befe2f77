package agentkit

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agentmesh-io/agentmesh/agentkit/registry"
)

// hostedRenewals is how many heartbeat intervals a hosted member's own
// record goes between renewals: its host's record carries its liveness
// each heartbeat (see hosting), and its own record only needs renewing so
// that one left behind by a member that could not deregister expires.
const hostedRenewals = 10

// hosting renews, for a group's members that register, one host record
// per heartbeat in place of a record per member (see [registry.Host]):
// each process writes one record a heartbeat, so every registry watching
// the bucket receives one message per process rather than per agent.
// The members' records name the group and share the host's instance id.
type hosting struct {
	instance string

	mu      sync.Mutex
	view    *registry.View
	release func()
	every   time.Duration
	members map[string]func() registry.MemberState // by agent id: the hosted members' state
	stop    chan struct{}
	wg      sync.WaitGroup
}

// hostMember adds agent id, whose state reads its status and load, to the
// group's host record. The first member opens the registry (nc and o as
// its Start does), writes the record at once, so that the member's own
// record is live from its first write, and starts the renewals every
// heartbeat of o; a later member's record is live as put after the host's
// latest renewal until the next one lists it.
func (g *Group) hostMember(ctx context.Context, nc *nats.Conn, id string, o *options, state func() registry.MemberState) error {
	h := &g.host
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.view != nil {
		h.members[id] = state
		return nil
	}
	view, release, err := registry.Acquire(ctx, nc, g.js, g.scheme, o.replicas, o.provision)
	if err != nil {
		return err
	}
	h.members = map[string]func() registry.MemberState{id: state}
	// Under mu, so that no later member's record is put before the host's.
	if err := view.RegisterHost(ctx, g.hostRecord(), 3*o.heartbeat); err != nil {
		release()
		return err
	}
	h.view, h.release, h.every, h.stop = view, release, o.heartbeat, make(chan struct{})
	h.wg.Go(g.renewHost)
	return nil
}

// unhostMember takes agent id out of the group's host record.
func (g *Group) unhostMember(id string) {
	h := &g.host
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.members, id)
}

// hostRecord returns the group's host record now. Call it with
// g.host.mu held.
func (g *Group) hostRecord() registry.Host {
	h := &g.host
	rec := registry.Host{Group: g.name, Instance: h.instance, Members: make(map[string]registry.MemberState, len(h.members)),
		LastHeartbeat: time.Now().UTC()}
	for id, state := range h.members {
		rec.Members[id] = state()
	}
	return rec
}

// writeHost renews the group's host record.
func (g *Group) writeHost(ctx context.Context) error {
	h := &g.host
	h.mu.Lock()
	view, every, rec := h.view, h.every, g.hostRecord()
	h.mu.Unlock()
	if view == nil {
		return nil // closed
	}
	return view.RegisterHost(ctx, rec, 3*every)
}

// renewHost writes the host record every heartbeat until closeHost.
func (g *Group) renewHost() {
	h := &g.host
	t := time.NewTicker(h.every)
	defer t.Stop()
	for {
		select {
		case <-h.stop:
			return
		case <-t.C:
			ctx, cancel := context.WithTimeout(context.Background(), h.every)
			if err := g.writeHost(ctx); err != nil {
				g.onError(fmt.Errorf("agentkit: group %s: heartbeat: %w", g.name, err))
			}
			cancel()
		}
	}
}

// closeHost stops renewing the host record and deletes it: members still
// registered read as gone.
func (g *Group) closeHost() {
	h := &g.host
	h.mu.Lock()
	view, release, stop := h.view, h.release, h.stop
	h.view = nil
	h.mu.Unlock()
	if view == nil {
		return
	}
	close(stop)
	h.wg.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := view.DeregisterHost(ctx, g.name, h.instance); err != nil {
		g.onError(fmt.Errorf("agentkit: group %s: %w", g.name, err))
	}
	release()
}
