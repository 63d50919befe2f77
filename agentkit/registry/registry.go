// Package registry is the mesh's agent registry (KV bucket
// [subjects.Scheme.RegistryBucket]): the record each agent instance writes
// under "agent.<agent>.<instance>" with its heartbeat ([View.Register]),
// the marks senders and the ack monitor leave on an agent
// ([View.MarkDegraded], [MarkUnavailable]), one-off lookups of those
// records ([Instances], [Director]), and [View], a watched local cache of
// the whole bucket that merges each agent's instances ([Open], shared per
// connection by [Acquire]). The records are JSON that agents in other
// languages read too: field names do not change. It does not depend on
// the agent runtime, so services such as the ack monitor and the CLI read
// the registry without it.
package registry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/subjects"
)

// Status is an agent's lifecycle state in the registry:
// INITIALIZING → READY ⇄ BUSY → STOPPING → STOPPED, and UNAVAILABLE when
// its heartbeats stop.
type Status string

// The lifecycle states.
const (
	StatusInitializing Status = "INITIALIZING"
	StatusReady        Status = "READY"
	StatusBusy         Status = "BUSY"
	StatusStopping     Status = "STOPPING"
	StatusStopped      Status = "STOPPED"
	StatusUnavailable  Status = "UNAVAILABLE" // 3 heartbeats missed, or marked unavailable
)

// Capability is something an agent can do: a name, a version and the
// actions that implement it.
type Capability struct {
	Name    string   `json:"name"`
	Version string   `json:"version,omitempty"`
	Actions []string `json:"actions,omitempty"`
}

// Instance is one agent instance's record, renewed by its heartbeat under
// the key [subjects.InstanceKey].
type Instance struct {
	ID            string       `json:"id"`
	Instance      string       `json:"instance"`
	Type          string       `json:"type,omitempty"`
	Version       string       `json:"version,omitempty"`
	Capabilities  []Capability `json:"capabilities,omitempty"`
	Director      string       `json:"director,omitempty"`
	Status        Status       `json:"status"`
	Load          float64      `json:"load"`
	InFlight      int          `json:"in_flight"`
	Concurrency   int          `json:"concurrency"`
	LastHeartbeat time.Time    `json:"last_heartbeat"`
	// TTLSeconds is the per-key TTL, in whole seconds, the record was
	// put with (its Nats-TTL header): how long it stays live without a
	// renewal. It lets a reader judge the record stale by itself where the
	// server leaves no marker when the key expires. 0 (a writer that does
	// not say) leaves the judgement to the server's expiry.
	TTLSeconds int64 `json:"ttl_seconds,omitempty"`
	// Since is when the instance started. Instances of one agent that
	// state it take turns: only the eldest live one consumes (see
	// [View.Elder]). Zero (a writer that does not say) takes no part.
	Since time.Time `json:"since,omitzero"`
	// Host names the group whose hosting process renews this record's
	// liveness (see [Host]): the record is live while that process's
	// record "host.<group>.<instance>", of the same instance id, is and
	// lists the agent. Empty: the instance renews its record itself.
	Host string `json:"host,omitempty"`
	// Probe says the instance answers liveness probes on
	// [subjects.Scheme.Probe] from the connection it consumes on, so a
	// probe that finds no subscriber there means that connection is gone
	// (see [View.Expire]). False: a successor waits for the record's TTL.
	Probe bool `json:"probe,omitempty"`
}

// maxTTLSeconds is the largest TTL a reader takes from a record: more
// would overflow a time.Duration. A record claiming more never expires
// by its own judgement.
const maxTTLSeconds = math.MaxInt64 / int64(time.Second)

