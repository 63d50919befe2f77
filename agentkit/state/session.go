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
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// sessionMarkerTTL is how long the sessions bucket keeps the marker of an
// expired or deleted session, so watchers can see it go.
const sessionMarkerTTL = time.Minute

// minSessionTTL is the shortest session lifetime: the server's minimum
// per-message TTL.
const minSessionTTL = time.Second

// Session is a shared conversation context between agents:
// who takes part, the task, and the decisions and artifacts so far. Agents
// refer to it with the envelope's session_id (agentkit.WithSessionID) and
// read it with [Sessions.Get].
type Session struct {
	ID           string         `json:"id"`
	Initiator    string         `json:"initiator"`
	Participants []string       `json:"participants"`
	CreatedAt    time.Time      `json:"created_at"`
	ExpiresAt    time.Time      `json:"expires_at"`
	Context      SessionContext `json:"context"`
}

// SessionContext is what a session has accumulated.
type SessionContext struct {
	Task      string     `json:"task,omitempty"`
	Decisions []Decision `json:"decisions,omitempty"` // sorted by At
	Artifacts []Artifact `json:"artifacts,omitempty"` // sorted by At
}

// Decision is one decision taken in a session.
type Decision struct {
	By       string    `json:"by"` // the agent that decided
	Decision string    `json:"decision"`
	At       time.Time `json:"at"`
}

// Artifact is something a session produced, by reference.
type Artifact struct {
	Name string    `json:"name"`
	Kind string    `json:"kind,omitempty"` // e.g. "file", "dataset", "report"
	URI  string    `json:"uri,omitempty"`
	By   string    `json:"by"` // the agent that produced it
	At   time.Time `json:"at"`
}

// Sessions stores sessions in the KV bucket [subjects.Scheme.SessionsBucket]
// ("mesh_sessions"), one key per session id. Each session expires at its
// ExpiresAt: the server removes it (per-message TTL), and [Sessions.Get]
// reports ErrNotFound from then on even if the server is a moment late.
// Changes use compare-and-swap on the key's revision, so concurrent writers
// never lose each other's decisions or artifacts; lists are kept in
// timestamp order (conflicts are resolved by timestamp).
//
// All methods are safe for concurrent use, also by several Sessions values
// on different connections.
type Sessions struct {
	js     jetstream.JetStream
	kv     jetstream.KeyValue
	bucket string
}

// OpenSessions binds to the sessions bucket of scheme as it exists. When
// provision is true it first creates the bucket if it is missing (one
// revision per key, file storage, per-key TTLs enabled, replicas copies; 0
// means 1); without provisioning a missing bucket is an error matching
// jetstream.ErrBucketNotFound. The bucket must allow per-key TTLs
// (KeyValueConfig.LimitMarkerTTL), else sessions could never expire and
// OpenSessions fails with an error matching [ErrInvalid]. It starts no
// goroutine.
func OpenSessions(ctx context.Context, js jetstream.JetStream, scheme subjects.Scheme, replicas int, provision bool) (*Sessions, error) {
	name := scheme.SessionsBucket()
	kv, err := bucket.KeyValue(ctx, js, jetstream.KeyValueConfig{
		Bucket:         name,
		Description:    "agentmesh sessions",
		History:        1,
		Storage:        jetstream.FileStorage,
		Replicas:       replicas,
		LimitMarkerTTL: sessionMarkerTTL,
	}, provision)
	if err != nil {
		return nil, bucketErr(err)
	}
	st, err := kv.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("state: bucket %s: %w", name, err)
	}
	if st.LimitMarkerTTL() <= 0 {
		return nil, fmt.Errorf("%w: bucket %s does not allow per-key TTLs (LimitMarkerTTL is 0)", ErrInvalid, name)
	}
	return &Sessions{js: js, kv: kv, bucket: name}, nil
}

// Create starts a session by initiator that lasts ttl (at least 1s) about
// task, with id "sess_<uuid>". Participants are initiator followed by the
// given agents, without duplicates. Every agent id must be a subject token.
func (s *Sessions) Create(ctx context.Context, initiator string, ttl time.Duration, task string, participants ...string) (*Session, error) {
	if ttl < minSessionTTL {
		return nil, fmt.Errorf("%w: session ttl %v < %v", ErrInvalid, ttl, minSessionTTL)
	}
	members := make([]string, 0, len(participants)+1)
	for _, p := range append([]string{initiator}, participants...) {
		if err := subjects.ValidateToken("agent id", p); err != nil {
			return nil, fmt.Errorf("%w: session participant: %w", ErrInvalidID, err)
		}
		if !slices.Contains(members, p) {
			members = append(members, p)
		}
	}
	now := time.Now().UTC()
	sess := &Session{
		ID:           "sess_" + wire.NewMessageID(),
		Initiator:    initiator,
		Participants: members,
		CreatedAt:    now,
		ExpiresAt:    now.Add(ttl),
		Context:      SessionContext{Task: task},
	}
	b, err := json.Marshal(sess)
	if err != nil {
		return nil, fmt.Errorf("state: session create: encode: %w", err)
	}
	if _, err := s.kv.Create(ctx, sess.ID, b, jetstream.KeyTTL(serverTTL(ttl))); err != nil {
		return nil, fmt.Errorf("state: session create %s: %w", sess.ID, err)
	}
	return sess, nil
}

// Get returns session id, or an error matching [ErrNotFound] when it does
// not exist, was deleted or has expired.
func (s *Sessions) Get(ctx context.Context, id string) (*Session, error) {
	sess, _, err := s.get(ctx, id)
	return sess, err
}

