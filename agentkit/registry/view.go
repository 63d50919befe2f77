package registry

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	jsonv2 "github.com/go-json-experiment/json"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/agentkit/bucket"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// Agent is an agent as the registry sees it: its instances merged.
type Agent struct {
	ID            string       `json:"id"`
	Type          string       `json:"type,omitempty"`
	Version       string       `json:"version,omitempty"`
	Capabilities  []Capability `json:"capabilities,omitempty"`
	Director      string       `json:"director,omitempty"`
	Status        Status       `json:"status"`
	Instances     int          `json:"instances"`      // instances alive (not stopped, not unavailable)
	Load          float64      `json:"load"`           // mean handler occupancy of live instances, 0..1
	LastHeartbeat time.Time    `json:"last_heartbeat"` // the latest of any instance
	Degraded      bool         `json:"degraded"`       // senders saw repeated NACKs
	DegradedBy    string       `json:"degraded_by,omitempty"`
	// UnavailableBy is set when the status is UNAVAILABLE though the agent
	// still heartbeats: a sender saw repeated timeouts, or the ack monitor
	// saw one of its messages exhaust its deliveries. It names that sender
	// or monitor; the reason says which.
	UnavailableBy     string `json:"unavailable_by,omitempty"`
	UnavailableReason string `json:"unavailable_reason,omitempty"`
}

// HasCapability reports whether the agent declares capability name.
func (r Agent) HasCapability(name string) bool {
	return slices.ContainsFunc(r.Capabilities, func(c Capability) bool { return c.Name == name })
}

// instanceEntry is an instance's record in the cache, when it was put
// (the KV entry's Created time), from which the view judges it stale, and
// its revision.
type instanceEntry struct {
	rec Instance
	put time.Time
	rev uint64
}

// expired reports whether the record has outlived its TTL at now.
func (e instanceEntry) expired(now time.Time) bool { return e.rec.Expired(e.put, now) }

// expiry returns when the record outlives its TTL; false if it never does.
func (e instanceEntry) expiry() (time.Time, bool) {
	ttl := e.rec.TTLSeconds
	if ttl <= 0 || ttl > maxTTLSeconds || e.put.IsZero() {
		return time.Time{}, false // as Expired: never
	}
	return e.put.Add(time.Duration(ttl) * time.Second), true
}

// health is what senders report about an agent: key "health.<agent>"
// for the degraded mark, "unavailable.<agent>" (with a TTL) for the
// unavailable one.
type health struct {
	Degraded bool      `json:"degraded"`
	By       string    `json:"by,omitempty"`
	Reason   string    `json:"reason,omitempty"`
	At       time.Time `json:"at"`
}

// Query selects agents in [View.Find]; empty fields match anything.
type Query struct {
	Capability string
	Status     Status
	Type       string
}

// Event is a change seen by [View.Watch].
type Event struct {
	Agent Agent
}

