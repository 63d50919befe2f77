package ackmonitor

import (
	"context"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agentmesh-io/agentmesh/ackmonitor/store"
)

// The events stream captures the consumer events as the server publishes
// them, so none is lost while the monitor is down. It cannot capture an
// event published while it has no leader (a step-down, a node restart):
// in tests, five step-downs of MESH_EVENTS under load lost 11–24 % of the
// ack metrics, and their rows stayed pending for good; a lost
// MAX_DELIVERIES would never be dead-lettered or escalated. So the active
// instance also receives the events on core NATS (directIntake) and writes
// them at once. The ledger keeps events by id, and the events intake skips
// the stream's copy of an event written that way (directEvents), so the
// second path costs no second write.

// directBuffer is how many events directIntake holds for the store; more
// are dropped (nats.go's slow consumer) and left to the events stream.
const directBuffer = 64 << 10

// directRemembered is how many event ids directEvents keeps (a few MiB):
// a stream copy that arrives after that many later events is written
// again, which the ledger ignores.
const directRemembered = 256 << 10

// directGrace is how long after it was last active an instance still
// writes the events it receives on core NATS. A status check that fails
// while the events stream changes leader makes the active instance step
// down for a while, just when the stream misses events; an instance that
// took over since and writes them too costs the ledger only duplicates,
// which it ignores.
const directGrace = 30 * time.Second

// directEvents remembers the ids of the last events directIntake wrote, so
// the events intake can skip their stream copies. It forgets the oldest
// beyond its capacity; a copy it has forgotten is written again, which the
// ledger ignores.
type directEvents struct {
	mu   sync.Mutex
	ids  map[string]struct{}
	ring []string // insertion order, for forgetting
	next int
}

func newDirectEvents(capacity int) *directEvents {
	return &directEvents{ids: make(map[string]struct{}, capacity), ring: make([]string, capacity)}
}

// add remembers the ids of events.
func (d *directEvents) add(events []store.Event) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, e := range events {
		if _, ok := d.ids[e.ID]; ok || e.ID == "" {
			continue
		}
		delete(d.ids, d.ring[d.next]) // "" when the slot is empty
		d.ring[d.next] = e.ID
		d.ids[e.ID] = struct{}{}
		d.next = (d.next + 1) % len(d.ring)
	}
}

// written reports whether directIntake wrote the event with this id.
func (d *directEvents) written(id string) bool {
	if id == "" {
		return false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	_, ok := d.ids[id]
	return ok
}

// directIntake receives the consumer events on core NATS and, while this
// instance is active or was within directGrace, writes them in batches of
// up to BatchSize, waiting at most FetchWait for a batch to fill. A failed
// write is left to the events stream.
func (in *intake) directIntake(ctx context.Context) {
	ch := make(chan *nats.Msg, directBuffer)
	for _, subject := range in.cfg.Scheme.EventFilters() {
		sub, err := in.nc.ChanSubscribe(subject, ch)
		if err != nil {
			in.cfg.Logger.Warn("consumer events on core NATS: the events stream alone records them", "subject", subject, "err", err)
			continue
		}
		defer sub.Unsubscribe()
	}
	for {
		msgs := in.collect(ctx, ch)
		if ctx.Err() != nil {
			return
		}
		if !in.lease.activeWithin(directGrace) {
			continue // the active instance records them; the stream has them for a takeover
		}
		since := time.Now() // the messages were received before
		var events []*store.Event
		for _, msg := range msgs {
			if e, ok := in.parseAdvisory(msg.Subject, msg.Data); ok && e.ID != "" && !in.direct.written(e.ID) {
				events = append(events, &e)
			}
		}
		// An event not attributed now (nil tries: it is not put off) is
		// left to the events stream, whose intake tries again.
		var b store.Batch
		for i, v := range in.attributeGroupEvents(ctx, events, nil, since) {
			if v == eventKept {
				b.Events = append(b.Events, *events[i])
			}
		}
		applied, err := in.apply(ctx, b)
		if err != nil {
			in.cfg.Logger.Warn("consumer events from core NATS not written; the events stream has them", "n", len(b.Events), "err", err)
			continue
		}
		in.direct.add(b.Events)
		in.recorded(applied)
	}
}

// collect waits for a first message on ch, then takes more until it holds
// BatchSize or FetchWait has passed. It returns nil once ctx is done.
func (in *intake) collect(ctx context.Context, ch <-chan *nats.Msg) []*nats.Msg {
	var msgs []*nats.Msg
	select {
	case <-ctx.Done():
		return nil
	case msg := <-ch:
		msgs = append(msgs, msg)
	}
	t := time.NewTimer(in.cfg.FetchWait)
	defer t.Stop()
	for len(msgs) < in.cfg.BatchSize {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			return msgs
		case msg := <-ch:
			msgs = append(msgs, msg)
		}
	}
	return msgs
}
