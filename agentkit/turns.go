package agentkit

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/agentmesh-io/agentmesh/agentkit/registry"
)

// turns decides whether this instance of an agent consumes. Instances of
// one agent take turns (the default, see [WithConcurrentInstances]): only
// the eldest live instance in the registry reads the agent's consumers, and
// the others stand by until its record is deleted (it stopped) or expires
// (it crashed). So a redelivery, after a leader change lost an ack, comes
// back to the instance whose handled set knows the message, and a task's
// messages are handled in order by one instance.
//
// An instance consumes only while its own record is fresh: once two
// heartbeat intervals pass without a renewal, it stops fetching (it is
// fenced), a heartbeat before the others, which judge its record by its
// TTL of three, can take it for gone. A fenced instance whose record may
// have expired before its next renewal lands renews it with a new start:
// it comes back as the youngest, behind any instance that took over
// meanwhile. One whose renewal lands within the TTL keeps its start (no
// other instance can have taken over), so a registry election shorter
// than the TTL hands nothing over. An instance whose own record the
// registry dropped counts as fenced too, and renews at once.
//
// A registry view is a cache behind a watch, and a watch can fall
// seconds behind (after a server is lost, until the client notices): the
// elder's renewals then stop arriving and the view judges its record
// expired. So before taking over from an elder that the view no longer
// shows, an instance reads the elder's key from the server, and stands by
// while the server still holds it live. And an instance consumes only
// once its view holds its own record as last renewed: the watch delivers
// in stream order, so the view then holds every renewal put before it,
// the elders' too.
type turns struct {
	view     *registry.View
	id       string
	instance string
	grace    time.Duration // how long after a renewal this instance may consume
	ttl      time.Duration // how long its record lives without a renewal
	land     time.Duration // how long a renewal takes at most to land
	logger   *slog.Logger
	standBy  func()          // stops the readers' fetching; called without mu
	follow   <-chan struct{} // signals a change of the agent's records (see registry.View.Follow)
	renew    chan struct{}   // asks the heartbeat for a renewal now

	// checking serialises check, which the heartbeat, the recheck timer
	// and a renewal run: an older reading must not land after a newer.
	checking sync.Mutex

	mu      sync.Mutex
	since   time.Time // this instance's start, as its record states it
	lastOK  time.Time // when the latest successful renewal began
	rejoin  bool      // the server dropped this instance's record: the next renewal states a new start
	seen    bool      // the registry held this instance's record since its last renewal or fence
	current bool      // the view holds this instance's record stating since
	elder   string    // the instance that consumes instead, if any
	fenced  bool      // no renewal within grace
	ours    bool      // this instance consumes
	wake    chan struct{}
	fence   *time.Timer
	recheck *time.Timer // a check after the server still held a lost elder live
	closed  bool
}

// errStandingBy: a reader may not fetch while another instance consumes.
var errStandingBy = errors.New("agentkit: another instance consumes")

// newTurns returns the turns of an instance renewing its record every
// heartbeat, each renewal landing within land or failing.
func newTurns(view *registry.View, id, instance string, heartbeat, land time.Duration, logger *slog.Logger) *turns {
	return &turns{view: view, id: id, instance: instance, grace: 2 * heartbeat, ttl: 3 * heartbeat, land: land, logger: logger,
		fenced: true, wake: make(chan struct{}), standBy: func() {}, renew: make(chan struct{}, 1)}
}

// start returns the start the instance's next renewal, begun now,
// states: a new one while it is fenced (as it is before its first
// renewal) and its record may have expired by the time the renewal lands.
func (t *turns) start() time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.fenced && (t.rejoin || t.lastOK.IsZero() || time.Since(t.lastOK) >= t.ttl-t.land) {
		t.since, t.rejoin = time.Now().UTC(), false
	}
	return t.since
}

// renewed records a successful renewal of the instance's record, begun at
// at: the instance may consume until grace after it.
func (t *turns) renewed(at time.Time) {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return
	}
	t.lastOK = at
	left := t.grace - time.Since(at)
	if t.fence == nil {
		t.fence = time.AfterFunc(left, t.expire)
	} else {
		t.fence.Reset(left)
	}
	t.fenced = left <= 0
	t.mu.Unlock()
	t.check()
}

// expire fences the instance: its record went unrenewed for grace.
func (t *turns) expire() { t.update(func() { t.fenced = true }) }

