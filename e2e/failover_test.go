//go:build linux

package e2e

import (
	"context"
	"errors"
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

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/internal/natstest"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// Failover measured on a cluster of nats-server processes: a node killed
// with SIGKILL says nothing to its peers or clients, so the cluster and
// the clients find out only through their own timeouts (Raft election
// timeouts at the servers, missed pull heartbeats and reconnects at the
// clients). The tests time each of those phases.

// failoverVariant is one configuration of the receiver and the clients'
// connections.
type failoverVariant struct {
	name string
	// policy is the receiver's normal-priority policy; zero: agentkit's
	// default, whose first ack timeout sets the pull expiry and with it
	// how long a lost pull request goes unnoticed.
	policy agentkit.DeliveryPolicy
	// reconnectWait is nats.ReconnectWait of both clients; zero: nats.go's
	// default.
	reconnectWait time.Duration
}

// failoverVariants are the configurations AGENTMESH_FAILOVER_VARIANTS can
// name (comma separated, each "variant/placement").
var failoverVariants = map[string]failoverVariant{
	"default": {name: "default"},
	// A 1s first ack timeout gives the shortest pull expiry agentkit
	// allows (2s), so a lost pull request is noticed after 2s.
	"shortpull":     {name: "shortpull", policy: agentkit.DeliveryPolicy{BackOff: []time.Duration{time.Second, 2 * time.Second, 4 * time.Second}, MaxDeliver: 10}},
	"fastreconnect": {name: "fastreconnect", reconnectWait: 50 * time.Millisecond},
	"shortpull+fastreconnect": {name: "shortpull+fastreconnect", reconnectWait: 50 * time.Millisecond,
		policy: agentkit.DeliveryPolicy{BackOff: []time.Duration{time.Second, 2 * time.Second, 4 * time.Second}, MaxDeliver: 10}},
}

// envInt returns the positive integer in environment variable name, or def.
func envInt(t *testing.T, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > 1000 {
		t.Fatalf("%s=%q: want a count between 1 and 1000", name, v)
	}
	return n
}

// timeline records when things happened to the clients of one variant.
type timeline struct {
	mu          sync.Mutex
	noHeartbeat []time.Time // the receiver's normal-priority pull found missing heartbeats (it pulls again)
	otherNoHB   int         // the same at the other priorities, whose consumers' leaders may have died too
	otherErrs   []string    // the receiver's other background errors
	reconnects  map[string][]time.Time
	disconnects map[string][]time.Time
	sendStart   map[string]time.Time // message id → when its Send began
	sendEnd     map[string]time.Time // message id → when its Send returned nil
	sendErrs    []sendFailure
	handled     map[string][]time.Time // message id → each handler call
	order       []string               // message ids in the order their Sends began
}

type sendFailure struct {
	start, end time.Time
	err        error
}

func newTimeline() *timeline {
	return &timeline{reconnects: map[string][]time.Time{}, disconnects: map[string][]time.Time{},
		sendStart: map[string]time.Time{}, sendEnd: map[string]time.Time{}, handled: map[string][]time.Time{}}
}

// connOpts returns options recording name's disconnects and reconnects.
func (tl *timeline) connOpts(name string, v failoverVariant) []nats.Option {
	opts := []nats.Option{nats.Name(name),
		nats.DisconnectErrHandler(func(*nats.Conn, error) {
			tl.mu.Lock()
			tl.disconnects[name] = append(tl.disconnects[name], time.Now())
			tl.mu.Unlock()
		}),
		nats.ReconnectHandler(func(*nats.Conn) {
			tl.mu.Lock()
			tl.reconnects[name] = append(tl.reconnects[name], time.Now())
			tl.mu.Unlock()
		})}
	if v.reconnectWait > 0 {
		opts = append(opts, nats.ReconnectWait(v.reconnectWait))
	}
	return opts
}

// startWorker starts the receiving agent "worker" on nc, recording its
// handled messages and errors in tl; the caller stops it. Its Start is
// retried until the cluster serves it.
func (tl *timeline) startWorker(t *testing.T, ctx context.Context, nc *nats.Conn, opts []agentkit.Option) *agentkit.Agent {
	t.Helper()
	recv, err := agentkit.New(nc, "worker", append(slices.Clone(opts), agentkit.WithErrorHandler(tl.asyncError))...)
	if err != nil {
		t.Fatal(err)
	}
	if err := recv.HandleFunc("work", tl.handle); err != nil {
		t.Fatal(err)
	}
	natstest.WaitFor(t, 30*time.Second, func() error { return recv.Start(ctx) })
	return recv
}

func (tl *timeline) asyncError(err error) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	if errors.Is(err, jetstream.ErrNoHeartbeat) {
		// agentkit names the priority first: "agentkit: normal consumer of …".
		if strings.HasPrefix(err.Error(), "agentkit: "+string(wire.PriorityNormal)+" ") {
			tl.noHeartbeat = append(tl.noHeartbeat, time.Now())
		} else {
			tl.otherNoHB++
		}
		return
	}
	tl.otherErrs = append(tl.otherErrs, err.Error())
}