// View is a live view of the agents of a mesh, kept in KV bucket
// "mesh_registry" and cached locally by a watch, so [View.Find] answers
// without a round trip. Each agent instance owns the key
// "agent.<id>.<instance>", written with a per-key TTL of three heartbeat
// intervals: an instance that dies stops renewing it and the key expires
// by itself, which the registry reports as UNAVAILABLE.
//
// The view learns of an expiry two ways: from the marker the server
// leaves in the bucket, and from the record itself, which states its TTL:
// a record older than its TTL reads as expired whenever the view is read,
// and the watch drops it within a second, telling Watch channels. The
// second way covers a bucket created without limit markers (by an older
// writer; `agentmesh migrate` adds them), where an expired key vanishes
// without a word. There a registry that loads the bucket after the key
// vanished, such as the CLI's, cannot tell the instance ever ran.
type View struct {
	kv     jetstream.KeyValue
	js     jetstream.JetStream
	bucket string

	mu        sync.RWMutex
	instances map[string]map[string]instanceEntry // agent → instance → record
	hosts     map[string]hostEntry                // "<group>.<instance>" → host record
	gone      map[string]Status                   // agent → how its newest instance to go went, when none is left
	health    map[string]health                   // degraded marks
	silent    map[string]health                   // unavailable marks
	watchers  []chan Event
	followers map[string][]chan struct{} // agent → Follow channels
	// nextExpiry is when the first record in the cache can expire: a
	// sweep before it has nothing to drop. Every instance renews its
	// record each heartbeat, so the view scans its records about once a
	// TTL less a heartbeat instead of every sweep.
	nextExpiry time.Time
	err        error         // why the watch ended by itself (nil: still watching, or Close)
	ready      chan struct{} // closed when the initial load is done
	ended      chan struct{} // closed, under mu, when the watch has ended: Watch channels start closed

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// ErrWatchEnded: the registry's watch of its bucket ended without
// [View.Close] (its connection closed, or the server ended it), so its
// cache no longer follows the bucket; see [View.Err].
var ErrWatchEnded = errors.New("registry: watch ended")

// ErrInvalidID: an agent or instance id is not a valid subject token.
var ErrInvalidID = errors.New("registry: invalid id")

// MarkerTTL is how long the marker the server leaves when an
// instance's key expires (its heartbeats stopped) stays in the bucket.
// Only while it does can a registry that loads the bucket, such as the
// CLI's, tell that instance crashed: without it the agent reads as its
// earlier instances went, STOPPED after a clean stop, or not at all. A
// clean stop's delete marker stays for good; a week of crash markers is
// as long as the message stream keeps messages. With a history of one the
// server does not stretch the keys' own TTLs to it.
const MarkerTTL = 7 * 24 * time.Hour

// Open binds to (creating it when create is true) the registry
// bucket of scheme and starts watching it. It returns once the cache holds
// the bucket's current contents, or with an error matching [ErrWatchEnded]
// if the watch ends before that. Close stops the watch.
func Open(ctx context.Context, js jetstream.JetStream, scheme subjects.Scheme, replicas int, create bool) (*View, error) {
	name := scheme.RegistryBucket()
	kv, err := bucket.KeyValue(ctx, js, jetstream.KeyValueConfig{
		Bucket:         name,
		Description:    "agentmesh agent registry",
		History:        1,
		Replicas:       replicas,
		LimitMarkerTTL: MarkerTTL,
	}, create)
	if err != nil {
		return nil, fmt.Errorf("registry: open: %w", err)
	}
	// The watch lives until Close, not until ctx ends: nats.go ends a
	// watch with its context, and the cache would freeze without a word.
	wctx, cancel := context.WithCancel(context.Background())
	w, err := kv.WatchAll(wctx)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("registry: watch: %w", err)
	}
	r := &View{kv: kv, js: js, bucket: name, instances: map[string]map[string]instanceEntry{},
		hosts: map[string]hostEntry{}, gone: map[string]Status{}, health: map[string]health{}, silent: map[string]health{},
		ready: make(chan struct{}), ended: make(chan struct{}), cancel: cancel}
	r.wg.Go(func() { r.watch(wctx, w) })
	select {
	case <-r.ready:
		return r, nil
	case <-r.ended:
		err := r.Err()
		r.Close()
		return nil, fmt.Errorf("registry: initial load: %w", err)
	case <-ctx.Done():
		r.Close()
		return nil, fmt.Errorf("registry: initial load: %w", ctx.Err())
	}
}

// Close stops the watch and ends every Watch channel.
func (r *View) Close() {
	r.cancel()
	r.wg.Wait()
}

// watchEnded reports whether the watch has ended; call it with r.mu held.
func (r *View) watchEnded() bool {
	select {
	case <-r.ended:
		return true
	default:
		return false
	}
}

// Err returns nil while the registry follows its bucket, and after Close.
// Once the watch has ended by itself (the connection closed, or the server
// ended it) it returns an error matching [ErrWatchEnded]: Get and Find go
// on answering from a cache that no longer changes, and Watch channels are
// closed.
func (r *View) Err() error {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.err
}

