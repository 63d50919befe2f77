package conformance

import (
	"bytes"
	"context"
	"encoding/json"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// rfc3339 is the registry schema's time pattern.
var rfc3339 = regexp.MustCompile(`^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-5][0-9](\.[0-9]+)?(Z|[+-][0-9]{2}:[0-9]{2})$`)

// record is an instance record as schema/registry.schema.json requires it.
type record struct {
	ID            string          `json:"id"`
	Instance      string          `json:"instance"`
	Status        string          `json:"status"`
	Load          *float64        `json:"load"`
	InFlight      *json.Number    `json:"in_flight"`
	Concurrency   *json.Number    `json:"concurrency"`
	LastHeartbeat string          `json:"last_heartbeat"`
	Capabilities  json.RawMessage `json:"capabilities"`
}

// checkRegistry checks the registry bucket, the agent's instance record
// and its renewal with a per-key TTL, and the core heartbeat if the agent
// sends one (PROTOCOL.md §8).
func checkRegistry(t *testing.T, p *peer) {
	ctx, cancel := context.WithTimeout(t.Context(), p.cfg.Timeout+p.cfg.HeartbeatTimeout)
	defer cancel()
	bucket := p.cfg.Prefix + "_registry"

	hbs := make(chan *nats.Msg, 16)
	hb, err := p.nc.ChanSubscribe(p.cfg.Prefix+".hb."+p.cfg.AgentID, hbs)
	if err != nil {
		t.Fatal(err)
	}
	defer hb.Unsubscribe()

	stream, err := p.js.Stream(ctx, "KV_"+bucket)
	if err != nil {
		t.Fatalf("registry bucket %s: %v", bucket, err)
	}
	sc := stream.CachedInfo().Config
	if sc.MaxMsgsPerSubject != 1 || !sc.AllowMsgTTL || sc.SubjectDeleteMarkerTTL != 7*24*time.Hour {
		t.Errorf("KV_%s: max_msgs_per_subject %d, allow_msg_ttl %v, subject_delete_marker_ttl %v; want 1, true, 168h",
			bucket, sc.MaxMsgsPerSubject, sc.AllowMsgTTL, sc.SubjectDeleteMarkerTTL)
	}
	kv, err := p.js.KeyValue(ctx, bucket)
	if err != nil {
		t.Fatalf("registry bucket %s: %v", bucket, err)
	}
	w, err := kv.Watch(ctx, "agent."+p.cfg.AgentID+".*")
	if err != nil {
		t.Fatalf("watch the agent's records: %v", err)
	}
	defer w.Stop()

	// The first live record, then a renewal of the same key.
	var gap time.Duration
	var first jetstream.KeyValueEntry
	var firstRec record
	for {
		var e jetstream.KeyValueEntry
		select {
		case <-ctx.Done():
			if first == nil {
				t.Fatalf("no live record agent.%s.<instance> in %s", p.cfg.AgentID, bucket)
			}
			t.Fatalf("record %s not renewed within %v", first.Key(), p.cfg.HeartbeatTimeout)
		case e = <-w.Updates():
		}
		if e == nil || e.Operation() != jetstream.KeyValuePut {
			continue
		}
		rec, ok := checkRecord(t, p, e)
		if !ok || (rec.Status != "READY" && rec.Status != "BUSY") {
			continue
		}
		if first == nil {
			first, firstRec = e, rec
			continue
		}
		if e.Key() != first.Key() {
			continue
		}
		t0, _ := time.Parse(time.RFC3339Nano, firstRec.LastHeartbeat)
		t1, _ := time.Parse(time.RFC3339Nano, rec.LastHeartbeat)
		if !t1.After(t0) {
			t.Errorf("renewal of %s: last_heartbeat %s not after %s", e.Key(), rec.LastHeartbeat, firstRec.LastHeartbeat)
		}
		gap = t1.Sub(t0)
		checkTTL(t, ctx, p, stream, bucket, e.Key(), gap)
		break
	}

	// The core heartbeat is optional; agentkit sends it after each renewal.
	var b []byte
	select {
	case m := <-hbs:
		b = m.Data
	case <-time.After(gap + time.Second):
		t.Logf("no core heartbeat on %s.hb.%s (optional)", p.cfg.Prefix, p.cfg.AgentID)
		return
	case <-ctx.Done():
		return
	}
	var h struct {
		At       string       `json:"at"`
		ID       string       `json:"id"`
		InFlight *json.Number `json:"in_flight"`
		Instance string       `json:"instance"`
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	if err := d.Decode(&h); err != nil || !rfc3339.MatchString(h.At) || h.ID != p.cfg.AgentID || !tokenRE.MatchString(h.Instance) || !nonNegInt(h.InFlight) {
		t.Errorf("core heartbeat %s: want {at, id, in_flight, instance} (err %v)", b, err)
	}
}

// checkRecord checks one instance record against the registry schema.
func checkRecord(t *testing.T, p *peer, e jetstream.KeyValueEntry) (record, bool) {
	t.Helper()
	var r record
	d := json.NewDecoder(bytes.NewReader(e.Value()))
	d.UseNumber()
	if err := d.Decode(&r); err != nil {
		t.Errorf("record %s is not a JSON object: %v: %.200s", e.Key(), err, e.Value())
		return r, false
	}
	ok := true
	fail := func(format string, args ...any) {
		t.Errorf("record %s: "+format, append([]any{e.Key()}, args...)...)
		ok = false
	}
	instance := strings.TrimPrefix(e.Key(), "agent."+p.cfg.AgentID+".")
	if r.ID != p.cfg.AgentID {
		fail("id %q, want %q", r.ID, p.cfg.AgentID)
	}
	if r.Instance != instance || !tokenRE.MatchString(instance) {
		fail("instance %q, want the key's token %q", r.Instance, instance)
	}
	if !slices.Contains([]string{"INITIALIZING", "READY", "BUSY", "STOPPING", "STOPPED", "UNAVAILABLE"}, r.Status) {
		fail("status %q is not a registry status", r.Status)
	}
	if r.Load == nil || *r.Load < 0 {
		fail("load missing or negative")
	}
	if !nonNegInt(r.InFlight) || !nonNegInt(r.Concurrency) {
		fail("in_flight and concurrency must be non-negative integers")
	}
	if !rfc3339.MatchString(r.LastHeartbeat) {
		fail("last_heartbeat %q is not an RFC 3339 time", r.LastHeartbeat)
	} else if _, err := time.Parse(time.RFC3339Nano, r.LastHeartbeat); err != nil {
		fail("last_heartbeat %q: %v", r.LastHeartbeat, err)
	}
	if len(r.Capabilities) > 0 && string(r.Capabilities) != "null" {
		var caps []struct {
			Name    string   `json:"name"`
			Actions []string `json:"actions"`
		}
		if err := json.Unmarshal(r.Capabilities, &caps); err != nil {
			fail("capabilities: %v", err)
		}
		for _, c := range caps {
			if c.Name == "" {
				fail("capability without a name")
			}
		}
	}
	return r, ok
}

func nonNegInt(n *json.Number) bool {
	if n == nil {
		return false
	}
	v, err := strconv.ParseInt(n.String(), 10, 64)
	return err == nil && v >= 0
}

// checkTTL checks the Nats-TTL header of the record's latest write: the
// record outlives the interval between renewals.
func checkTTL(t *testing.T, ctx context.Context, p *peer, stream jetstream.Stream, bucket, key string, gap time.Duration) {
	t.Helper()
	m, err := stream.GetLastMsgForSubject(ctx, "$KV."+bucket+"."+key)
	if err != nil {
		t.Errorf("read %s: %v", key, err)
		return
	}
	v := m.Header.Get("Nats-TTL")
	if v == "" {
		t.Errorf("record %s written without a Nats-TTL header: a crashed instance would never expire", key)
		return
	}
	ttl, err := time.ParseDuration(v)
	if err != nil {
		s, serr := strconv.Atoi(v)
		ttl, err = time.Duration(s)*time.Second, serr
	}
	switch {
	case err != nil:
		t.Errorf("record %s: Nats-TTL %q is neither a duration nor whole seconds", key, v)
	case ttl < time.Second:
		t.Errorf("record %s: Nats-TTL %q below the server's 1s minimum", key, v)
	case ttl <= gap:
		t.Errorf("record %s: Nats-TTL %v, but renewals came %v apart: the record expires between them", key, ttl, gap)
	}
}
