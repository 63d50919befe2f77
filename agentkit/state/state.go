package state

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/agentkit/bucket"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// Errors of the shared state and session stores. Each is returned wrapped
// with context; match with errors.Is.
var (
	// ErrNotFound: the state entry or session does not exist (or has expired).
	ErrNotFound = errors.New("state: not found")
	// ErrExists: State.Create found the entry already present.
	ErrExists = errors.New("state: already exists")
	// ErrConflict: a compare-and-swap update lost to concurrent writers on
	// every attempt.
	ErrConflict = errors.New("state: update conflict")
	// ErrInvalid: an argument was out of range (an unknown entity kind, a
	// task status, a session lifetime, a nil JetStream, negative
	// replicas), or an existing bucket cannot serve the store.
	ErrInvalid = errors.New("state: invalid argument")
	// ErrInvalidID: an entity, session or agent id is not a subject token;
	// it also matches subjects.ErrInvalidToken.
	ErrInvalidID = errors.New("state: invalid id")
)

// stateHistory is the number of revisions the state bucket keeps per key.
const stateHistory = 16

// EntityKind is the type of a shared state entry (entity_type).
type EntityKind string

// The entity kinds of the shared state.
const (
	EntityTask     EntityKind = "TASK"     // a task's TaskState
	EntityAgent    EntityKind = "AGENT"    // an agent's status as the mesh shares it
	EntityResource EntityKind = "RESOURCE" // a ResourceAllocation
	EntityPolicy   EntityKind = "POLICY"   // a PolicyState
)

// EntityKinds lists every entity kind.
var EntityKinds = []EntityKind{EntityTask, EntityAgent, EntityResource, EntityPolicy}

// Valid reports whether k is one of [EntityKinds].
func (k EntityKind) Valid() bool { return slices.Contains(EntityKinds, k) }

// State is the mesh's shared state: JSON values keyed
// by entity kind and id in the KV bucket [subjects.Scheme.StateBucket]
// ("mesh_state"), under the key "<kind in lower case>.<id>", e.g. "task.t1"
// ([subjects.StateKey]).
// Writers coordinate by compare-and-swap on the key's revision, so concurrent
// updates are never lost.
//
// All methods are safe for concurrent use, also by several State values on
// different connections. Calls without a deadline on ctx get the jetstream
// package's default request timeout (5s).
type State struct {
	kv     jetstream.KeyValue
	bucket string
}

// Open binds to the state bucket of scheme as it exists. When provision is
// true it first creates the bucket if it is missing (16 revisions of
// history per key, file storage, replicas copies; 0 means 1); without
// provisioning a missing bucket is an error matching
// jetstream.ErrBucketNotFound. It starts no goroutine.
func Open(ctx context.Context, js jetstream.JetStream, scheme subjects.Scheme, replicas int, provision bool) (*State, error) {
	bucketName := scheme.StateBucket()
	kv, err := bucket.KeyValue(ctx, js, jetstream.KeyValueConfig{
		Bucket:      bucketName,
		Description: "agentmesh shared state",
		History:     stateHistory,
		Storage:     jetstream.FileStorage,
		Replicas:    replicas,
	}, provision)
	if err != nil {
		return nil, bucketErr(err)
	}
	return &State{kv: kv, bucket: bucketName}, nil
}

