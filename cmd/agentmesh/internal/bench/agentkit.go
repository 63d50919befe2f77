package bench

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// akMesh is a run's agents: receivers (started) and one sender, and the
// receivers' group if they share one.
type akMesh struct {
	scheme subjects.Scheme
	agents []*agentkit.Agent
	group  *agentkit.Group
	close  func()
}

// newAgent creates an agent on its own connection in the run's scheme.
//
// The agents do not register: the registry is control plane, off the
// message path measured here, and every registered agent watches the whole
// registry, so N agents in one process handle N² heartbeat updates. That
// work grows with the square of the agent count and competes with the
// measurement (raw and Watermill carry nothing like it); on a busy machine
// it stretches the 100-agents setup without bound. Unregistered agents also
// leave no registry bucket behind on an --external server.
func (k *akMesh) newAgent(nc *nats.Conn, id string, opts ...agentkit.Option) (*agentkit.Agent, error) {
	a, err := agentkit.New(nc, id, append([]agentkit.Option{agentkit.WithScheme(k.scheme), agentkit.WithRegistration(false)}, opts...)...)
	if err != nil {
		return nil, err
	}
	k.agents = append(k.agents, a)
	return a, nil
}

func (k *akMesh) stop() {
	for _, a := range k.agents {
		a.Stop()
	}
	if k.group != nil {
		k.group.Close() // after its agents: their inboxes are theirs to give back
	}
	k.close()
}

// newAkMesh opens n connections and creates the run's message stream
// (through createStream, so the agents' Start finds it and creates none).
func newAkMesh(ctx context.Context, env *runEnv, n int) (*akMesh, []*nats.Conn, error) {
	scheme, err := subjects.New(env.id)
	if err != nil {
		return nil, nil, err
	}
	cs, closeAll, err := conns(env.cfg.URL, n)
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(cs[0])
	if err == nil {
		_, err = createStream(ctx, js, agentkit.StreamConfig(scheme, 1))
	}
	if err != nil {
		closeAll()
		return nil, nil, err
	}
	k := &akMesh{scheme: scheme, close: func() {
		deleteStream(js, scheme.Stream())
		closeAll()
	}}
	return k, cs, nil
}

// agentkitThroughput sends the run's messages round robin to receivers
// agents, each on its own connection, or with group all in one
// agentkit.Group on one connection, as one process hosting them would.
func agentkitThroughput(ctx context.Context, env *runEnv, receivers int, batch, group bool) (*measurement, error) {
	conns := receivers + 1
	if group {
		conns = 2
	}
	k, cs, err := newAkMesh(ctx, env, conns)
	if err != nil {
		return nil, err
	}
	defer k.stop()
	var opts []agentkit.Option
	if group {
		if k.group, err = agentkit.NewGroup(cs[1], env.id, agentkit.WithGroupScheme(k.scheme)); err != nil {
			return nil, err
		}
		opts = append(opts, agentkit.WithGroup(k.group), agentkit.WithFanoutActions())
	}
	m := newMeasurement(env.cfg.Messages)
	ids := make([]string, receivers)
	for i := range receivers {
		ids[i] = fmt.Sprintf("r%d", i)
		a, err := k.newAgent(cs[min(i+1, conns-1)], ids[i], opts...)
		if err != nil {
			return nil, err
		}
		a.HandleFunc("work", func(ctx context.Context, msg *agentkit.Message) error {
			m.recordOnce(msg.MessageID, time.Since(msg.Timestamp))
			return nil
		})
		if err := a.Start(ctx); err != nil {
			return nil, err
		}
	}
	sender, err := k.newAgent(cs[0], "sender")
	if err != nil {
		return nil, err
	}
	env.progress.track(m)
	m.start = time.Now()
	n := env.cfg.Messages
	if batch {
		err = sendBatches(ctx, sender, n, func(i int) string { return ids[i%receivers] }, wire.PriorityNormal, env.payload)
	} else {
		err = sendConcurrently(ctx, sender, n, func(i int) string { return ids[i%receivers] }, env.payload)
	}
	if err != nil {
		return nil, err
	}
	return m, m.wait(ctx)
}