func (r *View) watch(ctx context.Context, w jetstream.KeyWatcher) {
	defer func() {
		// The watcher's callback blocks on a full Updates channel while it
		// holds the lock the close handler needs: drain until it closes.
		_ = w.Stop()
		for range w.Updates() {
		}
	}()
	var ended error // nil when Close ended the watch
	defer func() {
		r.mu.Lock()
		for _, c := range r.watchers {
			close(c)
		}
		r.watchers, r.err = nil, ended
		close(r.ended)
		r.mu.Unlock()
	}()
	initial := true
	sweep := time.NewTicker(sweepEvery)
	defer sweep.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-sweep.C:
			// Behind on the watch, the cache's records look older than
			// they are: the puts that renew them wait in the channel.
			if !initial && len(w.Updates()) == 0 {
				for _, agent := range r.dropExpired(now) {
					r.notify(agent)
				}
			}
		case e, ok := <-w.Updates():
			if !ok {
				ended = ErrWatchEnded
				if nc := r.js.Conn(); nc != nil && nc.IsClosed() {
					ended = fmt.Errorf("%w: connection closed", ErrWatchEnded)
				}
				return
			}
			if e == nil { // initial values done
				if initial {
					close(r.ready)
					initial = false
				}
				continue
			}
			for _, agent := range r.apply(e) {
				if !initial {
					r.notify(agent)
				}
			}
		}
	}
}

// jsErrCodeMsgTTLDisabled is the server's answer to a publish with a TTL
// to a stream that does not allow per-message TTLs: a registry bucket
// created by an older writer.
const jsErrCodeMsgTTLDisabled jetstream.ErrorCode = 10166

// sweepEvery is how often the watch drops records that outlived their
// TTL: the server scans for expired keys about as often.
const sweepEvery = time.Second