// get returns session id and its revision.
func (s *Sessions) get(ctx context.Context, id string) (*Session, uint64, error) {
	key, err := subjects.SessionKey(id)
	if err != nil {
		return nil, 0, fmt.Errorf("%w: %w", ErrInvalidID, err)
	}
	e, err := s.kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, 0, fmt.Errorf("%w: session %s", ErrNotFound, id)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("state: session get %s: %w", id, err)
	}
	var sess Session
	if err := json.Unmarshal(e.Value(), &sess); err != nil {
		return nil, 0, fmt.Errorf("state: session get %s: decode: %w", id, err)
	}
	if !time.Now().Before(sess.ExpiresAt) {
		return nil, 0, fmt.Errorf("%w: session %s expired at %s", ErrNotFound, id, sess.ExpiresAt.Format(time.RFC3339))
	}
	return &sess, e.Revision(), nil
}

// Join adds agent to the participants of session id (no change if it is
// one already) and returns the session.
func (s *Sessions) Join(ctx context.Context, id, agent string) (*Session, error) {
	if err := subjects.ValidateToken("agent id", agent); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidID, err)
	}
	return s.update(ctx, id, func(sess *Session) {
		if !slices.Contains(sess.Participants, agent) {
			sess.Participants = append(sess.Participants, agent)
		}
	})
}

// AddDecision records d in session id and returns the session. d.By must be
// an agent id and d.Decision not empty; a zero d.At is set to now. Decisions
// stay sorted by At (equal times keep the order they were added in), so
// concurrent decisions from several agents all land, in timestamp order.
func (s *Sessions) AddDecision(ctx context.Context, id string, d Decision) (*Session, error) {
	if err := subjects.ValidateToken("decision by", d.By); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidID, err)
	}
	if d.Decision == "" {
		return nil, fmt.Errorf("%w: empty decision", ErrInvalid)
	}
	if d.At.IsZero() {
		d.At = time.Now()
	}
	d.At = d.At.UTC()
	return s.update(ctx, id, func(sess *Session) {
		sess.Context.Decisions = insertByTime(sess.Context.Decisions, d, func(d Decision) time.Time { return d.At })
	})
}

// AddArtifact records a in session id and returns the session. a.By must be
// an agent id and a.Name not empty; a zero a.At is set to now. Artifacts
// stay sorted by At, as decisions do.
func (s *Sessions) AddArtifact(ctx context.Context, id string, a Artifact) (*Session, error) {
	if err := subjects.ValidateToken("artifact by", a.By); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidID, err)
	}
	if a.Name == "" {
		return nil, fmt.Errorf("%w: artifact without a name", ErrInvalid)
	}
	if a.At.IsZero() {
		a.At = time.Now()
	}
	a.At = a.At.UTC()
	return s.update(ctx, id, func(sess *Session) {
		sess.Context.Artifacts = insertByTime(sess.Context.Artifacts, a, func(a Artifact) time.Time { return a.At })
	})
}

// insertByTime inserts v into list (sorted by at) after every element not
// later than v.
func insertByTime[T any](list []T, v T, at func(T) time.Time) []T {
	t := at(v)
	i, _ := slices.BinarySearchFunc(list, t, func(e T, t time.Time) int {
		if at(e).After(t) {
			return 1
		}
		return -1 // equal times sort before v: v goes after them
	})
	return slices.Insert(list, i, v)
}

// Delete removes session id at once, or returns an error matching
// [ErrNotFound] if it does not exist or has expired.
func (s *Sessions) Delete(ctx context.Context, id string) error {
	return bucket.Retry(ctx, ErrConflict, "state: session delete "+id, func() error {
		_, rev, err := s.get(ctx, id)
		if err != nil {
			return err
		}
		// Purge drops the value; the marker itself expires.
		err = s.kv.Purge(ctx, id, jetstream.LastRevision(rev), jetstream.PurgeTTL(sessionMarkerTTL))
		if bucket.IsConflict(err) {
			return err
		}
		if err != nil {
			return fmt.Errorf("state: session delete %s: %w", id, err)
		}
		return nil
	})
}

// update applies fn to session id and writes it back with compare-and-swap,
// retrying on conflict. The write carries the session's remaining lifetime
// as its TTL: KV Update would drop the TTL and make the session
// permanent, so the value is published to the key's subject with a
// Nats-TTL header and the expected-revision header instead.
func (s *Sessions) update(ctx context.Context, id string, fn func(*Session)) (*Session, error) {
	subject := subjects.KVSubject(s.bucket, id)
	var updated *Session
	err := bucket.Retry(ctx, ErrConflict, "state: session update "+id, func() error {
		sess, rev, err := s.get(ctx, id)
		if err != nil {
			return err
		}
		fn(sess)
		remaining := time.Until(sess.ExpiresAt)
		if remaining <= 0 {
			return fmt.Errorf("%w: session %s expired at %s", ErrNotFound, id, sess.ExpiresAt.Format(time.RFC3339))
		}
		b, err := json.Marshal(sess)
		if err != nil {
			return fmt.Errorf("state: session update %s: encode: %w", id, err)
		}
		_, err = s.js.Publish(ctx, subject, b,
			jetstream.WithMsgTTL(serverTTL(remaining)),
			jetstream.WithExpectLastSequencePerSubject(rev))
		if bucket.IsConflict(err) {
			return err
		}
		if err != nil {
			return fmt.Errorf("state: session update %s: %w", id, err)
		}
		updated = sess
		return nil
	})
	if err != nil {
		return nil, err
	}
	return updated, nil
}

// serverTTL rounds d up to whole seconds, at least one: the server counts
// per-message TTLs in seconds and rejects shorter ones. The session may
// thus stay in the bucket up to a second past ExpiresAt; Get hides it.
func serverTTL(d time.Duration) time.Duration {
	return max(bucket.KeyTTL(d), minSessionTTL)
}
