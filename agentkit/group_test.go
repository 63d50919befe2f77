package agentkit_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// groupAgent starts agent id in g on nc with a recording handler of action
// "work".
func groupAgent(t *testing.T, nc *nats.Conn, g *agentkit.Group, id string, rec *recorder, opts ...agentkit.Option) *agentkit.Agent {
	t.Helper()
	a, err := agentkit.New(nc, id, append([]agentkit.Option{agentkit.WithGroup(g), agentkit.WithFanoutActions()}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Stop)
	if err := a.Handle("work", rec.handle(nil)); err != nil {
		t.Fatal(err)
	}
	if err := a.Start(ctx(t)); err != nil {
		t.Fatalf("Start(%s): %v", id, err)
	}
	return a
}

// newGroup returns group name on nc, closed when the test ends (after the
// agents the test started later stop: cleanups run last first).
func newGroup(t *testing.T, nc *nats.Conn, name string, opts ...agentkit.GroupOption) *agentkit.Group {
	t.Helper()
	g, err := agentkit.NewGroup(nc, name, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Close)
	return g
}

// consumerNames returns the names of MESH's consumers.
func consumerNames(t *testing.T, nc *nats.Conn) []string {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(ctx(t), subjects.Default.Stream())
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	l := st.ConsumerNames(ctx(t))
	for n := range l.Name() {
		names = append(names, n)
	}
	if err := l.Err(); err != nil {
		t.Fatal(err)
	}
	slices.Sort(names)
	return names
}

func TestGroup_AgentsShareFiveConsumers(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	nc := m.conn()
	g := newGroup(t, nc, "proc1")
	recs := map[string]*recorder{}
	for i := range 3 {
		id := fmt.Sprintf("w%d", i)
		recs[id] = &recorder{}
		groupAgent(t, nc, g, id, recs[id])
	}
	sender := m.started("boss", nil, agentkit.WithFanoutActions())
	sent := map[string]string{} // message id → receiver
	for i := range 30 {
		to := fmt.Sprintf("w%d", i%3)
		env, err := sender.Send(ctx(t), to, "work", nil, agentkit.WithPriority(priorities[i%len(priorities)]))
		if err != nil {
			t.Fatal(err)
		}
		sent[env.MessageID] = to
	}
	eventually(t, 10*time.Second, "30 messages handled", func() bool {
		n := 0
		for _, r := range recs {
			n += r.count()
		}
		return n == 30
	})
	for id, r := range recs {
		for mid, n := range r.ids() {
			if n != 1 || sent[mid] != id {
				t.Errorf("%s handled %s %d times; it was sent to %s", id, mid, n, sent[mid])
			}
		}
	}
	var group, own []string
	for _, n := range consumerNames(t, nc) {
		c, err := subjects.Default.ParseConsumerName(n)
		switch {
		case err != nil:
		case c.Group != "":
			group = append(group, n)
		case c.Agent != "boss":
			own = append(own, n)
		}
	}
	if len(group) != 5 || len(own) != 0 {
		t.Errorf("consumers: group %q, agents' own %q; want the group's five only", group, own)
	}
}

var priorities = []wire.Priority{wire.PriorityCritical, wire.PriorityHigh, wire.PriorityNormal, wire.PriorityLow, wire.PriorityBatch}

// Messages sent before an agent first joins are delivered by its own
// consumer, which is deleted once it caught up; nothing is handled twice.
func TestGroup_CatchUpDeliversEarlierMessages(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	nc := m.conn()
	sender := m.started("boss", nil, agentkit.WithFanoutActions())
	g := newGroup(t, nc, "proc1")
	var first recorder
	groupAgent(t, nc, g, "first", &first) // the group's consumers exist before "late" joins

	// "late" ran with consumers of its own and left one message unhandled,
	// and two more came while nothing ran.
	var own recorder
	late := m.started("late", map[string]agentkit.HandlerFunc{"work": own.handle(nil)}, agentkit.WithFanoutActions())
	before, err := sender.Send(ctx(t), "late", "work", nil)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the first message acked on late's own consumers", func() bool {
		return late.Stats().Outcomes[agentkit.OutcomeAck] == 1
	})
	late.Stop()
	var early []string
	for range 2 {
		env, err := sender.Send(ctx(t), "late", "work", nil)
		if err != nil {
			t.Fatal(err)
		}
		early = append(early, env.MessageID)
	}

	var rec recorder
	groupAgent(t, nc, g, "late", &rec)
	var after []string
	for range 3 {
		env, err := sender.Send(ctx(t), "late", "work", nil)
		if err != nil {
			t.Fatal(err)
		}
		after = append(after, env.MessageID)
	}
	defer func() {
		t.Logf("handled %v early %v after %v; consumers %v", rec.ids(), early, after, consumerNames(t, nc))
	}()
	eventually(t, 10*time.Second, "the two earlier and three later messages", func() bool { return rec.count() == 5 })
	for _, id := range append(early, after...) {
		if n := rec.ids()[id]; n != 1 {
			t.Errorf("message %s handled %d times in the group", id, n)
		}
	}
	if n := rec.ids()[before.MessageID]; n != 0 {
		t.Errorf("the message handled before joining was handled again, %d times", n)
	}
	eventually(t, 15*time.Second, "the catch-up consumer deleted", func() bool {
		return !slices.Contains(consumerNames(t, nc), "late_normal")
	})
}

