package registry

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/agentmesh-io/agentmesh/agentkit/bucket"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// Host is the record of a process hosting a group's members, under the
// key "host.<group>.<instance>" ([subjects.HostKey]). The process renews
// it each heartbeat in place of its members' records: a member's record
// names the group ([Instance.Host]) and shares the host's instance id, and
// is live while the host's record is and lists the member. So a process
// hosting a thousand agents writes one record a heartbeat, and every
// watching registry receives one, not a thousand.
type Host struct {
	Group         string                 `json:"group"`
	Instance      string                 `json:"instance"`
	Members       map[string]MemberState `json:"members"` // by agent id: the members running now
	LastHeartbeat time.Time              `json:"last_heartbeat"`
	TTLSeconds    int64                  `json:"ttl_seconds,omitempty"` // as [Instance.TTLSeconds]
}

// MemberState is what a host's heartbeat says of one member: the fields of
// its record that change while it runs.
type MemberState struct {
	Status   Status  `json:"status"`
	Load     float64 `json:"load"`
	InFlight int     `json:"in_flight"`
}

// Expired reports whether the record, put at put, has outlived its TTL at
// now, as [Instance.Expired].
func (h Host) Expired(put, now time.Time) bool {
	return Instance{TTLSeconds: h.TTLSeconds}.Expired(put, now)
}

// hostEntry is a host record in the cache and when it was put.
type hostEntry struct {
	rec Host
	put time.Time
}

func (e hostEntry) expiry() (time.Time, bool) {
	return instanceEntry{rec: Instance{TTLSeconds: e.rec.TTLSeconds}, put: e.put}.expiry()
}

// hosted applies the host record h, put at hostPut, to in, a member's
// record put at put: whether the member is live (the host lists it, or
// the member's record is newer than the host's, as when it has just
// joined), and its record with the host's heartbeat, status and load. A
// member's own STOPPING or STOPPED stands.
func hosted(in Instance, put time.Time, h Host, hostPut time.Time) (Instance, bool) {
	m, listed := h.Members[in.ID]
	if !listed {
		return in, put.After(hostPut)
	}
	in.LastHeartbeat = h.LastHeartbeat
	if in.Status != StatusStopping && in.Status != StatusStopped {
		in.Status, in.Load, in.InFlight = m.Status, m.Load, m.InFlight
	}
	return in, true
}

// hostKey is the cache's key of a host record: "<group>.<instance>".
func hostKey(group, instance string) string { return group + "." + instance }

// RegisterHost writes a host's record with a per-key TTL, as [View.Register]
// writes an instance's.
func (r *View) RegisterHost(ctx context.Context, h Host, ttl time.Duration) error {
	ttl = bucket.KeyTTL(ttl)
	h.TTLSeconds = int64(ttl / time.Second)
	b, err := json.Marshal(h)
	if err != nil {
		return err
	}
	key, err := subjects.HostKey(h.Group, h.Instance)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidID, err)
	}
	if err := r.putTTL(ctx, key, b, ttl); err != nil {
		return fmt.Errorf("registry: register host %s/%s: %w", h.Group, h.Instance, err)
	}
	return nil
}

// DeregisterHost deletes a host's record: the process closed its group.
func (r *View) DeregisterHost(ctx context.Context, group, instance string) error {
	key, err := subjects.HostKey(group, instance)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidID, err)
	}
	if err := r.kv.Delete(ctx, key); err != nil {
		return fmt.Errorf("registry: deregister host %s/%s: %w", group, instance, err)
	}
	return nil
}