func (tl *timeline) handle(_ context.Context, m *agentkit.Message) error {
	now := time.Now()
	tl.mu.Lock()
	tl.handled[m.MessageID] = append(tl.handled[m.MessageID], now)
	tl.mu.Unlock()
	return nil
}

// first returns the first time in ts at or after from, and whether there
// is one.
func first(ts []time.Time, from time.Time) (time.Time, bool) {
	for _, t := range ts {
		if !t.Before(from) {
			return t, true
		}
	}
	return time.Time{}, false
}

// afterKill is what a run measured from the kill.
type afterKill struct {
	firstHandled time.Time     // first handler call of a message whose Send began after the kill
	firstSendOK  time.Time     // first nil return of a Send that began after the kill
	slowestSend  time.Duration // the longest Send in flight at or after the kill
	failedSends  int           // Sends that began at or after a second before the kill and failed
}

// since reads the timeline from kill: ok once a message sent after the
// kill has been handled and a Send begun after it has succeeded.
func (tl *timeline) since(kill time.Time) (afterKill, bool) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	var a afterKill
	for _, id := range tl.order {
		start := tl.sendStart[id]
		end, ok := tl.sendEnd[id]
		if ok && (end.After(kill)) {
			a.slowestSend = max(a.slowestSend, end.Sub(start))
		}
		if start.Before(kill) {
			continue
		}
		if ok && (a.firstSendOK.IsZero() || end.Before(a.firstSendOK)) {
			a.firstSendOK = end
		}
		if h := tl.handled[id]; len(h) > 0 && (a.firstHandled.IsZero() || h[0].Before(a.firstHandled)) {
			a.firstHandled = h[0]
		}
	}
	for _, f := range tl.sendErrs {
		if f.end.After(kill) {
			a.failedSends++
			a.slowestSend = max(a.slowestSend, f.end.Sub(f.start))
		}
	}
	return a, !a.firstHandled.IsZero() && !a.firstSendOK.IsZero()
}

// counts returns how many messages were handled and how many Sends
// succeeded.
func (tl *timeline) counts() (handled, sent int) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	return len(tl.handled), len(tl.sendEnd)
}

// check returns the ids of messages whose Send succeeded but were never
// handled, and the number of handler calls beyond the first per id.
func (tl *timeline) check() (lost []string, dups int) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	for id := range tl.sendEnd {
		if len(tl.handled[id]) == 0 {
			lost = append(lost, id)
		}
	}
	for _, h := range tl.handled {
		dups += len(h) - 1
	}
	return lost, dups
}