// A member that is not running has its messages held, and handles them
// when it runs again.
func TestGroup_HoldsMessagesOfStoppedMember(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	nc := m.conn()
	g := newGroup(t, nc, "proc1")
	var a, b1 recorder
	groupAgent(t, nc, g, "a", &a)
	bAgent := groupAgent(t, nc, g, "b", &b1)
	if err := bAgent.Drain(ctx(t)); err != nil {
		t.Fatal(err)
	}
	sender := m.started("boss", nil, agentkit.WithFanoutActions())
	for _, to := range []string{"b", "a", "b"} {
		if _, err := sender.Send(ctx(t), to, "work", nil); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 10*time.Second, "a's message", func() bool { return a.count() == 1 })
	var b2 recorder
	groupAgent(t, nc, g, "b", &b2)
	eventually(t, 10*time.Second, "b's two messages after its restart", func() bool { return b2.count() == 2 })
	if b1.count() != 0 {
		t.Errorf("the stopped b handled %d messages", b1.count())
	}
}

func TestGroup_RefusesDifferentPolicy(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	nc := m.conn()
	g := newGroup(t, nc, "proc1")
	var rec recorder
	groupAgent(t, nc, g, "a", &rec)
	b, err := agentkit.New(nc, "b", agentkit.WithGroup(g), agentkit.WithPolicy(wire.PriorityNormal, fastPolicy(time.Second, 2*time.Second)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Stop)
	if err := b.Start(ctx(t)); !errors.Is(err, agentkit.ErrInvalidOption) {
		t.Errorf("Start with another policy than the group's: %v, want ErrInvalidOption", err)
	}
}

// Two processes running the same group and agents split the agents'
// messages between them, each handled once.
func TestGroup_TwoProcessesShareTheWork(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	recs := map[string]*recorder{}
	for p := range 2 {
		nc := m.conn()
		g := newGroup(t, nc, "pool")
		for _, id := range []string{"x", "y"} {
			rec := &recorder{}
			recs[fmt.Sprintf("%s@%d", id, p)] = rec
			groupAgent(t, nc, g, id, rec)
		}
	}
	sender := m.started("boss", nil, agentkit.WithFanoutActions())
	const n = 200
	for i := range n {
		if _, err := sender.Send(ctx(t), []string{"x", "y"}[i%2], "work", nil); err != nil {
			t.Fatal(err)
		}
	}
	total := func() (int, map[string]int) {
		all := map[string]int{}
		for _, r := range recs {
			for id, k := range r.ids() {
				all[id] += k
			}
		}
		return len(all), all
	}
	eventually(t, 15*time.Second, "every message handled", func() bool { k, _ := total(); return k == n })
	_, all := total()
	for id, k := range all {
		if k != 1 {
			t.Errorf("message %s handled %d times", id, k)
		}
	}
}

// A forged Nats-Pin-Id on a member's message is terminated as for an agent
// with consumers of its own, and the group's feed goes on reading.
func TestGroup_ForgedPinID(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	adv := m.watchAdvisories()
	nc := m.conn()
	g := newGroup(t, nc, "proc1")
	var rec, other recorder
	recv := groupAgent(t, nc, g, "recv", &rec)
	groupAgent(t, nc, g, "other", &other)
	forgePin(t, m, adv, "recv")
	sender := m.agent("sender")
	for i := range 3 {
		if _, err := sender.Send(ctx(t), "other", "work", nil); err != nil {
			t.Fatal(err)
		}
		eventually(t, 20*time.Second, "a group-mate's message after the forged pin", func() bool { return other.count() == i+1 })
	}
	if err := recv.Err(); err != nil {
		t.Fatalf("Err() = %v", err)
	}
}

// Close gives back at once what the group holds for agents not running.
func TestGroup_CloseGivesBackHeldMessages(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	adv := m.watchAdvisories()
	nc := m.conn()
	g, err := agentkit.NewGroup(nc, "proc1")
	if err != nil {
		t.Fatal(err)
	}
	var a, b recorder
	groupAgent(t, nc, g, "a", &a)
	bAgent := groupAgent(t, nc, g, "b", &b)
	bAgent.Stop()
	sender := m.started("boss", nil, agentkit.WithFanoutActions())
	if _, err := sender.Send(ctx(t), "b", "work", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := sender.Send(ctx(t), "a", "work", nil); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "a's message, after b's in the stream", func() bool { return a.count() == 1 })
	g.Close()
	eventually(t, 10*time.Second, "b's message NAKed", func() bool { return len(adv.of(subjects.EventNak, 0)) == 1 })
	if b.count() != 0 {
		t.Errorf("the stopped b handled %d messages", b.count())
	}
}

// A group pulls only what its buffer has room for: behind busy handlers
// the server keeps the rest, and everything is handled once they free up.
func TestGroup_BufferBoundsWhatIsPulled(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	nc := m.conn()
	const buffer = 4
	g := newGroup(t, nc, "proc1", agentkit.WithGroupBuffer(buffer))
	release := make(chan struct{})
	var handled recorder
	a, err := agentkit.New(nc, "slow", agentkit.WithGroup(g), agentkit.WithFanoutActions(), agentkit.WithConcurrency(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Stop)
	if err := a.HandleFunc("work", func(ctx context.Context, m *agentkit.Message) error {
		select {
		case <-release:
		case <-ctx.Done():
			return ctx.Err()
		}
		return handled.handle(nil)(ctx, m)
	}); err != nil {
		t.Fatal(err)
	}
	if err := a.Start(ctx(t)); err != nil {
		t.Fatal(err)
	}
	sender := m.started("boss", nil, agentkit.WithFanoutActions())
	const n = 30
	for range n {
		if _, err := sender.Send(ctx(t), "slow", "work", nil); err != nil {
			t.Fatal(err)
		}
	}
	// At most: the buffer, a message in the normal queue (one per
	// worker: concurrency 1), one in the reader's hand and one per worker
	// running (two: the critical worker takes normal too when idle).
	const most = buffer + 1 + 1 + 2
	var info *jetstream.ConsumerInfo
	eventually(t, 10*time.Second, "the feed to stop pulling", func() bool {
		info, err = a.ConsumerInfo(ctx(t), wire.PriorityNormal)
		return err == nil && info.NumAckPending > 0 && info.NumAckPending+int(info.NumPending) == n
	})
	for range 3 { // and it stays stopped while the handlers are busy
		if info, err = a.ConsumerInfo(ctx(t), wire.PriorityNormal); err != nil {
			t.Fatal(err)
		}
		if info.NumAckPending > most {
			t.Fatalf("%d messages pulled with every handler busy, want at most %d", info.NumAckPending, most)
		}
		time.Sleep(100 * time.Millisecond) // a window for a pull that should not come; not a synchronisation
	}
	close(release)
	eventually(t, 20*time.Second, "every message handled", func() bool { return handled.count() == n })
}
