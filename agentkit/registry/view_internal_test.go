package registry

import (
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// entry is a registry KV entry for apply.
type entry struct {
	jetstream.KeyValueEntry
	key   string
	value []byte
	op    jetstream.KeyValueOp
	at    time.Time // when it was put; zero: never expires by its TTL
	rev   uint64
}

func (e entry) Key() string                     { return e.key }
func (e entry) Value() []byte                   { return e.value }
func (e entry) Operation() jetstream.KeyValueOp { return e.op }
func (e entry) Created() time.Time              { return e.at }
func (e entry) Revision() uint64                { return e.rev }

// An instance whose record expired (the TTL's purge) and which then
// deregisters (the delete) stopped cleanly: STOPPED, not UNAVAILABLE. With
// a history of one, the watch can miss the STOPPED record in between.
func TestRegistryApply_DeleteAfterPurgeIsStopped(t *testing.T) {
	r := &View{instances: map[string]map[string]instanceEntry{}, gone: map[string]Status{},
		health: map[string]health{}, silent: map[string]health{}}
	key := "agent.slow.i1"
	r.apply(entry{key: key, value: []byte(`{"id":"slow","instance":"i1","status":"STOPPING"}`), op: jetstream.KeyValuePut})
	r.apply(entry{key: key, op: jetstream.KeyValuePurge})
	if rec, _ := r.Get("slow"); rec.Status != StatusUnavailable {
		t.Fatalf("after the purge: %s, want UNAVAILABLE", rec.Status)
	}
	r.apply(entry{key: key, op: jetstream.KeyValueDelete})
	if rec, _ := r.Get("slow"); rec.Status != StatusStopped {
		t.Fatalf("after the delete: %s, want STOPPED", rec.Status)
	}
}

// The newest instance to go says how the agent went, whatever the
// instances before it did: the initial load sees an earlier instance's
// deregistration, then the expiry marker of the one that crashed after it
// (its record is gone with a history of one), and the other way round.
func TestRegistryApply_NewestInstanceToGoWins(t *testing.T) {
	for _, tc := range []struct {
		name          string
		first, second jetstream.KeyValueOp
		want          Status
	}{
		{"crash after clean stop", jetstream.KeyValueDelete, jetstream.KeyValuePurge, StatusUnavailable},
		{"clean stop after crash", jetstream.KeyValuePurge, jetstream.KeyValueDelete, StatusStopped},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &View{instances: map[string]map[string]instanceEntry{}, gone: map[string]Status{},
				health: map[string]health{}, silent: map[string]health{}}
			r.apply(entry{key: "agent.restarted.i1", op: tc.first})
			r.apply(entry{key: "agent.restarted.i2", op: tc.second})
			if rec, _ := r.Get("restarted"); rec.Status != tc.want {
				t.Fatalf("status %s, want %s", rec.Status, tc.want)
			}
		})
	}
}

// A record older than the TTL it states reads as gone whenever the view is
// read, before any sweep or marker: UNAVAILABLE, or STOPPED when it said
// so; a live instance beside it keeps the agent up, and a record that
// states no TTL (an older writer) is left to the server's expiry.
func TestRegistryRecord_ExpiredByItsOwnTTL(t *testing.T) {
	now := time.Now()
	old, fresh := now.Add(-time.Minute), now.Add(-time.Second)
	put := func(r *View, key, status string, ttl bool, at time.Time) {
		v := `{"id":"a","instance":"i","status":"` + status + `"`
		if ttl {
			v += `,"ttl_seconds":15`
		}
		r.apply(entry{key: key, value: []byte(v + "}"), op: jetstream.KeyValuePut, at: at})
	}
	for _, tc := range []struct {
		name      string
		setup     func(r *View)
		want      Status
		instances int
	}{
		{"expired", func(r *View) { put(r, "agent.a.i1", "READY", true, old) }, StatusUnavailable, 0},
		{"expired after saying STOPPED", func(r *View) { put(r, "agent.a.i1", "STOPPED", true, old) }, StatusStopped, 0},
		{"newest expired said STOPPED", func(r *View) {
			put(r, "agent.a.i1", "READY", true, old.Add(-time.Minute))
			put(r, "agent.a.i2", "STOPPED", true, old)
		}, StatusStopped, 0},
		{"fresh", func(r *View) { put(r, "agent.a.i1", "READY", true, fresh) }, StatusReady, 1},
		{"expired beside a live one", func(r *View) {
			put(r, "agent.a.i1", "READY", true, old)
			put(r, "agent.a.i2", "BUSY", true, fresh)
		}, StatusBusy, 1},
		{"no TTL stated", func(r *View) { put(r, "agent.a.i1", "READY", false, old) }, StatusReady, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &View{instances: map[string]map[string]instanceEntry{}, gone: map[string]Status{},
				health: map[string]health{}, silent: map[string]health{}}
			tc.setup(r)
			rec, ok := r.Get("a")
			if !ok || rec.Status != tc.want || rec.Instances != tc.instances {
				t.Fatalf("Get = %+v (found %v), want %s with %d live instances", rec, ok, tc.want, tc.instances)
			}
			if got, _ := r.Find(t.Context(), Query{Status: tc.want}); len(got) != 1 || got[0].ID != "a" {
				t.Fatalf("Find(%s) = %+v", tc.want, got)
			}
		})
	}
}