// sendSteadily sends "work" to worker every interval, one Send at a time
// (a Send that blocks delays the next, as in a caller sending in a loop),
// recording each in tl until ctx ends; the returned wait waits for the
// loop to end.
func sendSteadily(ctx context.Context, sender *agentkit.Agent, tl *timeline, interval time.Duration) (wait func()) {
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for n := 0; ; n++ {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			e, err := sender.NewRequest(ctx, "worker", "work", map[string]int{"n": n})
			if err != nil {
				return // ctx ended
			}
			start := time.Now()
			tl.mu.Lock()
			tl.sendStart[e.MessageID] = start
			tl.order = append(tl.order, e.MessageID)
			tl.mu.Unlock()
			// Not ctx: a Send in flight when the test stops sending
			// finishes, so its outcome is known.
			err = sender.SendEnvelope(context.Background(), e)
			end := time.Now()
			tl.mu.Lock()
			if err == nil {
				tl.sendEnd[e.MessageID] = end
			} else {
				tl.sendErrs = append(tl.sendErrs, sendFailure{start: start, end: end, err: err})
			}
			tl.mu.Unlock()
		}
	})
	return wg.Wait
}

// TestProcessCluster_FailoverTime kills, with SIGKILL, first the node
// leading the receiver's consumer and then, once the cluster has
// recovered, the node leading the message stream, while a sender sends
// 200 messages a second to one receiver (R3 stream and consumer). Each run
// logs, from the kill: when the new leader was elected, when the
// receiver's pull noticed the missing heartbeats (and pulled again), when
// the clients reconnected, when the first message sent after the kill was
// handled, and when the first Send begun after it succeeded; and how many
// Sends failed. Every Send that returned nil must be handled, and handling
// must resume within a generous bound.
//
// Before each kill the test moves the leaders, so the killed node leads
// only the group under test, and either holds neither client's connection
// ("remote") or the receiver's ("local"). AGENTMESH_FAILOVER_RUNS sets the
// runs of each kill (default 1) and AGENTMESH_FAILOVER_VARIANTS the
// configurations (see failoverVariants; default "default/remote").
func TestProcessCluster_FailoverTime(t *testing.T) {
	c := runProcCluster(t, 3)
	runs := envInt(t, "AGENTMESH_FAILOVER_RUNS", 1)
	variants := os.Getenv("AGENTMESH_FAILOVER_VARIANTS")
	if variants == "" {
		variants = "default/remote"
	}
	for _, vp := range strings.Split(variants, ",") {
		name, placement, _ := strings.Cut(vp, "/")
		v, ok := failoverVariants[name]
		if !ok || placement != "remote" && placement != "local" {
			t.Fatalf("AGENTMESH_FAILOVER_VARIANTS: %q is not variant/remote or variant/local", vp)
		}
		t.Run(strings.ReplaceAll(vp, "/", "_"), func(t *testing.T) {
			measureFailover(t, c, v, placement == "local", runs)
		})
	}
}

