package agentkit

import (
	"testing"

	"github.com/nats-io/nats.go/jetstream"
)

// entry is a registry KV entry for apply.
type entry struct {
	jetstream.KeyValueEntry
	key   string
	value []byte
	op    jetstream.KeyValueOp
}

func (e entry) Key() string                     { return e.key }
func (e entry) Value() []byte                   { return e.value }
func (e entry) Operation() jetstream.KeyValueOp { return e.op }

// An instance whose record expired (the TTL's purge) and which then
// deregisters (the delete) stopped cleanly: STOPPED, not UNAVAILABLE. With
// a history of one, the watch can miss the STOPPED record in between.
func TestRegistryApply_DeleteAfterPurgeIsStopped(t *testing.T) {
	r := &Registry{instances: map[string]map[string]instanceRecord{}, gone: map[string]AgentStatus{},
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
		want          AgentStatus
	}{
		{"crash after clean stop", jetstream.KeyValueDelete, jetstream.KeyValuePurge, StatusUnavailable},
		{"clean stop after crash", jetstream.KeyValuePurge, jetstream.KeyValueDelete, StatusStopped},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &Registry{instances: map[string]map[string]instanceRecord{}, gone: map[string]AgentStatus{},
				health: map[string]health{}, silent: map[string]health{}}
			r.apply(entry{key: "agent.restarted.i1", op: tc.first})
			r.apply(entry{key: "agent.restarted.i2", op: tc.second})
			if rec, _ := r.Get("restarted"); rec.Status != tc.want {
				t.Fatalf("status %s, want %s", rec.Status, tc.want)
			}
		})
	}
}
