package agentkit_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/internal/natstest"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// benchPayload is a 512-byte JSON payload, the same bytes on every side.
var benchPayload = []byte(`{"data":"` + strings.Repeat("x", 512-11) + `"}`)

// BenchmarkThroughput moves b.N messages of 512 payload bytes end to end on
// one embedded server in one run, three ways:
//
//	raw             nats.go: PublishAsync from one goroutine → Consume → Ack
//	raw-envelope    the same, carrying agentkit's envelope bytes and headers
//	raw-mesh        raw-envelope on agentkit's stream and consumer configuration
//	                (the agent's direct and broadcast filters, every ack sampled):
//	                the broker's share of agentkit's cost, so that agentkit
//	                against raw-mesh is the SDK's own
//	agentkit-batch  SendBatch of 256 from one goroutine → handler → Ack
//	agentkit        Send from 64 goroutines (each waits for its stream ack) → handler → Ack
//	agentkit-metrics  the same with Prometheus metrics on both agents
//	agentkit-batch-monitored-sample{100,0}  agentkit-batch with the ack
//	                monitor's events stream capturing advisories, at 100 % and
//	                0 % ack sampling
//
// Each reports msg/s, its ratio to raw's msg/s in the same run (x-raw),
// process CPU per message (server included, since it runs in the
// process) and CPU utilisation. Compare the ratios within one run;
// absolute figures on a shared machine are noise.
func BenchmarkThroughput(b *testing.B) {
	s := natstest.RunServer(b)
	var raw float64 // raw's msg/s in this run
	run := func(name string, bench func(b *testing.B, pub, sub *nats.Conn) float64) {
		b.Run(name, func(b *testing.B) {
			rate := bench(b, natstest.Connect(b, s), natstest.Connect(b, s))
			if name == "raw" {
				raw = rate
			}
			if raw > 0 {
				b.ReportMetric(rate/raw, "x-raw")
			}
		})
	}
	run("raw", func(b *testing.B, pub, sub *nats.Conn) float64 { return benchRaw(b, pub, sub, rawStream, rawPayload) })
	run("raw-envelope", func(b *testing.B, pub, sub *nats.Conn) float64 {
		return benchRaw(b, pub, sub, rawStream, rawEnvelopeMessage(b))
	})
	run("raw-mesh", func(b *testing.B, pub, sub *nats.Conn) float64 {
		return benchRaw(b, pub, sub, meshStream, rawEnvelopeMessage(b))
	})
	run("agentkit-batch", func(b *testing.B, pub, sub *nats.Conn) float64 {
		return benchAgentkit(b, pub, sub, sendBatches, false)
	})
	// The ack monitor's price: its events stream stores one ack metric per
	// sampled ack; sampling 0 keeps only NAK/TERM/MAX_DELIVERIES.
	for _, freq := range []string{"100", "0"} {
		run("agentkit-batch-monitored-sample"+freq, func(b *testing.B, pub, sub *nats.Conn) float64 {
			return benchAgentkit(b, pub, sub, sendBatches, true, agentkit.WithSampleFrequency(freq))
		})
	}
	run("agentkit", func(b *testing.B, pub, sub *nats.Conn) float64 {
		return benchAgentkit(b, pub, sub, sendConcurrently, false)
	})
	run("agentkit-metrics", func(b *testing.B, pub, sub *nats.Conn) float64 {
		return benchAgentkit(b, pub, sub, sendConcurrently, false, withMetrics(b, prometheus.NewRegistry()))
	})
}

// rawPayload is the raw scenario's message: the payload alone.
func rawPayload(subject string) *nats.Msg {
	return &nats.Msg{Subject: subject, Data: benchPayload, Header: nats.Header{jetstream.MsgIDHeader: {wire.NewMessageID()}}}
}

// rawEnvelopeMessage returns the raw-envelope scenario's messages: the bytes and
// headers agentkit puts on the wire for a request carrying benchPayload,
// encoded once, each message with its own Nats-Msg-Id. Against raw it
// prices the envelope's size; against agentkit, agentkit's own work.
func rawEnvelopeMessage(b *testing.B) func(string) *nats.Msg {
	e := wire.NewEnvelope(wire.TypeRequest, "sender", "work")
	e.ReceiverID, e.Correlation, e.Payload = "receiver", e.MessageID, benchPayload
	data, err := e.Encode()
	if err != nil {
		b.Fatal(err)
	}
	return func(subject string) *nats.Msg {
		id := wire.NewMessageID()
		return &nats.Msg{Subject: subject, Data: data, Header: nats.Header{
			jetstream.MsgIDHeader:  {id},
			wire.HeaderType:        {string(e.MessageType)},
			wire.HeaderAction:      {e.Action},
			wire.HeaderCorrelation: {id},
		}}
	}
}

// rawSetup creates a raw scenario's stream and consumer; it returns the
// stream, the consumer and the subject to publish on.
type rawSetup func(b *testing.B) (jetstream.StreamConfig, jetstream.ConsumerConfig, string)

// rawStream is a plain stream with a plain consumer, as a nats.go user
// would start.
func rawStream(b *testing.B) (jetstream.StreamConfig, jetstream.ConsumerConfig, string) {
	stream := fmt.Sprintf("RAW%d_%d", b.N, time.Now().UnixNano())
	return jetstream.StreamConfig{Name: stream, Subjects: []string{stream + ".>"}},
		jetstream.ConsumerConfig{Durable: "c", AckPolicy: jetstream.AckExplicitPolicy}, stream + ".x"
}

