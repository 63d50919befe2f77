package bench

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/subjects"
)

const (
	hdrTS   = "Bench-Ts" // send time, Unix nanoseconds
	hdrKind = "Bench-Kind"
)

// conns opens n connections to url and returns a closer for all of them.
func conns(url string, n int) ([]*nats.Conn, func(), error) {
	var out []*nats.Conn
	closeAll := func() {
		for _, nc := range out {
			nc.Close()
		}
	}
	for range n {
		nc, err := nats.Connect(url)
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		out = append(out, nc)
	}
	return out, closeAll, nil
}

func sinceHeader(h nats.Header) time.Duration {
	ns, err := strconv.ParseInt(h.Get(hdrTS), 10, 64)
	if err != nil {
		return 0
	}
	return time.Since(time.Unix(0, ns))
}

func stamped(subject string, data []byte, kind string) *nats.Msg {
	m := &nats.Msg{Subject: subject, Data: data, Header: nats.Header{hdrTS: {strconv.FormatInt(time.Now().UnixNano(), 10)}}}
	if kind != "" {
		m.Header.Set(hdrKind, kind)
	}
	return m
}

// rawStream creates the run's stream and returns it with a deleter.
func rawStream(ctx context.Context, js jetstream.JetStream, name string) (jetstream.Stream, func(), error) {
	st, err := createStream(ctx, js, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}, Storage: jetstream.FileStorage})
	if err != nil {
		return nil, nil, err
	}
	return st, func() { deleteStream(js, name) }, nil
}

// storeAttempts bounds createStream's attempts. A failed attempt needs a
// directory cleanup (one per stream deleted) to land inside it, so
// consecutive failures are rare; a store that keeps failing (a full disk)
// fails the run after this many.
const storeAttempts = 10

// createStream creates the stream cfg describes, trying again while the
// server fails to create its store. After deleting a stream the server
// removes its account's streams directory, when empty, from a goroutine of
// its own; a create that comes in meanwhile can see that directory vanish
// under the one it is making, and fails. A run starts right after the
// previous one deleted its streams, often leaving none, so every stream
// the bench creates goes through here.
func createStream(ctx context.Context, js jetstream.JetStream, cfg jetstream.StreamConfig) (jetstream.Stream, error) {
	for attempt := 1; ; attempt++ {
		st, err := js.CreateStream(ctx, cfg)
		if err == nil || attempt == storeAttempts || !storeFailed(err) {
			return st, err
		}
	}
}

// storeFailed reports whether err is the server's failure to create a
// stream's store (JSStreamCreateErrF, 10049, with the store message).
func storeFailed(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == 10049 && strings.Contains(apiErr.Description, "creating store")
}

// deleteStream deletes a run's stream, best effort.
func deleteStream(js jetstream.JetStream, name string) {
	dctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	js.DeleteStream(dctx, name)
}

// consume starts Consume on a new durable of st filtering filter (all
// when empty) with handler, over its own jetstream context on nc.
func consume(ctx context.Context, nc *nats.Conn, stream, durable, filter string, handler jetstream.MessageHandler) (jetstream.ConsumeContext, error) {
	cfg := jetstream.ConsumerConfig{Durable: durable, AckPolicy: jetstream.AckExplicitPolicy, FilterSubject: filter}
	return consumeWith(ctx, nc, stream, cfg, handler)
}

// consumeWith starts Consume on a new consumer of stream configured by cfg.
func consumeWith(ctx context.Context, nc *nats.Conn, stream string, cfg jetstream.ConsumerConfig, handler jetstream.MessageHandler) (jetstream.ConsumeContext, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, stream, cfg)
	if err != nil {
		return nil, err
	}
	return cons.Consume(handler)
}