// sendBatches sends n requests with SendBatch in batches of 256.
func sendBatches(ctx context.Context, sender *agentkit.Agent, n int, to func(int) string, p wire.Priority, payload []byte) error {
	batch := make([]*wire.Envelope, 0, 256)
	for i := range n {
		e, err := sender.NewRequest(ctx, to(i), "work", payload, agentkit.WithPriority(p))
		if err != nil {
			return err
		}
		batch = append(batch, e)
		if len(batch) == cap(batch) || i == n-1 {
			if err := sender.SendBatch(ctx, batch); err != nil {
				return err
			}
			batch = batch[:0]
		}
	}
	return nil
}

// sendConcurrently sends n requests with Send from 64 goroutines.
func sendConcurrently(ctx context.Context, sender *agentkit.Agent, n int, to func(int) string, payload []byte) error {
	return concurrently(n, func(i int) error {
		_, err := sender.Send(ctx, to(i), "work", payload)
		return err
	})
}

func agentkitRequest(ctx context.Context, env *runEnv) (*measurement, error) {
	k, cs, err := newAkMesh(ctx, env, 2)
	if err != nil {
		return nil, err
	}
	defer k.stop()
	resp, err := k.newAgent(cs[1], "responder")
	if err != nil {
		return nil, err
	}
	resp.HandleFunc("ping", func(ctx context.Context, msg *agentkit.Message) error { return msg.Reply(ctx, "pong", msg.Payload) })
	if err := resp.Start(ctx); err != nil {
		return nil, err
	}
	req, err := k.newAgent(cs[0], "requester")
	if err != nil {
		return nil, err
	}
	if err := req.Start(ctx); err != nil {
		return nil, err
	}
	n := requests(env.cfg)
	m := newMeasurement(n)
	env.progress.track(m)
	var wg sync.WaitGroup
	var failed atomic.Pointer[error]
	sem := make(chan struct{}, 2000)
	m.start = time.Now()
	err = pace(ctx, n, env.cfg.Rate, func(int) {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			t0 := time.Now()
			if _, err := req.Request(ctx, "responder", "ping", env.payload); err != nil {
				failed.CompareAndSwap(nil, &err)
				return
			}
			m.record(time.Since(t0))
		})
	})
	wg.Wait()
	if err != nil {
		return nil, err
	}
	if e := failed.Load(); e != nil {
		return nil, *e
	}
	return m, m.wait(ctx)
}

func agentkitBacklog(ctx context.Context, env *runEnv) (*measurement, error) {
	k, cs, err := newAkMesh(ctx, env, 2)
	if err != nil {
		return nil, err
	}
	defer k.stop()
	sender, err := k.newAgent(cs[0], "sender")
	if err != nil {
		return nil, err
	}
	recv, err := k.newAgent(cs[1], "receiver")
	if err != nil {
		return nil, err
	}
	m := newMeasurement(critical)
	recv.HandleFunc("work", func(ctx context.Context, msg *agentkit.Message) error {
		if msg.Priority == wire.PriorityCritical {
			m.recordOnce(msg.MessageID, time.Since(msg.Timestamp))
		}
		return nil
	})
	// newAkMesh created the stream, so the backlog is stored before any
	// agent starts.
	if err := sendBatches(ctx, sender, env.cfg.Messages, func(int) string { return "receiver" }, wire.PriorityLow, env.payload); err != nil {
		return nil, err
	}
	env.progress.track(m)
	m.start = time.Now()
	if err := recv.Start(ctx); err != nil {
		return nil, err
	}
	var errs []error
	for range critical {
		if _, err := sender.Send(ctx, "receiver", "work", env.payload, agentkit.WithPriority(wire.PriorityCritical)); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return m, m.wait(ctx)
}