// dropExpired removes the records that have outlived their TTL at now, as
// the server's expiry marker would, and returns the agents left with no
// live record. A record that expired on a bucket with limit markers is
// dropped by whichever comes first, this or the marker; the other finds
// it gone and comes to the same status.
func (r *View) dropExpired(now time.Time) []string {
	// Most sweeps are before the first record can expire: they look
	// under the read lock, which does not hold up readers.
	r.mu.RLock()
	early := now.Before(r.nextExpiry)
	r.mu.RUnlock()
	if early {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	var changed []string
	next := time.Time{}
	for k, h := range r.hosts {
		if h.rec.Expired(h.put, now) {
			delete(r.hosts, k)
			changed = append(changed, r.hostedBy(h.rec.Group, h.rec.Instance)...)
		} else if at, ok := h.expiry(); ok && (next.IsZero() || at.Before(next)) {
			next = at
		}
	}
	for agent, insts := range r.instances {
		dropped := false
		for inst, in := range insts {
			if in.expired(now) {
				r.drop(agent, inst, false)
				dropped = true
			} else if at, ok := in.expiry(); ok && (next.IsZero() || at.Before(next)) {
				next = at
			}
		}
		if dropped {
			changed = append(changed, agent)
		}
	}
	r.nextExpiry = next
	if next.IsZero() {
		r.nextExpiry = now.Add(time.Hour) // nothing can expire: apply brings it forward
	}
	slices.Sort(changed)
	return slices.Compact(changed)
}

// hostedBy returns the agents whose records the host instance of group
// renews. Call it with r.mu held.
func (r *View) hostedBy(group, instance string) []string {
	var out []string
	for agent, insts := range r.instances {
		if e, ok := insts[instance]; ok && e.rec.Host == group {
			out = append(out, agent)
		}
	}
	return out
}

// live returns agent's instance record inst as it stands at now, with its
// host's heartbeat applied (see [Host]), and whether it is live: within
// its TTL and, when hosted, its host's record live and listing it. Call it
// with r.mu held.
func (r *View) live(agent, inst string, e instanceEntry, now time.Time) (Instance, bool) {
	if e.expired(now) {
		return e.rec, false
	}
	if e.rec.Host == "" {
		return e.rec, true
	}
	h, ok := r.hosts[hostKey(e.rec.Host, inst)]
	if !ok || h.rec.Expired(h.put, now) {
		return e.rec, false
	}
	return hosted(e.rec, e.put, h.rec, h.put)
}

// drop removes agent's instance inst: deregistered when clean, else
// expired. When it was the agent's last, the agent reads STOPPED if it
// deregistered or its last record said STOPPED, else UNAVAILABLE. It
// reports whether that changed what the view shows, so the second of the
// sweep and the server's marker for one expiry tells no watcher again.
// Call it with r.mu held.
func (r *View) drop(agent, inst string, clean bool) bool {
	in, ok := r.instances[agent][inst]
	delete(r.instances[agent], inst)
	if len(r.instances[agent]) > 0 {
		return ok
	}
	delete(r.instances, agent)
	status := StatusUnavailable
	if clean || ok && in.rec.Status == StatusStopped {
		status = StatusStopped
	}
	prev, had := r.gone[agent]
	r.gone[agent] = status
	return ok || !had || prev != status
}

// apply updates the cache from one KV entry and returns the agents it
// concerns: those of a host record only when someone listens for changes
// (see notify).
func (r *View) apply(e jetstream.KeyValueEntry) []string {
	key, err := subjects.ParseRegistryKey(e.Key())
	if err != nil {
		return nil
	}
	if key.Kind == subjects.KeyHost {
		return r.applyHost(key, e)
	}
	// Every instance rewrites its record each heartbeat and every view
	// decodes it: decoded before the lock, with the faster decoder.
	var rec Instance
	if key.Kind == subjects.KeyInstance && e.Operation() == jetstream.KeyValuePut && jsonv2.Unmarshal(e.Value(), &rec) != nil {
		return nil
	}
	if agent := r.applyAgent(key, rec, e); agent != "" {
		return []string{agent}
	}
	return nil
}

// applyHost updates the cache from a host record's entry.
func (r *View) applyHost(key subjects.RegistryKey, e jetstream.KeyValueEntry) []string {
	var rec Host
	put := e.Operation() == jetstream.KeyValuePut
	if put && (jsonv2.Unmarshal(e.Value(), &rec) != nil || rec.Group != key.Group || rec.Instance != key.Instance) {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	k := hostKey(key.Group, key.Instance)
	var changed []string
	if len(r.watchers) > 0 || len(r.followers) > 0 {
		changed = r.hostedBy(key.Group, key.Instance)
	}
	if !put {
		delete(r.hosts, k)
		return changed
	}
	if r.hosts == nil {
		r.hosts = map[string]hostEntry{}
	}
	entry := hostEntry{rec: rec, put: e.Created()}
	r.hosts[k] = entry
	if at, ok := entry.expiry(); ok && at.Before(r.nextExpiry) {
		r.nextExpiry = at
	}
	return changed
}

// applyAgent updates the cache from an instance record's or a mark's
// entry (rec decoded for an instance's put) and returns the agent it
// concerns, or "" when nothing changed.
func (r *View) applyAgent(key subjects.RegistryKey, rec Instance, e jetstream.KeyValueEntry) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch key.Kind {
	case subjects.KeyInstance:
		agent, inst := key.Agent, key.Instance
		switch e.Operation() {
		case jetstream.KeyValuePut:
			if r.instances[agent] == nil {
				r.instances[agent] = map[string]instanceEntry{}
			}
			entry := instanceEntry{rec: rec, put: e.Created(), rev: e.Revision()}
			r.instances[agent][inst] = entry
			if at, ok := entry.expiry(); ok && at.Before(r.nextExpiry) {
				r.nextExpiry = at
			}
			delete(r.gone, agent)
		default:
			// Delete: the instance deregistered, it stopped cleanly. Purge:
			// its key expired by its TTL (the server's marker, reason
			// MaxAge): it stopped heartbeating, unless its last record said
			// STOPPED. The watch delivers events in stream order, also in
			// the initial load, so the last one applied is the newest and
			// says how the agent went: a crash after a clean stop of an
			// earlier instance is UNAVAILABLE, and a deregistration after
			// the record expired (a slow stop) is STOPPED.
			if !r.drop(agent, inst, e.Operation() == jetstream.KeyValueDelete) {
				return ""
			}
		}
		return agent
	default: // a mark
		marks := r.health
		if key.Kind == subjects.KeyUnavailable {
			marks = r.silent
		}
		var h health
		if e.Operation() == jetstream.KeyValuePut && json.Unmarshal(e.Value(), &h) == nil {
			marks[key.Agent] = h
		} else { // cleared, or the TTL ran out
			delete(marks, key.Agent)
		}
		return key.Agent
	}
}

func (r *View) notify(agent string) {
	r.mu.RLock()
	none := len(r.watchers) == 0
	for _, c := range r.followers[agent] {
		select {
		case c <- struct{}{}:
		default: // a signal is pending: the follower reads the view once for both
		}
	}
	r.mu.RUnlock()
	if none {
		return // most views have no watcher: every heartbeat would merge a record for nobody
	}
	rec, ok := r.Get(agent)
	if !ok {
		return
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	for _, c := range r.watchers {
		select {
		case c <- Event{Agent: rec}:
		default: // a slow watcher misses events rather than stalling the registry
		}
	}
}

// Get returns the merged record of agent id.
func (r *View) Get(id string) (Agent, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.record(id, time.Now())
}

func (r *View) record(id string, now time.Time) (Agent, bool) {
	rec, ok := r.heartbeatRecord(id, now)
	if s, silent := r.silent[id]; ok && silent && rec.Status != StatusStopped {
		rec.Status, rec.UnavailableBy, rec.UnavailableReason = StatusUnavailable, s.By, s.Reason
	}
	return rec, ok
}

// heartbeatRecord merges agent id's live instance records at now, or
// reports how its last instance went; only the degraded mark is applied.
// Records that outlived their TTL count as gone, as they will once the
// watch or the server's marker drops them.
func (r *View) heartbeatRecord(id string, now time.Time) (Agent, bool) {
	h := r.health[id]
	rec := Agent{ID: id, Degraded: h.Degraded, DegradedBy: h.By}
	rank := map[Status]int{StatusReady: 5, StatusBusy: 4, StatusInitializing: 3, StatusStopping: 2, StatusStopped: 1}
	best := -1
	var load float64
	var last *instanceEntry // the newest of the expired records
	for inst, e := range r.instances[id] {
		in, ok := r.live(id, inst, e, now)
		if !ok {
			if last == nil || e.put.After(last.put) {
				last = &e
			}
			continue
		}
		rec.Type, rec.Version, rec.Capabilities, rec.Director = in.Type, in.Version, in.Capabilities, in.Director
		if in.LastHeartbeat.After(rec.LastHeartbeat) {
			rec.LastHeartbeat = in.LastHeartbeat
		}
		if rank[in.Status] > best {
			best, rec.Status = rank[in.Status], in.Status
		}
		if in.Status != StatusStopped {
			rec.Instances++
			load += in.Load
		}
	}
	if best < 0 { // no live record
		status, ok := r.gone[id]
		if last != nil {
			status, ok = StatusUnavailable, true
			if last.rec.Status == StatusStopped {
				status = StatusStopped
			}
		}
		if !ok {
			return Agent{}, false
		}
		rec.Status = status
		return rec, true
	}
	if rec.Instances > 0 {
		rec.Load = load / float64(rec.Instances)
	}
	return rec, true
}

// Find returns the agents matching q from the local cache, least loaded
// first (then by id).
func (r *View) Find(ctx context.Context, q Query) ([]Agent, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	r.mu.RLock()
	ids := make([]string, 0, len(r.instances)+len(r.gone))
	for id := range r.instances {
		ids = append(ids, id)
	}
	for id := range r.gone {
		ids = append(ids, id)
	}
	var out []Agent
	now := time.Now()
	for _, id := range ids {
		rec, _ := r.record(id, now)
		if (q.Status == "" || rec.Status == q.Status) && (q.Type == "" || rec.Type == q.Type) &&
			(q.Capability == "" || rec.HasCapability(q.Capability)) {
			out = append(out, rec)
		}
	}
	r.mu.RUnlock()
	slices.SortFunc(out, func(a, b Agent) int {
		return cmp.Or(cmp.Compare(a.Load, b.Load), cmp.Compare(a.ID, b.ID))
	})
	return out, nil
}

// Watch returns a channel of changes until ctx ends or the registry
// closes. A watcher that does not keep up misses events; [View.Find]
// always has the current view.
func (r *View) Watch(ctx context.Context) <-chan Event {
	c := make(chan Event, 64)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.watchEnded() {
		close(c)
		return c
	}
	r.watchers = append(r.watchers, c)
	context.AfterFunc(ctx, func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		if i := slices.Index(r.watchers, c); i >= 0 {
			r.watchers = slices.Delete(r.watchers, i, i+1)
			close(c)
		}
	})
	return c
}

// Follow returns a channel that receives a signal whenever the view's
// records of agent change (signals coalesce: read the view on each), and
// a function that stops it. It costs nothing for other agents' changes.
func (r *View) Follow(agent string) (<-chan struct{}, func()) {
	c := make(chan struct{}, 1)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.followers == nil {
		r.followers = map[string][]chan struct{}{}
	}
	r.followers[agent] = append(r.followers[agent], c)
	return c, func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.followers[agent] = slices.DeleteFunc(r.followers[agent], func(f chan struct{}) bool { return f == c })
		if len(r.followers[agent]) == 0 {
			delete(r.followers, agent)
		}
	}
}