// The watch's sweep drops an expired record as the server's marker would
// and names the agent, once; the marker arriving afterwards, or a late
// deregistration, then finds the record gone and comes to the status it
// would have anyway, telling watchers only a change (STOPPED).
func TestRegistryDropExpired_AsTheMarkerWould(t *testing.T) {
	for _, tc := range []struct {
		name   string
		later  jetstream.KeyValueOp
		want   Status
		notify bool // whether the later event is news to watchers
	}{
		{"then the marker", jetstream.KeyValuePurge, StatusUnavailable, false},
		{"then a slow deregistration", jetstream.KeyValueDelete, StatusStopped, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &View{instances: map[string]map[string]instanceEntry{}, gone: map[string]Status{},
				health: map[string]health{}, silent: map[string]health{}}
			now := time.Now()
			r.apply(entry{key: "agent.a.i1", value: []byte(`{"id":"a","instance":"i1","status":"READY","ttl_seconds":2}`),
				op: jetstream.KeyValuePut, at: now.Add(-3 * time.Second)})
			r.apply(entry{key: "agent.b.i1", value: []byte(`{"id":"b","instance":"i1","status":"READY","ttl_seconds":2}`),
				op: jetstream.KeyValuePut, at: now})
			if got := r.dropExpired(now); len(got) != 1 || got[0] != "a" {
				t.Fatalf("dropExpired = %v, want [a]", got)
			}
			if got := r.dropExpired(now); got != nil {
				t.Fatalf("second sweep = %v, want nothing", got)
			}
			if _, ok := r.instances["a"]; ok || r.gone["a"] != StatusUnavailable {
				t.Fatalf("after the sweep: instances %v, gone %v", r.instances["a"], r.gone["a"])
			}
			if rec, _ := r.Get("b"); rec.Status != StatusReady {
				t.Fatalf("b %s, want READY", rec.Status)
			}
			if agents := r.apply(entry{key: "agent.a.i1", op: tc.later}); (len(agents) > 0) != tc.notify {
				t.Fatalf("the later %v named %q for watchers, want news %v", tc.later, agents, tc.notify)
			}
			if rec, _ := r.Get("a"); rec.Status != tc.want {
				t.Fatalf("a %s, want %s", rec.Status, tc.want)
			}
		})
	}
}

