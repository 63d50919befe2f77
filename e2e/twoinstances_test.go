//go:build linux

package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/registry"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/internal/natstest"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// handlerRun is one call of the handler.
type handlerRun struct {
	instance int
	delivery uint64 // the delivery attempt the handler saw
}

// taskOrder follows the handler runs of one task's messages, numbered
// from 1 in the order they were sent.
type taskOrder struct {
	last       int // the highest number handled so far
	outOfOrder int // first deliveries run after a later message of the task
	late       int // redeliveries run for the first time after a later message
	instances  map[int]bool
	examples   []string
}

// instanceLedger records the handler runs of both instances: which
// instance ran each message id on which delivery, in which order each
// task's messages ran, and when every run began.
type instanceLedger struct {
	mu      sync.Mutex
	calls   map[string][]handlerRun // message id → its handler runs
	tasks   map[string]*taskOrder
	handled int         // distinct ids handled
	began   []time.Time // when each handler run began, in order
}

func newInstanceLedger() *instanceLedger {
	return &instanceLedger{calls: map[string][]handlerRun{}, tasks: map[string]*taskOrder{}}
}

func (l *instanceLedger) handler(instance int) func(context.Context, *agentkit.Message) error {
	return func(_ context.Context, m *agentkit.Message) error {
		var p struct {
			N int `json:"n"`
		}
		_ = m.DecodePayload(&p) // the sender always sends one; 0 counts as out of order
		l.mu.Lock()
		defer l.mu.Unlock()
		l.began = append(l.began, time.Now())
		first := len(l.calls[m.MessageID]) == 0
		l.calls[m.MessageID] = append(l.calls[m.MessageID], handlerRun{instance, m.Delivery})
		task := l.tasks[m.TaskID]
		if task == nil {
			task = &taskOrder{instances: map[int]bool{}}
			l.tasks[m.TaskID] = task
		}
		task.instances[instance] = true
		if !first {
			return nil // a duplicate: tally counts it
		}
		l.handled++
		if p.N < task.last {
			// JetStream redelivers a message lost in flight after its ack
			// wait, behind the task's later messages; a first delivery
			// must come in stream order.
			if m.Delivery > 1 {
				task.late++
			} else {
				task.outOfOrder++
			}
			if len(task.examples) < 3 {
				task.examples = append(task.examples, fmt.Sprintf("%s: #%d (delivery %d, instance %d) after #%d", m.TaskID, p.N, m.Delivery, instance, task.last))
			}
		}
		task.last = max(task.last, p.N)
		return nil
	}
}

func (l *instanceLedger) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.handled
}

// tally returns, over ids, how many were never handled, how many handler
// calls repeated an id (on the instance that had run it already, and on
// the other one), and how many handler calls each instance made.
func (l *instanceLedger) tally(ids []string) (lost []string, same, cross int, perInstance [2]int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, id := range ids {
		calls := l.calls[id]
		if len(calls) == 0 {
			lost = append(lost, id)
			continue
		}
		seen := map[int]bool{}
		for i, c := range calls {
			perInstance[c.instance]++
			switch {
			case i == 0:
			case seen[c.instance]:
				same++
			default:
				cross++
			}
			seen[c.instance] = true
		}
	}
	return lost, same, cross, perInstance
}

// order sums the order counts of the tasks named in tasks and returns a
// few examples of messages run after a later one of their task, and how
// many tasks ran on both instances.
func (l *instanceLedger) order(tasks []string) (outOfOrder, late, split int, examples []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, id := range tasks {
		task := l.tasks[id]
		if task == nil {
			continue
		}
		outOfOrder, late = outOfOrder+task.outOfOrder, late+task.late
		if len(task.instances) > 1 {
			split++
		}
		if len(examples) < 5 {
			examples = append(examples, task.examples...)
		}
	}
	return outOfOrder, late, split, examples
}

// runStarts returns when the handler runs began, from the first at or
// after from.
func (l *instanceLedger) runStarts(from time.Time) []time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	i, _ := slices.BinarySearchFunc(l.began, from, time.Time.Compare)
	return slices.Clone(l.began[i:])
}