// bucketErr wraps an error of package bucket, matching [ErrInvalid] for
// the arguments it refuses.
func bucketErr(err error) error {
	if errors.Is(err, bucket.ErrInvalid) {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return fmt.Errorf("state: %w", err)
}

// StateEntry is one value of the shared state.
type StateEntry struct {
	Kind     EntityKind      `json:"entity_type"`
	ID       string          `json:"entity_id"`
	Value    json.RawMessage `json:"value"`
	Revision uint64          `json:"version"`    // the KV revision; increases with every write to the bucket
	Updated  time.Time       `json:"updated_at"` // when the revision was stored: the server's time from Get, the local time from Update
}

// Decode unmarshals the entry's value into v.
func (e *StateEntry) Decode(v any) error {
	if err := json.Unmarshal(e.Value, v); err != nil {
		return fmt.Errorf("state: %s %s: decode: %w", e.Kind, e.ID, err)
	}
	return nil
}

// checkKind returns an error matching [ErrInvalid] unless kind is one of
// [EntityKinds].
func checkKind(kind EntityKind) error {
	if !kind.Valid() {
		return fmt.Errorf("%w: entity kind %q (want TASK, AGENT, RESOURCE or POLICY)", ErrInvalid, string(kind))
	}
	return nil
}

// stateKey returns the KV key of kind and id after checking both.
func stateKey(kind EntityKind, id string) (string, error) {
	if err := checkKind(kind); err != nil {
		return "", err
	}
	key, err := subjects.StateKey(string(kind), id)
	if err != nil {
		// The kind is valid: the id is what subjects refused.
		return "", fmt.Errorf("%w: %w", ErrInvalidID, err)
	}
	return key, nil
}

// Get returns the current value of kind/id, or an error matching
// [ErrNotFound] when there is none (never written, or deleted).
func (s *State) Get(ctx context.Context, kind EntityKind, id string) (*StateEntry, error) {
	key, err := stateKey(kind, id)
	if err != nil {
		return nil, err
	}
	e, err := s.kv.Get(ctx, key)
	if err != nil {
		return nil, s.fail("get", kind, id, err)
	}
	return &StateEntry{Kind: kind, ID: id, Value: e.Value(), Revision: e.Revision(), Updated: e.Created()}, nil
}

// Create stores value (encoded with encoding/json) as kind/id if there is no
// current value, and returns its revision. An existing value is an error
// matching [ErrExists]; a deleted one may be created again.
func (s *State) Create(ctx context.Context, kind EntityKind, id string, value any) (uint64, error) {
	key, err := stateKey(kind, id)
	if err != nil {
		return 0, err
	}
	b, err := json.Marshal(value)
	if err != nil {
		return 0, fmt.Errorf("state: create %s %s: encode: %w", kind, id, err)
	}
	rev, err := s.kv.Create(ctx, key, b)
	if err != nil {
		return 0, s.fail("create", kind, id, err)
	}
	return rev, nil
}

// Update reads kind/id, calls fn with its current value (nil when there is
// none) and writes what fn returns (encoded with encoding/json) with
// compare-and-swap on the revision read: created when there was no value,
// updated otherwise. When another writer got there first, fn runs again on
// the newer value, so fn must be free of side effects and may run several
// times; after 32 lost races Update gives up with an error matching
// [ErrConflict]. An error returned by fn aborts the update and is returned
// wrapped. Update returns the entry written.
func (s *State) Update(ctx context.Context, kind EntityKind, id string, fn func(old json.RawMessage) (any, error)) (*StateEntry, error) {
	key, err := stateKey(kind, id)
	if err != nil {
		return nil, err
	}
	var written *StateEntry
	err = bucket.Retry(ctx, ErrConflict, fmt.Sprintf("state: update %s %s", kind, id), func() error {
		var old json.RawMessage
		var rev uint64
		e, err := s.kv.Get(ctx, key)
		switch {
		case err == nil:
			old, rev = e.Value(), e.Revision()
		case !errors.Is(err, jetstream.ErrKeyNotFound):
			return s.fail("update", kind, id, err)
		}
		v, err := fn(old)
		if err != nil {
			return fmt.Errorf("state: update %s %s: %w", kind, id, err)
		}
		b, err := json.Marshal(v)
		if err != nil {
			return fmt.Errorf("state: update %s %s: encode: %w", kind, id, err)
		}
		if rev == 0 {
			rev, err = s.kv.Create(ctx, key, b)
		} else {
			rev, err = s.kv.Update(ctx, key, b, rev)
		}
		if bucket.IsConflict(err) {
			return err
		}
		if err != nil {
			return s.fail("update", kind, id, err)
		}
		written = &StateEntry{Kind: kind, ID: id, Value: b, Revision: rev, Updated: time.Now().UTC()}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return written, nil
}

// Delete removes kind/id; its history stays in the bucket until newer
// revisions push it out. Deleting an entry that does not exist is an error
// matching [ErrNotFound].
func (s *State) Delete(ctx context.Context, kind EntityKind, id string) error {
	key, err := stateKey(kind, id)
	if err != nil {
		return err
	}
	return bucket.Retry(ctx, ErrConflict, fmt.Sprintf("state: delete %s %s", kind, id), func() error {
		e, err := s.kv.Get(ctx, key)
		if err != nil {
			return s.fail("delete", kind, id, err)
		}
		// The revision check keeps a racing delete from writing a second
		// marker (and a second DELETE change) for one deletion.
		err = s.kv.Delete(ctx, key, jetstream.LastRevision(e.Revision()))
		if bucket.IsConflict(err) {
			return err
		}
		if err != nil {
			return s.fail("delete", kind, id, err)
		}
		return nil
	})
}

// fail wraps a KV error, mapping the jetstream sentinels to ours.
func (s *State) fail(op string, kind EntityKind, id string, err error) error {
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return fmt.Errorf("%w: state %s %s", ErrNotFound, kind, id)
	case errors.Is(err, jetstream.ErrKeyExists):
		return fmt.Errorf("%w: state %s %s", ErrExists, kind, id)
	}
	return fmt.Errorf("state: %s %s %s: %w", op, kind, id, err)
}

// The operations of a [StateChange] (StateUpdate.operation).
const (
	ChangeCreate = "CREATE"
	ChangeUpdate = "UPDATE"
	ChangeDelete = "DELETE"
)

// StateChange is one change of the shared state as [State.Watch] reports it:
// the protocol's StateUpdate, with the entry's full new value as changes.
type StateChange struct {
	Operation string          `json:"operation"` // ChangeCreate, ChangeUpdate or ChangeDelete
	Kind      EntityKind      `json:"entity_type"`
	ID        string          `json:"entity_id"`
	Value     json.RawMessage `json:"changes,omitempty"` // the new value; nil on DELETE
	Revision  uint64          `json:"version"`
	Timestamp time.Time       `json:"timestamp"` // when the server stored the change
}

// Watch reports every change to entries of the given kinds (every kind if
// none) made from now on, in revision order, until ctx ends; the channel is
// closed then. Current values are not replayed.
//
// A put is reported as ChangeCreate when the key held no value before it
// (never written, or deleted) and as ChangeUpdate otherwise. Telling them
// apart takes one lookup of the key's history the first time the watch sees
// the key; should the key have been written 16 more times before the watch
// got to its creation, the history no longer shows it and the creation is
// reported as ChangeUpdate.
//
// The caller must keep receiving until the channel is closed, or cancel
// ctx: an unread channel holds up this watch (not other watchers or
// writers). Watch starts one goroutine, which ends when ctx does.
func (s *State) Watch(ctx context.Context, kinds ...EntityKind) (<-chan StateChange, error) {
	filters := make([]string, 0, len(kinds))
	for _, k := range kinds {
		if err := checkKind(k); err != nil {
			return nil, err
		}
		f, err := subjects.StateFilter(string(k))
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
		}
		if !slices.Contains(filters, f) {
			filters = append(filters, f)
		}
	}
	w, err := s.kv.WatchFiltered(ctx, filters, jetstream.UpdatesOnly())
	if err != nil {
		return nil, fmt.Errorf("state: watch: %w", err)
	}
	out := make(chan StateChange, 64)
	go s.watch(ctx, w, out)
	return out, nil
}

// watch forwards the watcher's entries to out until ctx ends.
func (s *State) watch(ctx context.Context, w jetstream.KeyWatcher, out chan<- StateChange) {
	defer close(out)
	defer func() {
		// The watcher's callback blocks on a full Updates channel while it
		// holds the lock the close handler needs: drain until it closes.
		_ = w.Stop()
		for range w.Updates() {
		}
	}()
	live := map[string]bool{} // keys known to hold a value (true) or not (false)
	for {
		var e jetstream.KeyValueEntry
		var ok bool
		select {
		case <-ctx.Done():
			return
		case e, ok = <-w.Updates():
			if !ok {
				return
			}
		}
		if e == nil {
			continue // end of initial values: there are none with UpdatesOnly
		}
		k, id, err := subjects.ParseStateKey(e.Key())
		kind := EntityKind(k)
		if err != nil || !kind.Valid() {
			continue
		}
		c := StateChange{Kind: kind, ID: id, Revision: e.Revision(), Timestamp: e.Created().UTC()}
		if e.Operation() == jetstream.KeyValuePut {
			c.Value = e.Value()
			existed, known := live[e.Key()]
			if !known {
				existed = s.existedBefore(ctx, e.Key(), e.Revision())
			}
			c.Operation = ChangeUpdate
			if !existed {
				c.Operation = ChangeCreate
			}
			live[e.Key()] = true
		} else {
			c.Operation = ChangeDelete
			live[e.Key()] = false
		}
		select {
		case out <- c:
		case <-ctx.Done():
			return
		}
	}
}

// existedBefore reports whether key held a value just before revision rev,
// from the key's retained history. When the history no longer reaches back
// to rev it guesses true (an update): it only does once the key has been
// written 16 more times since.
func (s *State) existedBefore(ctx context.Context, key string, rev uint64) bool {
	hist, err := s.kv.History(ctx, key)
	if err != nil {
		return true
	}
	i := slices.IndexFunc(hist, func(e jetstream.KeyValueEntry) bool { return e.Revision() == rev })
	switch {
	case i < 0:
		return true
	case i == 0:
		// Nothing older is retained: either rev was the first write, or
		// older revisions were pushed out by the history limit.
		return len(hist) >= stateHistory
	default:
		return hist[i-1].Operation() == jetstream.KeyValuePut
	}
}

// ResourceAllocation is an agent's share of a resource, stored as
// [EntityResource].
type ResourceAllocation struct {
	AgentID      string     `json:"agent_id"`
	ResourceType string     `json:"resource_type"` // tokens, cpu, memory or budget
	Allocated    float64    `json:"allocated"`
	Consumed     float64    `json:"consumed"`
	Limit        float64    `json:"limit"`
	ExpiresAt    *time.Time `json:"expires_at,omitempty"`
}

// PolicyState is the mesh-wide policy, stored as [EntityPolicy].
type PolicyState struct {
	Version              string               `json:"version"`
	EnabledChains        []string             `json:"enabled_chains"`
	RiskThresholds       PolicyRiskThresholds `json:"risk_thresholds"`
	BudgetLimits         PolicyBudgetLimits   `json:"budget_limits"`
	CircuitBreakerConfig PolicyCircuitBreaker `json:"circuit_breaker_config"`
}

// PolicyRiskThresholds are the low and high risk bounds of a [PolicyState].
type PolicyRiskThresholds struct {
	Low  float64 `json:"low"`
	High float64 `json:"high"`
}

// PolicyBudgetLimits are the spending limits of a [PolicyState].
type PolicyBudgetLimits struct {
	PerTask  float64 `json:"per_task"`
	PerAgent float64 `json:"per_agent"`
	Total    float64 `json:"total"`
}

// PolicyCircuitBreaker is the circuit breaker setting of a [PolicyState].
type PolicyCircuitBreaker struct {
	ErrorThreshold int   `json:"error_threshold"`
	TimeoutMS      int64 `json:"timeout_ms"`
	ResetTimeoutMS int64 `json:"reset_timeout_ms"`
}