// meshStream is agentkit's stream and the receiver's normal-priority
// consumer, exactly as an agent provisions them.
func meshStream(b *testing.B) (jetstream.StreamConfig, jetstream.ConsumerConfig, string) {
	scheme, _ := subjects.New(fmt.Sprintf("raw%d_%d", b.N, time.Now().UnixNano()))
	p := wire.PriorityNormal
	cons, err := agentkit.ConsumerConfig(scheme, "receiver", p, agentkit.DefaultPolicies()[p])
	if err != nil {
		b.Fatal(err)
	}
	subject, err := scheme.Direct("receiver", string(p), "sender")
	if err != nil {
		b.Fatal(err)
	}
	return agentkit.StreamConfig(scheme, 1), cons, subject
}

func benchRaw(b *testing.B, pubConn, subConn *nats.Conn, setup rawSetup, message func(subject string) *nats.Msg) float64 {
	ctx := context.Background()
	js, _ := jetstream.New(pubConn)
	streamCfg, consCfg, subject := setup(b)
	if _, err := js.CreateStream(ctx, streamCfg); err != nil {
		b.Fatal(err)
	}
	defer dropStreams(b, js, streamCfg.Name)
	sjs, _ := jetstream.New(subConn)
	cons, err := sjs.CreateOrUpdateConsumer(ctx, streamCfg.Name, consCfg)
	if err != nil {
		b.Fatal(err)
	}
	var got atomic.Int64
	done := make(chan struct{})
	n := int64(b.N)
	m := startMeasure(b)
	cc, err := cons.Consume(func(m jetstream.Msg) {
		m.Ack()
		if got.Add(1) == n {
			close(done)
		}
	})
	if err != nil {
		b.Fatal(err)
	}
	defer cc.Stop()
	for i := 0; i < b.N; i++ {
		if _, err := js.PublishMsgAsync(message(subject)); err != nil {
			b.Fatal(err)
		}
	}
	<-js.PublishAsyncComplete()
	<-done
	return m.stop()
}

// sendBatches sends n requests in batches of 256 from one goroutine.
func sendBatches(b *testing.B, sender *agentkit.Agent, n int) {
	batch := make([]*wire.Envelope, 0, 256)
	for i := range n {
		e, err := sender.NewRequest(context.Background(), "receiver", "work", benchPayload)
		if err != nil {
			b.Fatal(err)
		}
		batch = append(batch, e)
		if len(batch) == cap(batch) || i == n-1 {
			if err := sender.SendBatch(context.Background(), batch); err != nil {
				b.Fatal(err)
			}
			batch = batch[:0]
		}
	}
}

// sendConcurrently sends n requests with Send from 64 goroutines.
func sendConcurrently(b *testing.B, sender *agentkit.Agent, n int) {
	var wg sync.WaitGroup
	var next atomic.Int64
	for range 64 {
		wg.Go(func() {
			for next.Add(1) <= int64(n) {
				if _, err := sender.Send(context.Background(), "receiver", "work", benchPayload); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// benchAgentkit runs one agentkit scenario on a fresh scheme. With events,
// the ack monitor's events stream captures the scheme's consumer
// advisories, as in a monitored deployment.
func benchAgentkit(b *testing.B, pubConn, subConn *nats.Conn, send func(*testing.B, *agentkit.Agent, int), events bool, opts ...agentkit.Option) float64 {
	scheme, _ := subjects.New(fmt.Sprintf("bench%d_%d", b.N, time.Now().UnixNano()))
	js, _ := jetstream.New(pubConn)
	if events {
		if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: scheme.EventsStream(), Subjects: scheme.EventsSubjects()}); err != nil {
			b.Fatal(err)
		}
	}
	defer dropStreams(b, js, scheme.Stream(), scheme.EventsStream())
	var got atomic.Int64
	done := make(chan struct{})
	n := int64(b.N)
	opts = append(opts, agentkit.WithScheme(scheme), agentkit.WithRegistration(false))
	recv, err := agentkit.New(subConn, "receiver", opts...)
	if err != nil {
		b.Fatal(err)
	}
	recv.HandleFunc("work", func(ctx context.Context, m *agentkit.Message) error {
		if got.Add(1) == n {
			close(done)
		}
		return nil
	})
	sender, _ := agentkit.New(pubConn, "sender", opts...)
	if err := recv.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	defer recv.Stop()
	defer sender.Stop()
	m := startMeasure(b)
	send(b, sender, b.N)
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		b.Fatalf("handled %d of %d", got.Load(), n)
	}
	return m.stop()
}

// dropStreams deletes a scenario's streams, so the next scenario on the
// shared server does not pay for this one's messages.
func dropStreams(b *testing.B, js jetstream.JetStream, names ...string) {
	for _, name := range names {
		if err := js.DeleteStream(context.Background(), name); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			b.Error(err)
		}
	}
}

type measure struct {
	b   *testing.B
	cpu time.Duration
}

func startMeasure(b *testing.B) measure {
	b.ReportAllocs()
	b.ResetTimer()
	return measure{b: b, cpu: processCPU()}
}

// stop ends the measurement, reports it and returns the rate in msg/s.
func (m measure) stop() float64 {
	m.b.StopTimer()
	cpu := processCPU() - m.cpu
	rate := float64(m.b.N) / m.b.Elapsed().Seconds()
	m.b.ReportMetric(rate, "msg/s")
	m.b.ReportMetric(float64(cpu.Nanoseconds())/1e3/float64(m.b.N), "cpu-µs/msg")
	m.b.ReportMetric(float64(cpu)/float64(m.b.Elapsed())*100, "%cpu")
	return rate
}

// processCPU is the user+system CPU time of this process so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
