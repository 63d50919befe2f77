package bench

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmjs "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/jetstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/internal/natstest"
)

// The Watermill comparison: watermill-nats/v2 pkg/jetstream with its
// default DoubleAck, and with AckAsync. It lives in the tests so that the
// shipped binary does not link Watermill; the tests' module file
// (go_test.mod) requires it.
const (
	implWatermill      = "watermill"
	implWatermillAsync = "watermill-async-ack"
)

// withWatermill adds the Watermill implementations to c, after Impls.
func withWatermill(c *Config) {
	c.others = append(c.others, other{implWatermill, runWatermill(false)}, other{implWatermillAsync, runWatermill(true)})
}

func runWatermill(async bool) func(ctx context.Context, env *runEnv, sc string, agents int) (*measurement, error) {
	return func(ctx context.Context, env *runEnv, sc string, agents int) (*measurement, error) {
		switch sc {
		case ScenarioRequest:
			return watermillRequest(ctx, env, async)
		case ScenarioBacklog:
			return watermillBacklog(ctx, env, async)
		default:
			return watermillThroughput(ctx, env, agents, async)
		}
	}
}

// BenchmarkWatermill is `agentmesh bench` with Watermill added: one
// sub-benchmark per scenario and implementation, each moving b.N
// messages (request-response: min(b.N, 3 × 1000) requests at 1,000/s),
// all on one embedded server. Each reports msg/s, its ratio to raw's in
// the same scenario of the same run (x-raw) and the p50 and p99
// latencies in ms, as the bench command's table does; ns/op includes
// each run's setup and means little. -benchtime Nx sets the messages.
func BenchmarkWatermill(b *testing.B) {
	s := natstest.RunServer(b)
	cfg := Config{URL: s.ClientURL()}
	withWatermill(&cfg)
	impls := cfg.implNames()
	for _, sc := range Scenarios {
		b.Run(sc, func(b *testing.B) {
			var raw float64 // raw's msg/s in this scenario
			for _, impl := range impls {
				if skip(sc, impl) != "" {
					continue
				}
				b.Run(impl, func(b *testing.B) {
					c := cfg
					c.Messages, c.Scenarios, c.Impls = b.N, []string{sc}, []string{impl}
					rs, err := Run(b.Context(), c)
					if err != nil {
						b.Fatal(err)
					}
					r := rs[0]
					if sc != ScenarioBacklog {
						b.ReportMetric(r.MsgPerSec, "msg/s")
						if impl == ImplRaw {
							raw = r.MsgPerSec
						}
						if raw > 0 {
							b.ReportMetric(r.MsgPerSec/raw, "x-raw")
						}
					}
					b.ReportMetric(r.P50ms, "p50-ms")
					b.ReportMetric(r.P99ms, "p99-ms")
				})
			}
		})
	}
}

// wmRun owns a run's Watermill publishers, subscribers and streams.
// Watermill's Publisher and Subscriber close the connection they are
// given, so each gets its own; the streams are created and deleted over
// one more.
type wmRun struct {
	env     *runEnv
	async   bool
	closers []func() error
	admin   *nats.Conn // streams; nil until the first is created
	js      jetstream.JetStream
	topics  []string
	wg      sync.WaitGroup // subscription readers
}

func (w *wmRun) close() {
	for i := len(w.closers) - 1; i >= 0; i-- {
		w.closers[i]()
	}
	w.wg.Wait()
	if w.admin == nil {
		return
	}
	defer w.admin.Close()
	for _, t := range w.topics {
		deleteStream(w.js, t)
	}
}

// stream creates topic's stream as Watermill's SubscribeInitialize would
// (its default configuration: named after the topic, on the topic alone),
// through createStream. Creating an existing stream again is a no-op.
func (w *wmRun) stream(ctx context.Context, topic string) error {
	if w.admin == nil {
		nc, err := nats.Connect(w.env.cfg.URL)
		if err != nil {
			return err
		}
		js, err := jetstream.New(nc)
		if err != nil {
			nc.Close()
			return err
		}
		w.admin, w.js = nc, js
	}
	if _, err := createStream(ctx, w.js, jetstream.StreamConfig{Name: topic, Subjects: []string{topic}}); err != nil {
		return err
	}
	if !slices.Contains(w.topics, topic) {
		w.topics = append(w.topics, topic)
	}
	return nil
}

func (w *wmRun) publisher() (*wmjs.Publisher, error) {
	nc, err := nats.Connect(w.env.cfg.URL)
	if err != nil {
		return nil, err
	}
	p, err := wmjs.NewPublisher(wmjs.PublisherConfig{Conn: nc, Logger: watermill.NopLogger{}})
	if err != nil {
		nc.Close()
		return nil, err
	}
	w.closers = append(w.closers, p.Close)
	return p, nil
}