// Elder returns a live instance of agent that ranks before instance,
// started at since: one whose record states an earlier start (or the same
// start and a smaller instance id), is not STOPPED and has not outlived
// its TTL. Instances that take turns consume only while they have no
// elder, so one instance at a time reads an agent's consumers. Records
// that state no start take no part.
func (r *View) Elder(agent, instance string, since time.Time) (string, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	now := time.Now()
	eldest, eldestSince := instance, since
	for id, e := range r.instances[agent] {
		in, ok := r.live(agent, id, e, now)
		if !ok || in.Status == StatusStopped {
			continue
		}
		if Precedes(in, eldest, eldestSince) {
			eldest, eldestSince = id, in.Since
		}
	}
	return eldest, eldest != instance
}

// Record returns the view's live record of agent's instance, if it holds
// one.
func (r *View) Record(agent, instance string) (Instance, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	e, ok := r.instances[agent][instance]
	if !ok {
		return Instance{}, false
	}
	return r.live(agent, instance, e, time.Now())
}

// Revision returns the view's live record of agent's instance with its
// revision in the bucket, if it holds one.
func (r *View) Revision(agent, instance string) (Instance, uint64, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	e, ok := r.instances[agent][instance]
	if !ok {
		return Instance{}, 0, false
	}
	in, live := r.live(agent, instance, e, time.Now())
	return in, e.rev, live
}

