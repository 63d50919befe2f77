package agentkit_test

import (
	"context"
	"testing"
	"time"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// Busy(d) redelivers after about d on every attempt it is returned on,
// not only the first: the server times a NAK's delay from the attempt's
// ack timeout, which grows with the attempt (BackOff), and the runtime
// takes the growth off.
func TestOutcome_BusyDelayHonouredOnEveryRetry(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	adv := m.watchAdvisories()
	const busy = 150 * time.Millisecond
	var rec recorder
	calls := 0
	pol := fastPolicy(time.Second, 4*time.Second, 8*time.Second)
	pol.MaxDeliver = 4 // the last retry is on the repeated last entry
	m.started("recv", map[string]agentkit.HandlerFunc{"work": func(ctx context.Context, msg *agentkit.Message) error {
		calls++ // one message, handled sequentially
		rec.handle(nil)(ctx, msg)
		if calls < 4 {
			return agentkit.Busy(busy)
		}
		return nil
	}}, agentkit.WithPolicy(wire.PriorityHigh, pol))
	sender := m.agent("sender")
	if _, err := sender.Send(ctx(t), "recv", "work", nil, agentkit.WithPriority(wire.PriorityHigh)); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "ack after three NAKs", func() bool { return len(adv.of(subjects.EventAck, 0)) == 1 })
	if d := adv.of(subjects.EventAck, 0)[0].Deliveries; d != 4 {
		t.Fatalf("acked on delivery %d, want 4", d)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	// Without the correction the gaps would be busy, busy+3s, busy+7s:
	// each must stay below the table's first step (1s) instead.
	for i := 1; i < len(rec.at); i++ {
		if gap := rec.at[i].Sub(rec.at[i-1]); gap < busy || gap >= time.Second {
			t.Errorf("redelivery %d came %v after attempt %d; want %v ≤ gap < 1s", i+1, gap, i, busy)
		}
	}
}