// update applies change under mu and stands the readers down if the
// instance just stopped consuming.
func (t *turns) update(change func()) {
	t.mu.Lock()
	change()
	down := t.settle()
	t.mu.Unlock()
	if down {
		t.standBy()
	}
}

// check reads the registry for an elder instance.
func (t *turns) check() {
	t.checking.Lock()
	defer t.checking.Unlock()
	t.mu.Lock()
	since, prev := t.since, t.elder
	t.mu.Unlock()
	elder, _ := t.view.Elder(t.id, t.instance, since)
	if elder == t.instance {
		elder = ""
	}
	if elder == "" && prev != "" && t.serverHolds(prev, since) {
		elder = prev
	}
	rec, own := t.view.Record(t.id, t.instance)
	t.mu.Lock()
	lost := !own && t.seen
	t.mu.Unlock()
	if lost {
		// Gone from the view: from the server too (a renewal that landed
		// as the record expired vanishes with it), or is the view behind?
		ctx, cancel := context.WithTimeout(context.Background(), t.land)
		_, live, err := t.view.Live(ctx, t.id, t.instance)
		cancel()
		lost = err == nil && !live
	}
	t.update(func() {
		t.elder = elder
		t.current = own && rec.Since.Equal(t.since)
		switch {
		case own:
			t.seen = true
		case lost:
			t.seen, t.fenced, t.rejoin = false, true, true
			t.logger.Warn("the registry dropped this instance's record: renewing it as the youngest", "agent", t.id, "instance", t.instance)
			select {
			case t.renew <- struct{}{}:
			default:
			}
		}
	})
}

// awaitCurrent waits at most d until the view holds this instance's
// record as last renewed, so that a starting instance's turn is known when
// its Start returns. Call it before anyone else reads follow.
func (t *turns) awaitCurrent(d time.Duration) {
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		t.mu.Lock()
		current := t.current
		t.mu.Unlock()
		if current {
			return
		}
		select {
		case <-t.follow:
			t.check()
		case <-timer.C:
			return // the heartbeat's checks go on
		}
	}
}

// serverHolds reports whether the server still holds elder's record
// live and ranking before this instance, started at since, which the view
// no longer shows; if it does (or cannot be asked), it checks again a
// second later, as the view may stay behind.
func (t *turns) serverHolds(elder string, since time.Time) bool {
	ctx, cancel := context.WithTimeout(context.Background(), t.grace/2)
	rec, live, err := t.view.Live(ctx, t.id, elder)
	cancel()
	if err == nil && !(live && registry.Precedes(rec, t.instance, since)) {
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return true
	}
	if t.recheck == nil {
		t.recheck = time.AfterFunc(time.Second, t.check)
	} else {
		t.recheck.Reset(time.Second)
	}
	return true
}

// settle updates ours and reports whether the instance just stopped
// consuming. Call it with mu held.
func (t *turns) settle() bool {
	ours := !t.fenced && t.elder == "" && t.current && !t.closed
	if ours == t.ours {
		return false
	}
	t.ours = ours
	switch {
	case ours:
		close(t.wake)
		t.logger.Info("instance consumes for its agent", "agent", t.id, "instance", t.instance)
		return false
	case t.fenced && !t.closed:
		t.logger.Warn("instance stands by: its registry record went unrenewed", "agent", t.id, "instance", t.instance, "for", t.grace)
	case t.elder != "" && !t.closed:
		t.logger.Info("instance stands by: an elder instance consumes", "agent", t.id, "instance", t.instance, "elder", t.elder)
	case !t.closed:
		t.logger.Info("instance stands by until its registry view holds its latest renewal", "agent", t.id, "instance", t.instance)
	}
	t.wake = make(chan struct{})
	return true
}

// consuming reports whether the instance consumes now.
func (t *turns) consuming() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.ours
}

// await blocks until the instance consumes (true) or done closes (false).
func (t *turns) await(done <-chan struct{}) bool {
	for {
		t.mu.Lock()
		ours, wake := t.ours, t.wake
		t.mu.Unlock()
		if ours {
			return true
		}
		select {
		case <-wake:
		case <-done:
			return false
		}
	}
}

// close ends the turns: the instance no longer consumes.
func (t *turns) close() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.closed = true
	if t.fence != nil {
		t.fence.Stop()
	}
	if t.recheck != nil {
		t.recheck.Stop()
	}
	t.settle()
}