// Expire removes instance's record of agent as its TTL running out would
// (views read the instance as crashed, not stopped), provided the bucket
// still holds revision rev of it: a renewal since then means the instance
// lives, and the server refuses the removal (wrong last sequence). It is for
// an instance of the same agent that found this one's connection gone
// before its record expired.
func (r *View) Expire(ctx context.Context, agent, instance string, rev uint64) error {
	key, err := subjects.InstanceKey(agent, instance)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidID, err)
	}
	if err := r.kv.Purge(ctx, key, jetstream.LastRevision(rev)); err != nil {
		return fmt.Errorf("registry: expire %s/%s: %w", agent, instance, err)
	}
	return nil
}

// Precedes reports whether in, an instance record that states its
// start, ranks before instance started at since in its agent's turns:
// it started earlier, or at the same time with a smaller instance id.
func Precedes(in Instance, instance string, since time.Time) bool {
	if in.Since.IsZero() {
		return false
	}
	c := in.Since.Compare(since)
	return c < 0 || c == 0 && in.Instance < instance
}

// Live reads agent's instance record from the bucket's stream leader
// rather than the view, which can be seconds behind its watch, and returns
// it with whether it is live: present, not STOPPED, within its TTL by the
// server's timestamp of its latest put, and, when hosted, its host's
// record too. It does not use the bucket's direct gets: any replica
// answers those, and one that lags (a restarted server catching up)
// returns an older record.
func (r *View) Live(ctx context.Context, agent, instance string) (Instance, bool, error) {
	key, err := subjects.InstanceKey(agent, instance)
	if err != nil {
		return Instance{}, false, fmt.Errorf("%w: %w", ErrInvalidID, err)
	}
	get := r.leaderGet
	v, put, found, err := get(ctx, key)
	if err != nil {
		return Instance{}, false, fmt.Errorf("registry: %s: %w", key, err)
	}
	var in Instance
	if !found || json.Unmarshal(v, &in) != nil || in.Status == StatusStopped || in.Expired(put, time.Now()) {
		return in, false, nil
	}
	if in.Host == "" {
		return in, true, nil
	}
	return hostedInstance(ctx, get, in, put)
}