// measureFailover runs one variant: runs consumer leader kills and runs
// stream leader kills, alternating.
func measureFailover(t *testing.T, c *procCluster, v failoverVariant, local bool, runs int) {
	pc := *c
	pc.t = t // failures are this subtest's
	c = &pc
	admin := c.Connect(0)
	js, _ := jetstream.New(admin)
	prefix := "fo" + strings.NewReplacer("+", "").Replace(v.name)
	if local {
		prefix += "l"
	}
	scheme, err := subjects.New(prefix)
	if err != nil {
		t.Fatal(err)
	}
	natstest.WaitFor(t, 30*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return agentkit.EnsureStream(ctx, js, agentkit.StreamConfig(scheme, 3))
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	tl := newTimeline()
	opts := []agentkit.Option{agentkit.WithScheme(scheme), agentkit.WithReplicas(3), agentkit.WithRegistration(false)}
	if v.policy.BackOff != nil {
		opts = append(opts, agentkit.WithPolicy(wire.PriorityNormal, v.policy))
	}
	// Both clients connect to node 0 first, so they share a node.
	recvConn := c.Connect(0, tl.connOpts("receiver", v)...)
	sendConn := c.Connect(0, tl.connOpts("sender", v)...)
	recv := tl.startWorker(t, ctx, recvConn, opts)
	defer recv.Stop()
	sender, err := agentkit.New(sendConn, "sender", opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer sender.Stop()
	sendCtx, stopSending := context.WithCancel(ctx)
	waitSender := sendSteadily(sendCtx, sender, tl, 5*time.Millisecond)
	defer func() { stopSending(); waitSender() }()

	consumer, _ := scheme.Consumer("worker", string(wire.PriorityNormal))
	streamLeader := func() (string, error) { return c.StreamLeader(js, scheme.Stream()) }
	consumerLeader := func() (string, error) { return c.ConsumerLeader(js, scheme.Stream(), consumer) }
	// progressed waits until n more messages have been handled: the mesh
	// is flowing.
	progressed := func(n int) {
		t.Helper()
		h0, _ := tl.counts()
		natstest.WaitForProgress(t, 30*time.Second, h0+n, "messages handled", func() (int, error) {
			h, _ := tl.counts()
			return h, nil
		})
	}
	progressed(200)

	for run := 1; run <= 2*runs; run++ {
		kind := "consumer"
		target, other := consumerLeader, streamLeader
		targetAPI, otherAPI := consumerStepDown(scheme, consumer), streamStepDown(scheme)
		if run%2 == 0 {
			kind = "stream"
			target, other = other, target
			targetAPI, otherAPI = otherAPI, targetAPI
		}
		// Choose the node to kill by where the clients are connected now
		// (a kill moved them), and move the leaders around it.
		rs, ss := recvConn.ConnectedServerName(), sendConn.ConnectedServerName()
		victim := -1
		for i, nd := range c.nodes {
			if local && nd.name == rs || !local && nd.name != rs && nd.name != ss {
				victim = i
				break
			}
		}
		if victim < 0 {
			t.Fatalf("no node to kill: receiver on %q, sender on %q", rs, ss)
		}
		vname := c.nodes[victim].name
		c.MoveLeader(admin, targetAPI, vname, target)
		otherNode := c.nodes[(victim+1)%len(c.nodes)].name
		if cur, err := other(); err != nil || cur == vname {
			c.MoveLeader(admin, otherAPI, otherNode, other)
		}
		progressed(100) // flowing again after the moves

		// The new leader announces itself with an advisory, which a
		// connection to a surviving node receives as it is elected; a
		// leader query answers only once a request meets the elected
		// leader, which overstates the election by up to a query timeout.
		watchIdx := (victim + 1) % len(c.nodes)
		watch := c.Connect(watchIdx)
		advisory := "$JS.EVENT.ADVISORY.CONSUMER.LEADER_ELECTED." + scheme.Stream() + "." + consumer
		if kind == "stream" {
			advisory = "$JS.EVENT.ADVISORY.STREAM.LEADER_ELECTED." + scheme.Stream()
		}
		electedCh := make(chan time.Time, 16)
		asub, err := watch.Subscribe(advisory, func(*nats.Msg) {
			select {
			case electedCh <- time.Now():
			default:
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := watch.Flush(); err != nil {
			t.Fatal(err)
		}

		// For a stream kill, a probe publishes to the stream every 20ms from
		// the surviving node, each attempt waiting 250ms for its ack: the
		// first ack of an attempt begun after the kill is when the stream
		// stores again, which a Send could reach at best.
		probeAck := make(chan time.Time, 1)
		var killNano atomic.Int64 // when the kill was sent; 0 before
		stopProbe := func() {}
		if kind == "stream" {
			pjs, _ := jetstream.New(watch)
			probeSubject, err := scheme.Direct("probe", string(wire.PriorityNormal), "prober")
			if err != nil {
				t.Fatal(err)
			}
			pctx, cancel := context.WithCancel(ctx)
			var probing sync.WaitGroup
			stopProbe = func() { cancel(); probing.Wait() }
			probing.Go(func() {
				for pctx.Err() == nil {
					actx, cancel := context.WithTimeout(pctx, 250*time.Millisecond)
					start := time.Now()
					_, err := pjs.Publish(actx, probeSubject, nil)
					cancel()
					if k := killNano.Load(); err == nil && k != 0 && start.UnixNano() > k {
						probeAck <- time.Now()
						return
					}
					select {
					case <-pctx.Done():
					case <-time.After(20 * time.Millisecond):
					}
				}
			})
		}

		killNano.Store(time.Now().UnixNano())
		kill := c.Kill(victim)
		newLeader, polled := c.WaitNewLeader(30*time.Second, vname, target)
		var elected time.Time
		electedOK := false
		select {
		case elected = <-electedCh:
			electedOK = true
		case <-time.After(5 * time.Second): // the advisory is best effort
		}
		asub.Unsubscribe()
		var stored time.Time
		storedOK := false
		if kind == "stream" {
			select {
			case stored = <-probeAck:
				storedOK = true
			case <-time.After(30 * time.Second):
			}
		}
		stopProbe()
		watch.Close()
		var a afterKill
		natstest.WaitFor(t, 60*time.Second, func() error {
			var ok bool
			if a, ok = tl.since(kill); !ok {
				return fmt.Errorf("%s leader %s killed: nothing sent after the kill handled yet", kind, vname)
			}
			return nil
		})
		tl.mu.Lock()
		hb, hbOK := first(tl.noHeartbeat, kill)
		rr, rrOK := first(tl.reconnects["receiver"], kill)
		sr, srOK := first(tl.reconnects["sender"], kill)
		tl.mu.Unlock()
		at := func(tm time.Time, ok bool) string {
			if !ok {
				return "-"
			}
			return "+" + tm.Sub(kill).Round(time.Millisecond).String()
		}
		t.Logf("%s run %d: %s leader %s killed (receiver on %s, sender on %s): new leader %s elected %s (advisory; leader query answered %s); stream stored a probe again %s; receiver re-pulled on missed heartbeats %s; reconnected: receiver %s, sender %s; first handled %s; first Send OK %s; slowest Send %v; %d Sends failed",
			v.name, (run+1)/2, kind, vname, rs, ss, newLeader, at(elected, electedOK), at(polled, true), at(stored, storedOK), at(hb, hbOK), at(rr, rrOK), at(sr, srOK),
			at(a.firstHandled, true), at(a.firstSendOK, true), a.slowestSend.Round(time.Millisecond), a.failedSends)

		c.Restart(victim)
		progressed(100)
	}

	stopSending()
	waitSender()
	_, sent := tl.counts()
	natstest.WaitForProgress(t, 60*time.Second, sent, "messages sent OK and handled", func() (int, error) {
		lost, _ := tl.check()
		return sent - len(lost), nil
	})
	lost, dups := tl.check()
	tl.mu.Lock()
	failed, other, otherNoHB := len(tl.sendErrs), len(tl.otherErrs), tl.otherNoHB
	var errSample []string
	for _, f := range tl.sendErrs[:min(3, len(tl.sendErrs))] {
		errSample = append(errSample, f.err.Error())
	}
	tl.mu.Unlock()
	t.Logf("%s: %d Sends OK, %d failed %v, %d lost, %d duplicate handler calls, %d missed-heartbeat re-pulls at other priorities, %d other receiver errors", v.name, sent, failed, errSample, len(lost), dups, otherNoHB, other)
	if len(lost) > 0 {
		t.Errorf("%d messages whose Send returned nil were never handled, e.g. %v", len(lost), lost[:min(5, len(lost))])
	}
}
