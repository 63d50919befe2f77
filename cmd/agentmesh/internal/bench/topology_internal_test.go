package bench

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/internal/natstest"
)

// BenchmarkTopology compares two consumer topologies for N agents spread
// over 20 connections, in raw nats.go, so that the choice of the unit of
// consumption is measured apart from agentkit's own work:
//
//   - per-agent: one durable pull consumer per agent and priority, with
//     one literal filter (agentkit's direct consumers today);
//   - per-process: one durable pull consumer per connection and
//     priority, filtering the subjects of the agents on that connection,
//     with local dispatch by the subject's agent token.
//
// Each run reports start time (consumers created and consuming), idle
// CPU of the process (server included) over 10 s from 5 s after the
// start, a burst of 20,000
// messages round robin, and the publish-to-handler latency of messages
// offered at 500/s. Run one size with
//
//	go test -modfile=go_test.mod -run XXX -bench 'Topology/.*agents=1000' -benchtime 1x ./cmd/agentmesh/internal/bench
func BenchmarkTopology(b *testing.B) {
	for _, n := range []int{100, 1000} {
		for _, mode := range []string{"per-agent", "per-process"} {
			b.Run(fmt.Sprintf("%s/agents=%d", mode, n), func(b *testing.B) {
				for range b.N {
					runTopology(b, mode == "per-process", n)
				}
			})
		}
	}
}

var topologyPriorities = []string{"critical", "high", "normal", "low", "batch"}

const topologyConns = 20

// topologyAgent counts what one agent handled.
type topologyAgent struct{ handled atomic.Int64 }