// leaderGet is a getFunc asking the bucket's stream leader for a key's
// latest value (the stream API's message get, not a direct get).
func (r *View) leaderGet(ctx context.Context, key string) ([]byte, time.Time, bool, error) {
	req, err := json.Marshal(map[string]string{"last_by_subj": subjects.KVSubject(r.bucket, key)})
	if err != nil {
		return nil, time.Time{}, false, err
	}
	resp, err := r.js.Conn().RequestWithContext(ctx, apiPrefix(r.js)+"STREAM.MSG.GET."+subjects.KVStream(r.bucket), req)
	if err != nil {
		return nil, time.Time{}, false, err
	}
	var got struct {
		Message *struct {
			Data []byte    `json:"data"`
			Time time.Time `json:"time"`
		} `json:"message"`
		Error *jetstream.APIError `json:"error"`
	}
	if err := json.Unmarshal(resp.Data, &got); err != nil {
		return nil, time.Time{}, false, err
	}
	switch {
	case got.Error != nil && got.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound:
		return nil, time.Time{}, false, nil
	case got.Error != nil:
		return nil, time.Time{}, false, got.Error
	case got.Message == nil:
		return nil, time.Time{}, false, errors.New("empty message get response")
	}
	// A delete, purge or expiry marker has no value, which no reader
	// decodes as a record.
	return got.Message.Data, got.Message.Time, true, nil
}

// apiPrefix is the subject prefix of js's API requests.
func apiPrefix(js jetstream.JetStream) string {
	switch o := js.Options(); {
	case o.Domain != "":
		return "$JS." + o.Domain + ".API."
	case o.APIPrefix != "":
		return strings.TrimSuffix(o.APIPrefix, ".") + "."
	}
	return jetstream.DefaultAPIPrefix
}

// Degraded reports whether the view holds a degraded mark for agent,
// whether or not it holds a record of the agent too.
func (r *View) Degraded(agent string) bool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.health[agent].Degraded
}

// MarkDegraded records that agent looks unhealthy to by (three consecutive
// NACKs), or clears the mark when degraded is false.
func (r *View) MarkDegraded(ctx context.Context, agent, by, reason string, degraded bool) error {
	key, err := subjects.MarkKey(subjects.KeyHealth, agent)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidID, err)
	}
	if !degraded {
		if err := r.kv.Delete(ctx, key); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
			return fmt.Errorf("registry: clear degraded %s: %w", agent, err)
		}
		return nil
	}
	b, _ := json.Marshal(health{Degraded: true, By: by, Reason: reason, At: time.Now().UTC()})
	if _, err := r.kv.Put(ctx, key, b); err != nil {
		return fmt.Errorf("registry: mark %s degraded: %w", agent, err)
	}
	return nil
}