// publishAll publishes msgs asynchronously from one goroutine and waits
// for every stream ack. When the window of unacknowledged publishes stays
// full (the server stores slower than one goroutine publishes), it waits
// for the window to empty and goes on.
func publishAll(ctx context.Context, js jetstream.JetStream, n int, msg func(i int) *nats.Msg) error {
	for i := range n {
		m := msg(i)
		_, err := js.PublishMsgAsync(m)
		for errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
			if err := published(ctx, js); err != nil {
				return err
			}
			_, err = js.PublishMsgAsync(m)
		}
		if err != nil {
			return err
		}
	}
	return published(ctx, js)
}

// published waits until every async publish of js is acknowledged.
func published(ctx context.Context, js jetstream.JetStream) error {
	select {
	case <-js.PublishAsyncComplete():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func rawThroughput(ctx context.Context, env *runEnv, agents int) (*measurement, error) {
	cs, js, name, cleanup, err := rawSetup(ctx, env, agents+1)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	return throughput(ctx, env, cs, js, name, agents, func(i int) (jetstream.ConsumerConfig, string, error) {
		subject := fmt.Sprintf("%s.a%d", name, i)
		return jetstream.ConsumerConfig{Durable: fmt.Sprintf("a%d", i), AckPolicy: jetstream.AckExplicitPolicy, FilterSubject: subject}, subject, nil
	})
}

// rawMeshThroughput is rawThroughput on agentkit's stream and on the
// consumers agents r0, r1, ... provision for normal priority, with the
// subjects agentkit's "sender" publishes on.
func rawMeshThroughput(ctx context.Context, env *runEnv, agents int) (*measurement, error) {
	scheme, err := subjects.New(env.id)
	if err != nil {
		return nil, err
	}
	cs, closeAll, err := conns(env.cfg.URL, agents+1)
	if err != nil {
		return nil, err
	}
	defer closeAll()
	js, _ := jetstream.New(cs[0])
	streamCfg := agentkit.StreamConfig(scheme, 1)
	if _, err := createStream(ctx, js, streamCfg); err != nil {
		return nil, err
	}
	defer deleteStream(js, streamCfg.Name)
	p := wire.PriorityNormal
	return throughput(ctx, env, cs, js, streamCfg.Name, agents, func(i int) (jetstream.ConsumerConfig, string, error) {
		id := fmt.Sprintf("r%d", i)
		cfg, err := agentkit.ConsumerConfig(scheme, id, p, agentkit.DefaultPolicies()[p])
		if err != nil {
			return cfg, "", err
		}
		subject, err := scheme.Direct(id, string(p), "sender")
		return cfg, subject, err
	})
}

// throughput starts one consumer per agent on cs[1:] (receiver gives its
// configuration and the subject it receives on), then publishes Messages
// round robin from cs[0] and measures until every one is handled.
func throughput(ctx context.Context, env *runEnv, cs []*nats.Conn, js jetstream.JetStream, stream string, agents int,
	receiver func(i int) (jetstream.ConsumerConfig, string, error)) (*measurement, error) {
	m := newMeasurement(env.cfg.Messages)
	var ccs []jetstream.ConsumeContext
	defer func() {
		for _, cc := range ccs {
			cc.Stop()
		}
	}()
	to := make([]string, agents)
	for i := range agents {
		cfg, subject, err := receiver(i)
		if err != nil {
			return nil, err
		}
		to[i] = subject
		cc, err := consumeWith(ctx, cs[i+1], stream, cfg, func(msg jetstream.Msg) {
			m.record(sinceHeader(msg.Headers()))
			msg.Ack()
		})
		if err != nil {
			return nil, err
		}
		ccs = append(ccs, cc)
	}
	env.progress.track(m)
	m.start = time.Now()
	if err := publishAll(ctx, js, env.cfg.Messages, func(i int) *nats.Msg {
		return stamped(to[i%agents], env.payload, "")
	}); err != nil {
		return nil, err
	}
	return m, m.wait(ctx)
}

// pace calls send(i) for i < n at rate per second from the calling
// goroutine, sleeping until each send's slot.
func pace(ctx context.Context, n, rate int, send func(i int)) error {
	start := time.Now()
	for i := range n {
		if d := time.Until(start.Add(time.Duration(i) * time.Second / time.Duration(rate))); d > 0 {
			select {
			case <-time.After(d):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		send(i)
	}
	return nil
}

func requests(cfg Config) int { return min(cfg.Messages, 3*cfg.Rate) }

func rawRequest(ctx context.Context, env *runEnv) (*measurement, error) {
	cs, js, name, cleanup, err := rawSetup(ctx, env, 3)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	rjs, _ := jetstream.New(cs[1])
	var errMu sync.Mutex
	var firstErr error
	responder, err := consume(ctx, cs[1], name, "responder", name+".req", func(msg jetstream.Msg) {
		reply := &nats.Msg{Subject: name + ".rep", Data: msg.Data(), Header: nats.Header{hdrTS: {msg.Headers().Get(hdrTS)}}}
		if _, err := rjs.PublishMsgAsync(reply); err != nil {
			errMu.Lock()
			firstErr = cmpErr(firstErr, err)
			errMu.Unlock()
		}
		msg.Ack()
	})
	if err != nil {
		return nil, err
	}
	defer responder.Stop()
	n := requests(env.cfg)
	m := newMeasurement(n)
	requester, err := consume(ctx, cs[2], name, "requester", name+".rep", func(msg jetstream.Msg) {
		m.record(sinceHeader(msg.Headers()))
		msg.Ack()
	})
	if err != nil {
		return nil, err
	}
	defer requester.Stop()
	env.progress.track(m)
	m.start = time.Now()
	if err := pace(ctx, n, env.cfg.Rate, func(i int) {
		if _, err := js.PublishMsgAsync(stamped(name+".req", env.payload, "")); err != nil {
			errMu.Lock()
			firstErr = cmpErr(firstErr, err)
			errMu.Unlock()
		}
	}); err != nil {
		return nil, err
	}
	if err := m.wait(ctx); err != nil {
		errMu.Lock()
		defer errMu.Unlock()
		return nil, errors.Join(err, firstErr)
	}
	return m, nil
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// critical is how many critical messages follow the backlog.
const critical = 10

func rawBacklog(ctx context.Context, env *runEnv) (*measurement, error) {
	cs, js, name, cleanup, err := rawSetup(ctx, env, 2)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	if err := publishAll(ctx, js, env.cfg.Messages, func(int) *nats.Msg { return stamped(name+".low", env.payload, "low") }); err != nil {
		return nil, err
	}
	m := newMeasurement(critical)
	env.progress.track(m)
	m.start = time.Now()
	cc, err := consume(ctx, cs[1], name, "receiver", "", func(msg jetstream.Msg) {
		if msg.Headers().Get(hdrKind) == "critical" {
			m.record(sinceHeader(msg.Headers()))
		}
		msg.Ack()
	})
	if err != nil {
		return nil, err
	}
	defer cc.Stop()
	if err := publishAll(ctx, js, critical, func(int) *nats.Msg { return stamped(name+".critical", env.payload, "critical") }); err != nil {
		return nil, err
	}
	return m, m.wait(ctx)
}

// rawSetup opens n connections and the run's stream (named after the run
// id) through the first; cleanup deletes the stream and closes them.
func rawSetup(ctx context.Context, env *runEnv, n int) (cs []*nats.Conn, js jetstream.JetStream, name string, cleanup func(), err error) {
	cs, closeAll, err := conns(env.cfg.URL, n)
	if err != nil {
		return nil, nil, "", nil, err
	}
	js, _ = jetstream.New(cs[0])
	name = strings.ToUpper(env.id)
	_, drop, err := rawStream(ctx, js, name)
	if err != nil {
		closeAll()
		return nil, nil, "", nil, err
	}
	return cs, js, name, func() { drop(); closeAll() }, nil
}
