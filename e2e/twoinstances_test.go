//go:build linux

package e2e

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/internal/natstest"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// instanceLedger records which instance handled each message id.
type instanceLedger struct {
	mu      sync.Mutex
	calls   map[string][]int // message id → the instance of each handler call
	handled int              // distinct ids handled
}

func (l *instanceLedger) handler(instance int) func(context.Context, *agentkit.Message) error {
	return func(_ context.Context, m *agentkit.Message) error {
		l.mu.Lock()
		defer l.mu.Unlock()
		if len(l.calls[m.MessageID]) == 0 {
			l.handled++
		}
		l.calls[m.MessageID] = append(l.calls[m.MessageID], instance)
		return nil
	}
}

func (l *instanceLedger) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.handled
}

// tally returns, over ids, how many were never handled, and how many
// handler calls repeated an id: on the instance that had handled it
// already, and on the other one.
func (l *instanceLedger) tally(ids []string) (lost []string, same, cross int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, id := range ids {
		calls := l.calls[id]
		if len(calls) == 0 {
			lost = append(lost, id)
			continue
		}
		seen := map[int]bool{calls[0]: true}
		for _, inst := range calls[1:] {
			if seen[inst] {
				same++
			} else {
				cross++
			}
			seen[inst] = true
		}
	}
	return lost, same, cross
}