// MarkUnavailable records that agent stopped answering by (three
// consecutive timeouts) although it may still heartbeat: its
// status reads UNAVAILABLE, so discovery and fallback pass it over, until
// [View.ClearUnavailable] or, at the latest, ttl.
func (r *View) MarkUnavailable(ctx context.Context, agent, by, reason string, ttl time.Duration) error {
	return putUnavailable(ctx, r.js, r.bucket, agent, by, reason, ttl)
}

// MarkUnavailable is [View.MarkUnavailable] for services that do not
// keep a registry open, such as the ack monitor (an agent whose
// message exhausted its deliveries is potentially unavailable).
func MarkUnavailable(ctx context.Context, js jetstream.JetStream, s subjects.Scheme, agent, by, reason string, ttl time.Duration) error {
	return putUnavailable(ctx, js, s.RegistryBucket(), agent, by, reason, ttl)
}

// putUnavailable publishes the mark with a per-message TTL, as put does.
func putUnavailable(ctx context.Context, js jetstream.JetStream, bucketName, agent, by, reason string, ttl time.Duration) error {
	key, err := subjects.MarkKey(subjects.KeyUnavailable, agent)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidID, err)
	}
	b, _ := json.Marshal(health{By: by, Reason: reason, At: time.Now().UTC()})
	if _, err := js.Publish(ctx, subjects.KVSubject(bucketName, key), b, jetstream.WithMsgTTL(bucket.KeyTTL(ttl))); err != nil {
		return fmt.Errorf("registry: mark %s unavailable: %w", agent, err)
	}
	return nil
}

// ClearUnavailable removes the mark of [View.MarkUnavailable]: agent
// answered again.
func (r *View) ClearUnavailable(ctx context.Context, agent string) error {
	key, err := subjects.MarkKey(subjects.KeyUnavailable, agent)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidID, err)
	}
	if err := r.kv.Delete(ctx, key); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("registry: clear unavailable %s: %w", agent, err)
	}
	return nil
}

// Register writes an instance's record under its key with a per-key TTL
// (at least a second), which the record states too, so readers can judge
// it stale where the bucket keeps no expiry markers: an instance renews
// it with each heartbeat, and a crashed one's key expires by itself. KV
// Update drops per-key TTLs (the server keeps a TTL only from a publish
// that carries one), so the record is published to the key's subject with
// a Nats-TTL header instead.
func (r *View) Register(ctx context.Context, rec Instance, ttl time.Duration) error {
	ttl = bucket.KeyTTL(ttl)
	rec.TTLSeconds = int64(ttl / time.Second)
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	key, err := subjects.InstanceKey(rec.ID, rec.Instance)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidID, err)
	}
	if err := r.putTTL(ctx, key, b, ttl); err != nil {
		return fmt.Errorf("registry: register %s/%s: %w", rec.ID, rec.Instance, err)
	}
	return nil
}

// putTTL puts b under key with a per-key TTL, by publishing to the key's
// subject (a KV put carries no TTL).
func (r *View) putTTL(ctx context.Context, key string, b []byte, ttl time.Duration) error {
	if _, err := r.js.Publish(ctx, subjects.KVSubject(r.bucket, key), b, jetstream.WithMsgTTL(ttl)); err != nil {
		var apiErr *jetstream.APIError
		if errors.As(err, &apiErr) && apiErr.ErrorCode == jsErrCodeMsgTTLDisabled {
			return fmt.Errorf("registry bucket %s does not allow per-key TTLs (agentmesh migrate allows them): %w", r.bucket, err)
		}
		return err
	}
	return nil
}

// Deregister deletes instance's record of agent id: it stopped cleanly,
// and views read it STOPPED rather than UNAVAILABLE once it was the
// agent's last.
func (r *View) Deregister(ctx context.Context, id, instance string) error {
	key, err := subjects.InstanceKey(id, instance)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidID, err)
	}
	if err := r.kv.Delete(ctx, key); err != nil {
		return fmt.Errorf("registry: deregister %s/%s: %w", id, instance, err)
	}
	return nil
}