// subscribe creates topic's stream and subscribes to it with Watermill's
// defaults (plus AckAsync when async); handle runs for each message, which
// is then acked.
func (w *wmRun) subscribe(ctx context.Context, topic string, handle func(*message.Message)) error {
	if err := w.stream(ctx, topic); err != nil {
		return err
	}
	nc, err := nats.Connect(w.env.cfg.URL)
	if err != nil {
		return err
	}
	s, err := wmjs.NewSubscriber(wmjs.SubscriberConfig{Conn: nc, Logger: watermill.NopLogger{}, AckAsync: w.async})
	if err != nil {
		nc.Close()
		return err
	}
	w.closers = append(w.closers, s.Close)
	ch, err := s.Subscribe(ctx, topic)
	if err != nil {
		return err
	}
	w.wg.Go(func() {
		for msg := range ch {
			handle(msg)
			msg.Ack()
		}
	})
	return nil
}

func wmMessage(payload []byte, kind string) *message.Message {
	m := message.NewMessage(watermill.NewUUID(), payload)
	m.Metadata.Set(hdrTS, strconv.FormatInt(time.Now().UnixNano(), 10))
	if kind != "" {
		m.Metadata.Set(hdrKind, kind)
	}
	return m
}

func wmSince(m *message.Message) time.Duration {
	ns, err := strconv.ParseInt(m.Metadata.Get(hdrTS), 10, 64)
	if err != nil {
		return 0
	}
	return time.Since(time.Unix(0, ns))
}

// publishConcurrently publishes n messages from 64 goroutines (Watermill's
// Publish waits for each stream ack).
func publishConcurrently(p *wmjs.Publisher, n int, topic func(int) string, msg func() *message.Message) error {
	return concurrently(n, func(i int) error { return p.Publish(topic(i), msg()) })
}

func watermillThroughput(ctx context.Context, env *runEnv, agents int, async bool) (*measurement, error) {
	w := &wmRun{env: env, async: async}
	defer w.close()
	m := newMeasurement(env.cfg.Messages)
	topics := make([]string, agents)
	for i := range agents {
		topics[i] = fmt.Sprintf("%s_a%d", env.id, i)
		if err := w.subscribe(ctx, topics[i], func(msg *message.Message) { m.recordOnce(msg.UUID, wmSince(msg)) }); err != nil {
			return nil, err
		}
	}
	p, err := w.publisher()
	if err != nil {
		return nil, err
	}
	env.progress.track(m)
	m.start = time.Now()
	if err := publishConcurrently(p, env.cfg.Messages, func(i int) string { return topics[i%agents] },
		func() *message.Message { return wmMessage(env.payload, "") }); err != nil {
		return nil, err
	}
	return m, m.wait(ctx)
}

func watermillRequest(ctx context.Context, env *runEnv, async bool) (*measurement, error) {
	w := &wmRun{env: env, async: async}
	defer w.close()
	reqTopic, repTopic := env.id+"_req", env.id+"_rep"
	rp, err := w.publisher()
	if err != nil {
		return nil, err
	}
	var failed atomic.Pointer[error]
	if err := w.subscribe(ctx, reqTopic, func(msg *message.Message) {
		reply := message.NewMessage(watermill.NewUUID(), msg.Payload)
		reply.Metadata.Set(hdrTS, msg.Metadata.Get(hdrTS))
		if err := rp.Publish(repTopic, reply); err != nil {
			failed.CompareAndSwap(nil, &err)
		}
	}); err != nil {
		return nil, err
	}
	n := requests(env.cfg)
	m := newMeasurement(n)
	if err := w.subscribe(ctx, repTopic, func(msg *message.Message) { m.recordOnce(msg.UUID, wmSince(msg)) }); err != nil {
		return nil, err
	}
	p, err := w.publisher()
	if err != nil {
		return nil, err
	}
	env.progress.track(m)
	m.start = time.Now()
	// Watermill's Publish waits for the stream ack, so requests go out
	// from a pool of goroutines to hold the offered rate.
	var wg sync.WaitGroup
	sem := make(chan struct{}, 256)
	err = pace(ctx, n, env.cfg.Rate, func(int) {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if err := p.Publish(reqTopic, wmMessage(env.payload, "")); err != nil {
				failed.CompareAndSwap(nil, &err)
			}
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

func watermillBacklog(ctx context.Context, env *runEnv, async bool) (*measurement, error) {
	w := &wmRun{env: env, async: async}
	defer w.close()
	topic := env.id + "_q"
	// Create the stream first, store the backlog, then subscribe.
	if err := w.stream(ctx, topic); err != nil {
		return nil, err
	}
	p, err := w.publisher()
	if err != nil {
		return nil, err
	}
	if err := publishConcurrently(p, env.cfg.Messages, func(int) string { return topic },
		func() *message.Message { return wmMessage(env.payload, "low") }); err != nil {
		return nil, err
	}
	m := newMeasurement(critical)
	env.progress.track(m)
	m.start = time.Now()
	if err := w.subscribe(ctx, topic, func(msg *message.Message) {
		if msg.Metadata.Get(hdrKind) == "critical" {
			m.recordOnce(msg.UUID, wmSince(msg))
		}
	}); err != nil {
		return nil, err
	}
	for range critical {
		if err := p.Publish(topic, wmMessage(env.payload, "critical")); err != nil {
			return nil, err
		}
	}
	return m, m.wait(ctx)
}