// Expired reports whether the record, put at put (its KV entry's Created
// time, the server's clock), has outlived its TTL at now: its writer
// stopped renewing it, as the server's expiry would tell where the bucket
// keeps limit markers. A record without a TTL, or an unknown put time, is
// never expired. A reader whose clock runs ahead of the server's by more
// than the TTL less the heartbeat interval (10s with agentkit's defaults)
// would take a live record for expired.
func (in Instance) Expired(put, now time.Time) bool {
	if in.TTLSeconds <= 0 || in.TTLSeconds > maxTTLSeconds || put.IsZero() {
		return false
	}
	return now.Sub(put) > time.Duration(in.TTLSeconds)*time.Second
}

// HasCapability reports whether the instance declares capability name.
func (in Instance) HasCapability(name string) bool {
	return slices.ContainsFunc(in.Capabilities, func(c Capability) bool { return c.Name == name })
}

// Instances reads the records of agent's live instances from kv, the
// registry bucket, sorted by instance id. An agent with none (never
// registered, stopped, or expired) has an empty list; a record that is not
// valid JSON, or that has outlived its TTL ([Instance.Expired]), is
// skipped. It makes one request per instance: for a
// process that does not keep a watched registry open.
func Instances(ctx context.Context, kv jetstream.KeyValue, agent string) ([]Instance, error) {
	filter, err := subjects.InstancesFilter(agent)
	if err != nil {
		return nil, fmt.Errorf("registry: %w", err)
	}
	lister, err := kv.ListKeysFiltered(ctx, filter)
	if errors.Is(err, jetstream.ErrNoKeysFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("registry: instances of %s: %w", agent, err)
	}
	defer func() { _ = lister.Stop() }()
	var out []Instance
	for key := range lister.Keys() {
		e, err := kv.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue // expired or deregistered since the listing
		}
		if err != nil {
			return nil, fmt.Errorf("registry: %s: %w", key, err)
		}
		var in Instance
		if json.Unmarshal(e.Value(), &in) != nil || in.Expired(e.Created(), time.Now()) {
			continue
		}
		if in.Host != "" {
			var live bool
			if in, live, err = hostedInstance(ctx, kvGet(kv), in, e.Created()); err != nil {
				return nil, err
			} else if !live {
				continue
			}
		}
		out = append(out, in)
	}
	slices.SortFunc(out, func(a, b Instance) int {
		switch {
		case a.Instance < b.Instance:
			return -1
		case a.Instance > b.Instance:
			return 1
		}
		return 0
	})
	return out, nil
}

// getFunc reads a key's latest value and when it was put; found is false
// when the key holds none.
type getFunc func(ctx context.Context, key string) (value []byte, put time.Time, found bool, err error)

// kvGet is a getFunc reading kv.
func kvGet(kv jetstream.KeyValue) getFunc {
	return func(ctx context.Context, key string) ([]byte, time.Time, bool, error) {
		e, err := kv.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil, time.Time{}, false, nil
		}
		if err != nil {
			return nil, time.Time{}, false, err
		}
		return e.Value(), e.Created(), true, nil
	}
}

// hostedInstance reads, with get, the host record of in, a hosted
// instance's record put at put, and returns in with the host's heartbeat
// applied and whether it is live (see [Host]).
func hostedInstance(ctx context.Context, get getFunc, in Instance, put time.Time) (Instance, bool, error) {
	key, err := subjects.HostKey(in.Host, in.Instance)
	if err != nil {
		return in, false, nil // not a host any writer could have put
	}
	v, hostPut, found, err := get(ctx, key)
	if err != nil {
		return in, false, fmt.Errorf("registry: %s: %w", key, err)
	}
	var h Host
	if !found || json.Unmarshal(v, &h) != nil || h.Expired(hostPut, time.Now()) {
		return in, false, nil
	}
	in, live := hosted(in, put, h, hostPut)
	return in, live, nil
}

// Director returns the director agent's live instances declare (the first
// instance naming one), or "" when none does.
func Director(ctx context.Context, kv jetstream.KeyValue, agent string) (string, error) {
	ins, err := Instances(ctx, kv, agent)
	if err != nil {
		return "", err
	}
	for _, in := range ins {
		if in.Director != "" {
			return in.Director, nil
		}
	}
	return "", nil
}
