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
//
// A crashed elder need not be waited for until its record expires: an
// instance whose record says it answers probes does so from the
// connection it consumes on, and a standby probes its elder every fifth
// of a heartbeat. Once the elder has neither answered a probe (no
// subscriber: its connection is gone) nor renewed its record for one of
// its heartbeat intervals, the standby expires the elder's record at the
// revision it read (refused if the elder renewed meanwhile) and takes the
// turn, and its readers then NAK what the elder's consumers still had
// pending (see receiver.reclaim) instead of leaving it to the ack timeout.
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
	// probe reports whether a probe of instance found its connection
	// gone (no subscriber); nil when this instance does not probe.
	probe func(ctx context.Context, instance string) bool

	// The heartbeat loop alone runs probeElder, which alone uses these:
	// the elder whose probes found no subscriber, since when, and the
	// revision of its record then.
	suspect      string
	suspectSince time.Time
	suspectRev   uint64

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
	// expired is the elder whose record this instance expired (see
	// probeElder), until this instance takes the turn or another ranks
	// first.
	expired string
	// reclaim is set while this instance holds a turn it took from an
	// elder whose connection was gone: its readers hand back that elder's
	// pending messages before their first fetch.
	reclaim bool
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
		if elder != "" && elder != t.expired {
			t.expired = "" // another instance ranks first: the turn passes to it
		}
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
	t.reclaim = ours && t.expired != ""
	t.expired = ""
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

// reclaiming reports whether the instance holds a turn it took from an
// elder whose connection was gone.
func (t *turns) reclaiming() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.reclaim
}

// probeEvery is how often a standby probes its elder.
func (t *turns) probeEvery() time.Duration { return t.grace / 10 }

// maxProbedTTL bounds the TTL a record may state for probeElder to judge
// its instance by: one stating more is waited out to its expiry.
const maxProbedTTL = 24 * 60 * 60

// probeElder probes the elder this instance stands by for, if the elder's
// record says it answers probes, and expires the elder's record once the
// elder has neither answered (its connection is gone) nor renewed the
// record for one of its heartbeat intervals, a third of the record's TTL.
// The check that follows then passes the turn to this instance, or to
// another standby ranking before it, without waiting for the TTL. Only
// the heartbeat loop calls it.
func (t *turns) probeElder() {
	t.mu.Lock()
	elder, closed := t.elder, t.closed
	t.mu.Unlock()
	if closed || elder == "" || t.probe == nil {
		t.suspect = ""
		return
	}
	rec, rev, ok := t.view.Revision(t.id, elder)
	if !ok || !rec.Probe || rec.TTLSeconds <= 0 || rec.TTLSeconds > maxProbedTTL {
		t.suspect = "" // the view lost it (see check), or it is not to be probed
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), t.probeEvery())
	gone := t.probe(ctx, elder)
	cancel()
	switch {
	case !gone:
		t.suspect = ""
		return
	case t.suspect != elder || t.suspectRev != rev:
		t.suspect, t.suspectSince, t.suspectRev = elder, time.Now(), rev
		return
	case time.Since(t.suspectSince) < time.Duration(rec.TTLSeconds)*time.Second/3:
		return
	}
	t.suspect = ""
	ctx, cancel = context.WithTimeout(context.Background(), t.land)
	err := t.view.Expire(ctx, t.id, elder, rev)
	cancel()
	if err != nil {
		t.logger.Warn("elder instance answers no probe, but its record could not be expired", "agent", t.id, "instance", t.instance, "elder", elder, "error", err)
		return
	}
	t.logger.Warn("elder instance's connection is gone: its record expired early", "agent", t.id, "instance", t.instance, "elder", elder)
	t.mu.Lock()
	t.expired = elder
	t.mu.Unlock()
	t.check()
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