func runTopology(b *testing.B, perProcess bool, agents int) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	s := natstest.RunServer(b)
	conns := make([]*nats.Conn, topologyConns)
	jss := make([]jetstream.JetStream, topologyConns)
	for i := range conns {
		nc, err := nats.Connect(s.ClientURL())
		if err != nil {
			b.Fatal(err)
		}
		defer nc.Close()
		conns[i] = nc
		if jss[i], err = jetstream.New(nc); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := jss[0].CreateStream(ctx, jetstream.StreamConfig{
		Name: "MESH", Subjects: []string{"mesh.agent.*.*.*"}, Storage: jetstream.FileStorage,
		MaxConsumers: 100_000,
	}); err != nil {
		b.Fatal(err)
	}
	byID := map[string]*topologyAgent{}
	ids := make([]string, agents)
	for i := range ids {
		ids[i] = "a" + strconv.Itoa(i)
		byID[ids[i]] = &topologyAgent{}
	}
	var total atomic.Int64
	var latMu sync.Mutex
	var lat []time.Duration
	handle := func(msg jetstream.Msg) {
		tok := strings.SplitN(msg.Subject(), ".", 5) // mesh agent <id> <p> <sender>
		a := byID[tok[2]]
		if a == nil {
			_ = msg.Term()
			return
		}
		a.handled.Add(1)
		if d := msg.Data(); len(d) >= 8 && tok[4] == "timed" {
			sent := time.Unix(0, int64(binary.BigEndian.Uint64(d)))
			latMu.Lock()
			lat = append(lat, time.Since(sent))
			latMu.Unlock()
		}
		_ = msg.Ack()
		total.Add(1)
	}

	// Start: create the consumers and consume, 8 at a time.
	type unit struct {
		conn    int
		name    string
		filters []string
	}
	var units []unit
	if perProcess {
		for c := range topologyConns {
			for _, p := range topologyPriorities {
				u := unit{conn: c, name: fmt.Sprintf("host%d_%s", c, p)}
				for i := c; i < agents; i += topologyConns {
					u.filters = append(u.filters, "mesh.agent."+ids[i]+"."+p+".*")
				}
				if len(u.filters) > 0 {
					units = append(units, u)
				}
			}
		}
	} else {
		for i, id := range ids {
			for _, p := range topologyPriorities {
				units = append(units, unit{conn: i % topologyConns, name: id + "_" + p, filters: []string{"mesh.agent." + id + "." + p + ".*"}})
			}
		}
	}
	start := time.Now()
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	var mu sync.Mutex
	var ccs []jetstream.ConsumeContext
	var startErr atomic.Pointer[error]
	for _, u := range units {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			cfg := jetstream.ConsumerConfig{Durable: u.name, AckPolicy: jetstream.AckExplicitPolicy, AckWait: 30 * time.Second}
			if len(u.filters) == 1 {
				cfg.FilterSubject = u.filters[0]
			} else {
				cfg.FilterSubjects = u.filters
			}
			cons, err := jss[u.conn].CreateOrUpdateConsumer(ctx, "MESH", cfg)
			if err != nil {
				startErr.Store(&err)
				return
			}
			cc, err := cons.Consume(handle)
			if err != nil {
				startErr.Store(&err)
				return
			}
			mu.Lock()
			ccs = append(ccs, cc)
			mu.Unlock()
		}()
	}
	wg.Wait()
	defer func() {
		for _, cc := range ccs {
			cc.Stop()
		}
	}()
	if err := startErr.Load(); err != nil {
		b.Fatal(*err)
	}
	startTime := time.Since(start)

	// Idle, after the server has written the consumers it just created.
	time.Sleep(5 * time.Second)
	cpu0, _ := cpuTime()
	idleStart := time.Now()
	time.Sleep(10 * time.Second) // the measured window itself, not a wait for an event
	cpu1, _ := cpuTime()
	idle := float64(cpu1-cpu0) / float64(time.Since(idleStart)) * 100

	pub, err := nats.Connect(s.ClientURL())
	if err != nil {
		b.Fatal(err)
	}
	defer pub.Close()
	pjs, err := jetstream.New(pub, jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		b.Fatal(err)
	}
	waitTotal := func(want int64) {
		for total.Load() < want {
			if ctx.Err() != nil {
				b.Fatalf("handled %d of %d", total.Load(), want)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}

	// Burst.
	const burst = 20000
	payload := make([]byte, 512)
	burstStart := time.Now()
	for i := range burst {
		if _, err := pjs.PublishAsync("mesh.agent."+ids[i%agents]+".normal.sender", payload); err != nil {
			b.Fatal(err)
		}
		if i%1024 == 1023 {
			<-pjs.PublishAsyncComplete() // a window of acks in flight, as raw.go keeps
		}
	}
	<-pjs.PublishAsyncComplete()
	waitTotal(burst)
	burstRate := burst / time.Since(burstStart).Seconds()

	// Latency at 500/s for 3 s.
	const rate, offered = 500, 1500
	tick := time.NewTicker(time.Second / rate)
	for i := range offered {
		<-tick.C
		d := make([]byte, 512)
		binary.BigEndian.PutUint64(d, uint64(time.Now().UnixNano()))
		if _, err := pjs.PublishAsync("mesh.agent."+ids[(i*7919)%agents]+".normal.timed", d); err != nil {
			b.Fatal(err)
		}
	}
	tick.Stop()
	waitTotal(burst + offered)
	latMu.Lock()
	slices.Sort(lat)
	p50, p99 := lat[len(lat)/2], lat[len(lat)*99/100]
	latMu.Unlock()

	b.ReportMetric(float64(len(units)), "consumers")
	b.ReportMetric(startTime.Seconds(), "start-s")
	b.ReportMetric(idle, "idle-cpu-%")
	b.ReportMetric(burstRate, "burst-msg/s")
	b.ReportMetric(float64(p50.Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(p99.Microseconds())/1000, "p99-ms")
	fmt.Fprintf(os.Stderr, "topology per-process=%v agents=%d consumers=%d start=%v idle=%.1f%% burst=%.0f/s p50=%v p99=%v\n",
		perProcess, agents, len(units), startTime.Round(time.Millisecond), idle, burstRate, p50, p99)
}