// sendConcurrently sends n "work" messages to worker from workers
// goroutines and returns the ids of those whose Send returned nil, and the
// errors of the others.
func sendConcurrently(sender *agentkit.Agent, n, workers int) (ok []string, failed []error) {
	var mu sync.Mutex
	var wg sync.WaitGroup
	next := make(chan int)
	for range workers {
		wg.Go(func() {
			for i := range next {
				// No deadline: the Send retries for its publish timeout.
				e, err := sender.Send(context.Background(), "worker", "work", map[string]int{"n": i})
				mu.Lock()
				if err == nil {
					ok = append(ok, e.MessageID)
				} else {
					failed = append(failed, err)
				}
				mu.Unlock()
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	return ok, failed
}

// TestProcessCluster_TwoInstancesDuplicates runs two instances of one
// agent, each on its own connection to its own node, while a sender sends
// 5,000 messages a run and the node leading the agent's consumer
// (odd runs) or the message stream (even runs) is killed with SIGKILL
// once a third of them are handled. No message whose Send returned nil may
// be lost. Duplicate handler calls are counted and logged, not asserted:
// the memory of handled messages is per instance, so a message redelivered
// after a leader change (its ack lost with the old leader) may reach the
// other instance and run again. AGENTMESH_DUP_RUNS sets the runs (default
// 2).
func TestProcessCluster_TwoInstancesDuplicates(t *testing.T) {
	const perRun = 5000
	c := runProcCluster(t, 3)
	runs := envInt(t, "AGENTMESH_DUP_RUNS", 2)
	admin := c.Connect(2)
	js, _ := jetstream.New(admin)
	scheme, _ := subjects.New("dup")
	natstest.WaitFor(t, 30*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return agentkit.EnsureStream(ctx, js, agentkit.StreamConfig(scheme, 3))
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// Short ack timeouts, so a delivery whose ack died with a leader comes
	// back within the run, and enough attempts that none is exhausted.
	policy := agentkit.DeliveryPolicy{BackOff: []time.Duration{2 * time.Second, 4 * time.Second}, MaxDeliver: 10}
	opts := []agentkit.Option{agentkit.WithScheme(scheme), agentkit.WithReplicas(3), agentkit.WithRegistration(false),
		agentkit.WithPolicy(wire.PriorityNormal, policy), agentkit.WithPublishTimeout(30 * time.Second)}
	var errMu sync.Mutex
	asyncErrs := map[string]int{}
	onErr := func(err error) {
		key := "other"
		if errors.Is(err, jetstream.ErrNoHeartbeat) {
			key = "missed heartbeats"
		}
		errMu.Lock()
		asyncErrs[key]++
		errMu.Unlock()
	}
	l := &instanceLedger{calls: map[string][]int{}}
	var instances []*agentkit.Agent
	for i := range 2 {
		a, err := agentkit.New(c.Connect(i, nats.ReconnectWait(50*time.Millisecond)), "worker",
			append(slices.Clone(opts), agentkit.WithErrorHandler(onErr))...)
		if err != nil {
			t.Fatal(err)
		}
		defer a.Stop()
		a.HandleFunc("work", l.handler(i))
		natstest.WaitFor(t, 30*time.Second, func() error { return a.Start(ctx) })
		instances = append(instances, a)
	}
	sender, err := agentkit.New(c.Connect(2, nats.ReconnectWait(50*time.Millisecond)), "sender", opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer sender.Stop()

	consumer, _ := scheme.Consumer("worker", string(wire.PriorityNormal))
	streamLeader := func() (string, error) { return c.StreamLeader(js, scheme.Stream()) }
	consumerLeader := func() (string, error) { return c.ConsumerLeader(js, scheme.Stream(), consumer) }
	settled := func() error {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		info, err := instances[0].ConsumerInfo(cctx, wire.PriorityNormal)
		if err != nil {
			return err
		}
		if info.NumAckPending != 0 || info.NumPending != 0 {
			return fmt.Errorf("%d ack pending, %d pending", info.NumAckPending, info.NumPending)
		}
		return nil
	}

	var totalSame, totalCross, totalSent, totalFailed int
	for run := 1; run <= runs; run++ {
		kind, target, other := "consumer", consumerLeader, streamLeader
		targetAPI, otherAPI := consumerStepDown(scheme, consumer), streamStepDown(scheme)
		if run%2 == 0 {
			kind, target, other = "stream", streamLeader, consumerLeader
			targetAPI, otherAPI = otherAPI, targetAPI
		}
		// The killed node leads only the group under test.
		var victimName string
		natstest.WaitFor(t, 30*time.Second, func() error {
			var err error
			victimName, err = target()
			return err
		})
		victim := c.Index(victimName)
		if cur, err := other(); err != nil || cur == victimName {
			c.MoveLeader(admin, otherAPI, c.nodes[(victim+1)%len(c.nodes)].name, other)
		}
		// The new leader is watched from a surviving node: the admin's
		// connection may be on the victim.
		watch := c.Connect((victim + 1) % len(c.nodes))
		wjs, _ := jetstream.New(watch)
		watchTarget := func() (string, error) { return c.ConsumerLeader(wjs, scheme.Stream(), consumer) }
		if kind == "stream" {
			watchTarget = func() (string, error) { return c.StreamLeader(wjs, scheme.Stream()) }
		}

		base := l.count()
		type result struct {
			ok     []string
			failed []error
		}
		sent := make(chan result, 1)
		go func() {
			ok, failed := sendConcurrently(sender, perRun, 8)
			sent <- result{ok, failed}
		}()
		natstest.WaitForProgress(t, 30*time.Second, base+perRun/3, "messages handled before the kill", func() (int, error) {
			return l.count(), nil
		})
		atKill := l.count() - base
		kill := c.Kill(victim)
		newLeader, elected := c.WaitNewLeader(30*time.Second, victimName, watchTarget)
		watch.Close()
		var res result
		select {
		case res = <-sent:
		case <-time.After(120 * time.Second):
			t.Fatalf("run %d: sends still running 120s after the kill", run)
		}
		natstest.WaitForProgress(t, 30*time.Second, len(res.ok), "messages sent OK and handled", func() (int, error) {
			lost, _, _ := l.tally(res.ok)
			return len(res.ok) - len(lost), nil
		})
		c.Restart(victim)
		// Nothing may be left to redeliver before duplicates are counted.
		natstest.WaitFor(t, 60*time.Second, settled)
		lost, same, cross := l.tally(res.ok)
		t.Logf("run %d: %s leader %s killed with %d of %d handled; new leader %s after %v; %d Sends OK, %d failed; %d lost; duplicate handler calls: %d on the other instance, %d on the same one",
			run, kind, victimName, atKill, perRun, newLeader, elected.Sub(kill).Round(time.Millisecond), len(res.ok), len(res.failed), len(lost), cross, same)
		if len(lost) > 0 {
			t.Errorf("run %d: %d messages whose Send returned nil were never handled, e.g. %v", run, len(lost), lost[:min(5, len(lost))])
		}
		if len(res.failed) > 0 {
			t.Logf("run %d: e.g. %v", run, res.failed[0])
		}
		totalSame, totalCross, totalSent, totalFailed = totalSame+same, totalCross+cross, totalSent+len(res.ok), totalFailed+len(res.failed)
	}
	var outcomes []string
	for i, a := range instances {
		st := a.Stats()
		outcomes = append(outcomes, fmt.Sprintf("instance %d: %d acked, %d redeliveries absorbed", i, st.Outcomes[agentkit.OutcomeAck], st.Outcomes[agentkit.OutcomeDuplicate]))
	}
	errMu.Lock()
	defer errMu.Unlock()
	t.Logf("%d runs: %d Sends OK, %d failed; duplicate handler calls: %d on the other instance, %d on the same one; %s; background errors %v",
		runs, totalSent, totalFailed, totalCross, totalSame, strings.Join(outcomes, "; "), asyncErrs)
}