// longestGap returns the longest time without any of times between from
// and until, and when it began.
func longestGap(from, until time.Time, times []time.Time) (gap time.Duration, at time.Time) {
	prev := from
	for _, t := range append(slices.Clone(times), until) {
		if t.Before(from) {
			continue
		}
		if t.After(until) {
			t = until
		}
		if d := t.Sub(prev); d > gap {
			gap, at = d, prev
		}
		if !t.Before(until) {
			break
		}
		prev = t
	}
	return gap, at
}

// sendTasks sends n "work" messages to worker as tasks tasks, named
// prefix-0 and on: each task's messages, numbered from 1 in their payload,
// one after another from one goroutine, the tasks in parallel, so the
// stream holds each task's messages in order. It returns the ids of the
// messages whose Send returned nil, the errors of the others, and when
// each Send returned.
func sendTasks(sender *agentkit.Agent, prefix string, n, tasks int) (ok []string, failed []error, done []time.Time) {
	var mu sync.Mutex
	var wg sync.WaitGroup
	for task := range tasks {
		wg.Go(func() {
			id := fmt.Sprintf("%s-%d", prefix, task)
			for k := 1; k <= n/tasks; k++ {
				// No deadline: the Send retries for its publish timeout.
				e, err := sender.Send(context.Background(), "worker", "work", map[string]int{"n": k}, agentkit.WithTaskID(id))
				mu.Lock()
				if err == nil {
					ok = append(ok, e.MessageID)
				} else {
					failed = append(failed, err)
				}
				done = append(done, time.Now())
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	slices.SortFunc(done, time.Time.Compare)
	return ok, failed, done
}

// turnsLog keeps the lines an instance's logger writes about its turn
// (consuming, standing by), each with its time, and when the instance
// began and stopped consuming.
type turnsLog struct {
	mu       sync.Mutex
	lines    []string
	switches []turnSwitch
}

// turnSwitch is an instance beginning (on) or ending its turn.
type turnSwitch struct {
	at time.Time
	on bool
}

func (w *turnsLog) Write(p []byte) (int, error) {
	if !bytes.Contains(p, []byte(`msg="instance `)) {
		return len(p), nil
	}
	line := string(bytes.TrimSpace(p))
	w.mu.Lock()
	defer w.mu.Unlock()
	w.lines = append(w.lines, line)
	stamp, _, _ := strings.Cut(strings.TrimPrefix(line, "time="), " ")
	if at, err := time.Parse(time.RFC3339Nano, stamp); err == nil {
		w.switches = append(w.switches, turnSwitch{at, strings.Contains(line, `msg="instance consumes`)})
	}
	return len(p), nil
}

// bothConsumed returns the times, up to now, when both instances
// consumed at once, by what they logged.
func bothConsumed(logs []*turnsLog, now time.Time) (spans [][2]time.Time) {
	type change struct {
		turnSwitch
		instance int
	}
	var all []change
	for i, w := range logs {
		w.mu.Lock()
		for _, sw := range w.switches {
			all = append(all, change{sw, i})
		}
		w.mu.Unlock()
	}
	slices.SortStableFunc(all, func(a, b change) int { return a.at.Compare(b.at) })
	on := make([]bool, len(logs))
	var since time.Time
	both := false
	for _, c := range all {
		on[c.instance] = c.on
		together := !slices.Contains(on, false)
		if together && !both {
			since = c.at
		} else if !together && both {
			spans = append(spans, [2]time.Time{since, c.at})
		}
		both = together
	}
	if both {
		spans = append(spans, [2]time.Time{since, now})
	}
	return spans
}

// since returns the lines from the n-th on, and how many there are.
func (w *turnsLog) since(n int) ([]string, int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.lines[n:]), len(w.lines)
}

// viewLog records when an instance's registry view applied a change of
// the agent's records: each instance renews its own every heartbeat, so
// a long silence is a view that stopped following the bucket.
type viewLog struct {
	mu     sync.Mutex
	at     []time.Time
	events []string
}

func (v *viewLog) follow(ctx context.Context, view *registry.View, agent string) {
	for ev := range view.Watch(ctx) {
		if ev.Agent.ID == agent {
			now := time.Now()
			v.mu.Lock()
			v.at = append(v.at, now)
			v.events = append(v.events, fmt.Sprintf("%s: %d live, status %s, last heartbeat %s", now.UTC().Format("15:04:05.000"),
				ev.Agent.Instances, ev.Agent.Status, ev.Agent.LastHeartbeat.UTC().Format("15:04:05.000")))
			v.mu.Unlock()
		}
	}
}

// between returns when the view applied changes, and what it showed
// then, from from to until.
func (v *viewLog) between(from, until time.Time) (at []time.Time, events []string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	for i, t := range v.at {
		if !t.Before(from) && !t.After(until) {
			at, events = append(at, t), append(events, v.events[i])
		}
	}
	return at, events
}

// TestProcessCluster_TwoInstancesDuplicates runs two instances of one
// agent, registered in an R3 registry and taking turns, each on its own
// connection to its own node, while a sender sends 5,000 messages a run as
// 50 tasks of 100, and the node leading the agent's consumer (odd runs) or
// the message stream (even runs) is killed with SIGKILL once a third of
// them are handled. Exactly one instance consumes. It proves that across
// the instances no message whose Send returned nil is lost, none runs its
// handler twice (a redelivery after a leader change lost an ack comes back
// to the instance that ran it, whose handled set absorbs it), and a task's
// first deliveries run in the order they were sent; a redelivery of a
// message lost in flight may run after its task's later messages, and is
// counted. The consuming instance may stand by for a while when the kill
// keeps its registry record unrenewed; handling must resume. Each run logs
// the instances' turns, any time both consumed at once, and how long each
// instance's registry view went without news of the agent's records.
//
// AGENTMESH_DUP_RUNS sets the runs (default 2). AGENTMESH_DUP_CONCURRENT=1
// runs the instances with [agentkit.WithConcurrentInstances], sharing the
// consumer: duplicates and order violations are then logged, not asserted.
func TestProcessCluster_TwoInstancesDuplicates(t *testing.T) {
	const perRun, tasks = 5000, 50
	c := runProcCluster(t, 3)
	runs := envInt(t, "AGENTMESH_DUP_RUNS", 2)
	concurrent := os.Getenv("AGENTMESH_DUP_CONCURRENT") == "1"
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
	opts := []agentkit.Option{agentkit.WithScheme(scheme), agentkit.WithReplicas(3),
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
	l := newInstanceLedger()
	var instances []*agentkit.Agent
	var turnLogs []*turnsLog
	var viewLogs []*viewLog
	for i := range 2 {
		// The instances register (the registry bucket is created R3, as
		// the stream is) and take turns, unless told to share.
		w := &turnsLog{}
		iopts := append(slices.Clone(opts), agentkit.WithErrorHandler(onErr),
			agentkit.WithLogger(slog.New(slog.NewTextHandler(w, nil))))
		if concurrent {
			iopts = append(iopts, agentkit.WithConcurrentInstances())
		}
		a, err := agentkit.New(c.Connect(i, nats.ReconnectWait(50*time.Millisecond)), "worker", iopts...)
		if err != nil {
			t.Fatal(err)
		}
		defer a.Stop()
		a.HandleFunc("work", l.handler(i))
		natstest.WaitFor(t, 30*time.Second, func() error { return a.Start(ctx) })
		instances = append(instances, a)
		turnLogs = append(turnLogs, w)
		v := &viewLog{}
		go v.follow(ctx, a.Registry(), "worker")
		viewLogs = append(viewLogs, v)
	}
	checkRegistry(t, js, scheme)
	sender, err := agentkit.New(c.Connect(2, nats.ReconnectWait(50*time.Millisecond)), "sender",
		append(slices.Clone(opts), agentkit.WithRegistration(false))...)
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
	// consuming waits until the instances consume as they should: one of
	// them taking turns, both sharing.
	consuming := func(what string) string {
		var got string
		natstest.Eventually(t, 60*time.Second, what, func() bool {
			a, b := instances[0].Consuming(), instances[1].Consuming()
			got = fmt.Sprintf("consuming: instance 0 %v, instance 1 %v", a, b)
			if concurrent {
				return a && b
			}
			return a != b
		})
		return got
	}
	absorbed := func() (n [2]uint64) {
		for i, a := range instances {
			n[i] = a.Stats().Outcomes[agentkit.OutcomeDuplicate]
		}
		return n
	}
	logged := make([]int, len(turnLogs))
	flushTurns := func(label string) {
		for i, w := range turnLogs {
			var lines []string
			lines, logged[i] = w.since(logged[i])
			for _, line := range lines {
				t.Logf("%s: instance %d: %s", label, i, line)
			}
		}
	}
	t.Logf("before the runs: %s", consuming("the instances to settle their turns"))
	flushTurns("before the runs")
	defer func() {
		if t.Failed() { // a run that stops early has not logged its turns yet
			flushTurns("at the failure")
			t.Logf("at the failure: consuming: instance 0 %v, instance 1 %v", instances[0].Consuming(), instances[1].Consuming())
		}
	}()
	lastReport := time.Now()

	var totalSame, totalCross, totalSent, totalFailed, totalOutOfOrder, totalLate int
	for run := 1; run <= runs; run++ {
		kind, target, other := "consumer", consumerLeader, streamLeader
		targetAPI, otherAPI := consumerStepDown(scheme, consumer), streamStepDown(scheme)
		if run%2 == 0 {
			kind, target, other = "stream", streamLeader, consumerLeader
			targetAPI, otherAPI = otherAPI, targetAPI
		}
		before := consuming(fmt.Sprintf("run %d: the instances' turns before the kill", run))
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

		base, absorbedBefore := l.count(), absorbed()
		prefix := fmt.Sprintf("run%d", run)
		runTasks := make([]string, tasks)
		for i := range runTasks {
			runTasks[i] = fmt.Sprintf("%s-%d", prefix, i)
		}
		type result struct {
			ok     []string
			failed []error
			done   []time.Time
		}
		sent := make(chan result, 1)
		go func() {
			ok, failed, done := sendTasks(sender, prefix, perRun, tasks)
			sent <- result{ok, failed, done}
		}()
		natstest.WaitForProgress(t, 30*time.Second, base+perRun/3, "messages handled before the kill", func() (int, error) {
			return l.count(), nil
		})
		atKill := l.count() - base
		regLeader, _ := c.StreamLeader(js, "KV_"+scheme.RegistryBucket())
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
			lost, _, _, _ := l.tally(res.ok)
			return len(res.ok) - len(lost), nil
		})
		allHandled := time.Now()
		c.Restart(victim)
		// Nothing may be left to redeliver before duplicates are counted.
		natstest.WaitFor(t, 60*time.Second, settled)
		lost, same, cross, perInstance := l.tally(res.ok)
		outOfOrder, late, split, examples := l.order(runTasks)
		absorbedAfter := absorbed()
		handleGap, handleGapAt := longestGap(kill, allHandled, l.runStarts(kill))
		sendGap, sendGapAt := longestGap(kill, res.done[len(res.done)-1], res.done)
		t.Logf("run %d: %s leader %s killed with %d of %d handled; new leader %s after %v; %d Sends OK, %d failed; %d lost",
			run, kind, victimName, atKill, perRun, newLeader, elected.Sub(kill).Round(time.Millisecond), len(res.ok), len(res.failed), len(lost))
		t.Logf("run %d: duplicate handler calls: %d on the other instance, %d on the same one; out-of-order first deliveries %d; late redeliveries %d; redeliveries absorbed: instance 0 %d, instance 1 %d",
			run, cross, same, outOfOrder, late, absorbedAfter[0]-absorbedBefore[0], absorbedAfter[1]-absorbedBefore[1])
		t.Logf("run %d: handler calls: instance 0 %d, instance 1 %d; tasks run on both instances %d; %s before the kill; longest handling gap %v from kill+%v; longest gap between Sends returning %v from kill+%v",
			run, perInstance[0], perInstance[1], split, before, handleGap.Round(time.Millisecond), handleGapAt.Sub(kill).Round(time.Millisecond),
			sendGap.Round(time.Millisecond), sendGapAt.Sub(kill).Round(time.Millisecond))
		settledAt := time.Now()
		views := ""
		for i, v := range viewLogs {
			// From a heartbeat before the kill: a view may have stopped
			// following the bucket before it.
			at, events := v.between(kill.Add(-10*time.Second), settledAt)
			gap, from := longestGap(kill.Add(-10*time.Second), settledAt, at)
			still := ""
			if !from.Add(gap).Before(settledAt) {
				still = " (still silent when the run settled)"
			}
			views += fmt.Sprintf("; instance %d's view silent for %v from kill%+v%s", i, gap.Round(time.Millisecond), from.Sub(kill).Round(time.Millisecond), still)
			if !concurrent && perInstance[0] > 0 && perInstance[1] > 0 {
				// Both consumed: what each view showed of the turns.
				for _, e := range events {
					t.Logf("run %d: instance %d's view: %s", run, i, e)
				}
			}
		}
		t.Logf("run %d: killed at %s; registry stream leader %s%s", run, kill.UTC().Format("15:04:05.000"), regLeader, views)
		flushTurns(fmt.Sprintf("run %d", run))
		if !concurrent {
			// The registry views decide the turns: one that stopped
			// following the bucket may take a live elder for gone.
			for _, span := range bothConsumed(turnLogs, time.Now()) {
				if span[1].After(lastReport) {
					t.Logf("run %d: both instances consumed for %v from kill%+v", run, span[1].Sub(span[0]).Round(time.Millisecond), span[0].Sub(kill).Round(time.Millisecond))
				}
			}
			lastReport = time.Now()
		}
		for _, e := range examples {
			t.Logf("run %d: e.g. %s", run, e)
		}
		if len(lost) > 0 {
			t.Errorf("run %d: %d messages whose Send returned nil were never handled, e.g. %v", run, len(lost), lost[:min(5, len(lost))])
		}
		if !concurrent && (same+cross > 0 || outOfOrder > 0) {
			t.Errorf("run %d: instances taking turns ran %d handler calls again and %d first deliveries out of their task's order", run, same+cross, outOfOrder)
		}
		if len(res.failed) > 0 {
			t.Logf("run %d: e.g. %v", run, res.failed[0])
		}
		totalSame, totalCross, totalSent, totalFailed = totalSame+same, totalCross+cross, totalSent+len(res.ok), totalFailed+len(res.failed)
		totalOutOfOrder, totalLate = totalOutOfOrder+outOfOrder, totalLate+late
	}
	var outcomes []string
	for i, a := range instances {
		st := a.Stats()
		outcomes = append(outcomes, fmt.Sprintf("instance %d: %d acked, %d redeliveries absorbed", i, st.Outcomes[agentkit.OutcomeAck], st.Outcomes[agentkit.OutcomeDuplicate]))
	}
	errMu.Lock()
	defer errMu.Unlock()
	t.Logf("%d runs (concurrent instances %v): %d Sends OK, %d failed; duplicate handler calls: %d on the other instance, %d on the same one; out-of-order first deliveries %d; late redeliveries %d; %s; background errors %v",
		runs, concurrent, totalSent, totalFailed, totalCross, totalSame, totalOutOfOrder, totalLate, strings.Join(outcomes, "; "), asyncErrs)
}

// checkRegistry fails the test unless the registry bucket is replicated
// as the stream is: the turns must survive the node kills.
func checkRegistry(t *testing.T, js jetstream.JetStream, scheme subjects.Scheme) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kv, err := js.KeyValue(ctx, scheme.RegistryBucket())
	if err != nil {
		t.Fatalf("registry bucket: %v", err)
	}
	st, err := kv.Status(ctx)
	if err != nil {
		t.Fatalf("registry bucket: %v", err)
	}
	if r := st.(*jetstream.KeyValueBucketStatus).StreamInfo().Config.Replicas; r != 3 {
		t.Fatalf("registry bucket has %d replicas, want 3", r)
	}
}