// Elder ranks the live instances that state their start by it, then by
// instance id; a STOPPED, expired or start-less record takes no part.
func TestRegistryElder(t *testing.T) {
	r := &View{instances: map[string]map[string]instanceEntry{}, gone: map[string]Status{},
		health: map[string]health{}, silent: map[string]health{}}
	put := func(inst, status, since string, at time.Time) {
		v := `{"id":"w","instance":"` + inst + `","status":"` + status + `","ttl_seconds":15` + since + `}`
		r.apply(entry{key: "agent.w." + inst, value: []byte(v), op: jetstream.KeyValuePut, at: at})
	}
	now := time.Now()
	t0 := now.Add(-time.Minute).UTC()
	at := func(d time.Duration) string { return `,"since":"` + t0.Add(d).Format(time.RFC3339Nano) + `"` }
	put("i3", "READY", at(3*time.Second), now)
	if _, ok := r.Elder("w", "i5", t0.Add(5*time.Second)); !ok {
		t.Fatal("i5 has no elder though i3 started before it")
	}
	if e, ok := r.Elder("w", "i3", t0.Add(3*time.Second)); ok {
		t.Fatalf("i3 has elder %s", e)
	}
	put("i2", "READY", at(3*time.Second), now) // same start, smaller id
	if e, _ := r.Elder("w", "i3", t0.Add(3*time.Second)); e != "i2" {
		t.Fatalf("elder of i3 = %s, want i2 (same start, smaller id)", e)
	}
	put("i1", "STOPPED", at(0), now)
	put("i0", "READY", "", now)                                 // states no start
	put("i9", "READY", at(-time.Second), now.Add(-time.Minute)) // outlived its TTL
	if e, _ := r.Elder("w", "i5", t0.Add(5*time.Second)); e != "i2" {
		t.Fatalf("elder of i5 = %s, want i2: STOPPED, start-less and expired records take no part", e)
	}
}

// A hosted member is live while its host's record is and lists it (or it
// joined after the host's latest renewal), and reads the host's status
// and load; its own STOPPING stands; it reads UNAVAILABLE once the host's
// record expires, and the sweep names it for watchers.
func TestRegistryHostedMembers(t *testing.T) {
	r := &View{instances: map[string]map[string]instanceEntry{}, gone: map[string]Status{},
		health: map[string]health{}, silent: map[string]health{}}
	now := time.Now()
	member := func(id, status string, at time.Time) {
		r.apply(entry{key: "agent." + id + ".p1", op: jetstream.KeyValuePut, at: at,
			value: []byte(`{"id":"` + id + `","instance":"p1","host":"g","status":"` + status + `","ttl_seconds":150}`)})
	}
	host := func(members string, at time.Time) {
		r.apply(entry{key: "host.g.p1", op: jetstream.KeyValuePut, at: at,
			value: []byte(`{"group":"g","instance":"p1","ttl_seconds":3,"members":{` + members + `}}`)})
	}
	member("a", "INITIALIZING", now.Add(-2*time.Second))
	if rec, _ := r.Get("a"); rec.Instances != 0 || rec.Status != StatusUnavailable {
		t.Fatalf("a = %+v without its host's record, want no live instance", rec)
	}
	host(`"a":{"status":"BUSY","load":0.5,"in_flight":2}`, now.Add(-time.Second))
	if rec, _ := r.Get("a"); rec.Status != StatusBusy || rec.Load != 0.5 || rec.Instances != 1 {
		t.Fatalf("a = %+v, want BUSY at load 0.5 from its host", rec)
	}
	member("b", "READY", now.Add(-500*time.Millisecond)) // joined after the host's renewal
	if rec, _ := r.Get("b"); rec.Status != StatusReady {
		t.Fatalf("b = %s, want READY: it joined after the host's latest renewal", rec.Status)
	}
	member("c", "READY", now.Add(-3*time.Second)) // the host's renewal no longer lists it
	if rec, _ := r.Get("c"); rec.Instances != 0 {
		t.Fatalf("c = %+v, live though its host's latest renewal does not list it", rec)
	}
	member("a", "STOPPING", now.Add(-500*time.Millisecond))
	if rec, _ := r.Get("a"); rec.Status != StatusStopping {
		t.Fatalf("a = %s, want its own STOPPING", rec.Status)
	}
	later := now.Add(3 * time.Second) // past the host's TTL
	r.nextExpiry = time.Time{}
	if got := r.dropExpired(later); !slices.Contains(got, "a") || !slices.Contains(got, "b") {
		t.Fatalf("the sweep named %v, want a and b, whose host's record expired", got)
	}
	r.mu.RLock()
	rec, _ := r.record("b", later)
	r.mu.RUnlock()
	if rec.Status != StatusUnavailable {
		t.Fatalf("b = %s after its host expired, want UNAVAILABLE", rec.Status)
	}
}
