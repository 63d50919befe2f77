package ackmonitor

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// lease is whether this instance is the active one: the holder of the
// events consumer's pin, which alone evaluates alerts, reconciles and
// follows up. The events intake tells it the pin it is served under and
// which pulls the server answered as the pin holder's; the status check
// (refreshStatus) tells it whether the server still names that pin, and
// it applies the step-up/step-down rule.
type lease struct {
	ttl      time.Duration // the events consumer's PinnedTTL
	interval time.Duration // between status checks

	pin      atomic.Value // string: the last Nats-Pin-Id seen on the events consumer
	lastPull atomic.Int64 // UnixNano when the events intake sent its last pull served as the pin holder
	active   atomic.Bool
	activeAt atomic.Int64 // UnixNano when the status check last found this instance active
	// pinnedAt is when the status check first saw this instance pinned,
	// and othersHeld the fewest events held by others (fetched, not
	// acked, not by this instance) it saw since; step only.
	pinnedAt   time.Time
	othersHeld int64
}

func newLease(ttl, interval time.Duration) *lease {
	l := &lease{ttl: ttl, interval: interval}
	l.pin.Store("")
	return l
}

// Active reports whether the last status check found this instance
// active and its events intake renewed the lease less than PinnedTTL/2
// ago (see [Monitor.Active]).
func (l *lease) Active() bool {
	return l.active.Load() && time.Since(time.Unix(0, l.lastPull.Load())) < l.ttl/2
}

// activeWithin reports whether this instance is active or was less than
// d ago.
func (l *lease) activeWithin(d time.Duration) bool {
	return l.Active() || time.Since(time.Unix(0, l.activeAt.Load())) < d
}

// pinned reports whether the events intake holds a pin: events came
// with one and no pull met a pin mismatch since.
func (l *lease) pinned() bool { return l.pin.Load().(string) != "" }

// pinnedAs records the pin events came with.
func (l *lease) pinnedAs(pin string) { l.pin.Store(pin) }

// holds reports whether pinned, the client the server names pinned, is
// this instance.
func (l *lease) holds(pinned string) bool {
	pin := l.pin.Load().(string)
	return pin != "" && pinned == pin
}

// answered records the server's answer, err, to the events pull sent at
// pulled (UnixNano) while this instance held a pin, or not (pinned).
func (l *lease) answered(pulled int64, pinned bool, err error) {
	switch {
	case errors.Is(err, jetstream.ErrPinIDMismatch):
		// The server moved the pin: step down before the next status
		// check, and until new events pin this instance again no pull
		// renews the lease.
		l.pin.Store("")
	case pinned && err == nil:
		// The pin held while this pull was served, so it was held
		// when it was sent: the lease runs from then. A pull counts
		// only once answered, or one sent just after the pin moved
		// would extend the lease of an instance that lost it.
		l.lastPull.Store(pulled)
	}
}

// step applies a status check that found this instance pinned, or not,
// while others held othersPending events. It steps down at once and up
// only after holding the pin for two status intervals, by which time a
// previous holder has seen the new pin in its own status check and
// stepped down. It reports whether the role changed, the role, and the
// fewest events others held at any check since this instance was pinned.
func (l *lease) step(pinned bool, othersPending int64) (changed, active bool, othersHeld int64) {
	active = pinned
	switch {
	case !active:
		l.pinnedAt = time.Time{}
	case l.pinnedAt.IsZero():
		l.pinnedAt, l.othersHeld = time.Now(), othersPending
		active = false
	default:
		l.othersHeld = min(l.othersHeld, othersPending)
		active = time.Since(l.pinnedAt) >= 2*l.interval
	}
	if active {
		l.activeAt.Store(time.Now().UnixNano())
	}
	was := l.active.Swap(active)
	return was != active, active, l.othersHeld
}

// resign steps down for good: Run is over.
func (l *lease) resign() { l.active.Store(false) }

// statusLoop checks whether this instance holds the events pin and
// refreshes the lag gauges.
func (m *Monitor) statusLoop(ctx context.Context) {
	t := time.NewTicker(m.cfg.StatusInterval)
	defer t.Stop()
	for {
		m.refreshStatus(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// refreshStatus is the status check: it reads both consumers' state,
// steps this instance up or down (lease.step) and, on a step up, holds
// follow-ups back while events a previous holder fetched may be missing.
func (m *Monitor) refreshStatus(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	pinned := false
	var eventsPending int64 // fetched from the events consumer by others, not yet acked
	for _, c := range []jetstream.Consumer{m.events, m.sends} {
		heldBefore := m.intake.held()
		info, err := c.Info(ctx)
		if err != nil {
			// An instance that cannot reach the server cannot know it is
			// still pinned: it steps down.
			if ctx.Err() == nil {
				m.cfg.Logger.Warn("consumer info", "err", err)
			}
			continue
		}
		m.metrics.pending.WithLabelValues(info.Name).Set(float64(info.NumPending + uint64(info.NumAckPending)))
		if c != m.events {
			continue
		}
		// The info may or may not count a batch fetched or acked while it
		// was on its way: subtracting the smaller count errs on the side
		// of waiting.
		eventsPending = int64(info.NumAckPending) - min(heldBefore, m.intake.held())
		holder := ""
		for _, g := range info.PriorityGroups {
			if g.Group == m.cfg.PriorityGroup {
				holder = g.PinnedClientID
			}
		}
		switch {
		case m.lease.holds(holder):
			pinned = true
		case holder == "" && info.NumPending == 0:
			// Nobody is pinned and no event is on its way to pin anyone:
			// a quiet mesh after a takeover or a restart, where follow-ups
			// would wait for the next event.
			m.wakeEvents(ctx)
		}
	}
	if changed, active, othersHeld := m.lease.step(pinned, eventsPending); changed {
		m.cfg.Logger.Info("ack monitor role changed", "id", m.cfg.MonitorID, "active", active)
		if active {
			from := time.Now()
			if othersHeld > 0 {
				// Events fetched by an instance that held the pin before
				// (another one, or this process's previous run) and
				// never acked come back after AckWait; until then rows
				// may lack them. Only the pinned instance is sent events,
				// so a count that stayed above zero at every check since
				// this one was pinned is not its own.
				from = from.Add(m.cfg.AckWait)
				m.cfg.Logger.Info("follow-ups wait for a previous instance's events", "in_flight", othersHeld, "until", from)
			}
			m.followUps.startFrom(from)
		}
	}
	if m.Active() {
		m.metrics.active.Set(1)
	} else {
		m.metrics.active.Set(0)
		m.reportAlerts(nil) // a standby reports no alerts and no stale rows
		m.reportStalePending(-1)
	}
}

// wakeEvents publishes a wake-up to the events stream. The server pins the
// instance it delivers it to, which learns its pin from the message.
func (m *Monitor) wakeEvents(ctx context.Context) {
	if _, err := m.js.Publish(ctx, m.cfg.Scheme.MonitorWake(), nil); err != nil && ctx.Err() == nil {
		m.cfg.Logger.Warn("events wake-up", "subject", m.cfg.Scheme.MonitorWake(), "err", err)
	}
}
