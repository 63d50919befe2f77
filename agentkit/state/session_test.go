package state_test

import (
	"errors"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/agentkit/state"
	"github.com/agentmesh-io/agentmesh/internal/jsontest"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// sessionStore opens the sessions store of m's server on a new connection.
func (m *mesh) sessionStore() *state.Sessions {
	m.t.Helper()
	js, err := jetstream.New(m.conn())
	if err != nil {
		m.t.Fatal(err)
	}
	s, err := state.OpenSessions(ctx(m.t), js, subjects.Default, 1, true)
	if err != nil {
		m.t.Fatalf("OpenSessions: %v", err)
	}
	return s
}

func TestSessions_Lifecycle(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	s := m.sessionStore()
	c := ctx(t)

	sess, err := s.Create(c, "planner", time.Hour, "analyse logs", "executor", "planner", "reviewer")
	if err != nil {
		t.Fatal(err)
	}
	if err := subjects.ValidateToken("session id", sess.ID); err != nil || sess.ID[:5] != "sess_" {
		t.Fatalf("session id %q: %v", sess.ID, err)
	}
	if want := []string{"planner", "executor", "reviewer"}; !slices.Equal(sess.Participants, want) {
		t.Errorf("participants = %v, want %v", sess.Participants, want)
	}
	if sess.Initiator != "planner" || sess.Context.Task != "analyse logs" || sess.ExpiresAt.Sub(sess.CreatedAt) != time.Hour {
		t.Errorf("session = %+v", sess)
	}

	got, err := s.Get(c, sess.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != sess.ID || !got.ExpiresAt.Equal(sess.ExpiresAt) || !slices.Equal(got.Participants, sess.Participants) {
		t.Fatalf("Get = %+v, want %+v", got, sess)
	}

	if got, err = s.Join(c, sess.ID, "critic"); err != nil {
		t.Fatal(err)
	}
	if got, err = s.Join(c, sess.ID, "critic"); err != nil { // idempotent
		t.Fatal(err)
	}
	if want := []string{"planner", "executor", "reviewer", "critic"}; !slices.Equal(got.Participants, want) {
		t.Errorf("participants after Join = %v, want %v", got.Participants, want)
	}

	t0 := time.Now().UTC().Add(-time.Minute)
	if _, err := s.AddDecision(c, sess.ID, state.Decision{By: "planner", Decision: "add indices", At: t0.Add(2 * time.Second)}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AddDecision(c, sess.ID, state.Decision{By: "executor", Decision: "use JSONL", At: t0}); err != nil {
		t.Fatal(err)
	}
	got, err = s.AddDecision(c, sess.ID, state.Decision{By: "critic", Decision: "no decision time"})
	if err != nil {
		t.Fatal(err)
	}
	var order []string
	for _, d := range got.Context.Decisions {
		order = append(order, d.Decision)
	}
	if want := []string{"use JSONL", "add indices", "no decision time"}; !slices.Equal(order, want) {
		t.Errorf("decisions = %v, want %v (sorted by At)", order, want)
	}
	if got.Context.Decisions[2].At.IsZero() {
		t.Error("zero decision time not set")
	}

	got, err = s.AddArtifact(c, sess.ID, state.Artifact{Name: "report.md", Kind: "file", URI: "obj://mesh_payloads/report.md", By: "executor"})
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Context.Artifacts) != 1 || got.Context.Artifacts[0].Name != "report.md" || got.Context.Artifacts[0].At.IsZero() {
		t.Errorf("artifacts = %+v", got.Context.Artifacts)
	}

	// What the updates wrote is what Get reads.
	again, err := s.Get(c, sess.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(again.Participants) != 4 || len(again.Context.Decisions) != 3 || len(again.Context.Artifacts) != 1 {
		t.Errorf("Get after updates = %+v", again)
	}

	if err := s.Delete(c, sess.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(c, sess.ID); !errors.Is(err, state.ErrNotFound) {
		t.Fatalf("Get after Delete: %v, want ErrNotFound", err)
	}
	for name, err := range map[string]error{
		"Delete":      s.Delete(c, sess.ID),
		"Join":        errOf(s.Join(c, sess.ID, "late")),
		"AddDecision": errOf(s.AddDecision(c, sess.ID, state.Decision{By: "late", Decision: "x"})),
		"AddArtifact": errOf(s.AddArtifact(c, sess.ID, state.Artifact{By: "late", Name: "x"})),
	} {
		if !errors.Is(err, state.ErrNotFound) {
			t.Errorf("%s of a deleted session: %v, want ErrNotFound", name, err)
		}
	}
}

func errOf[T any](_ T, err error) error { return err }

func TestSessions_InvalidArguments(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	s := m.sessionStore()
	c := ctx(t)
	sess, err := s.Create(c, "planner", time.Minute, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name    string
		err     error
		wantErr error
	}{
		{"ttl below 1s", errOf(s.Create(c, "planner", 500*time.Millisecond, "")), state.ErrInvalid},
		{"bad initiator", errOf(s.Create(c, "a.b", time.Minute, "")), state.ErrInvalidID},
		{"bad participant", errOf(s.Create(c, "planner", time.Minute, "", "x y")), state.ErrInvalidID},
		{"bad session id", errOf(s.Get(c, "sess.1")), state.ErrInvalidID},
		{"unknown session", errOf(s.Get(c, "sess_unknown")), state.ErrNotFound},
		{"bad joiner", errOf(s.Join(c, sess.ID, "*")), state.ErrInvalidID},
		{"decision without author", errOf(s.AddDecision(c, sess.ID, state.Decision{Decision: "x"})), state.ErrInvalidID},
		{"empty decision", errOf(s.AddDecision(c, sess.ID, state.Decision{By: "planner"})), state.ErrInvalid},
		{"artifact without name", errOf(s.AddArtifact(c, sess.ID, state.Artifact{By: "planner"})), state.ErrInvalid},
	} {
		if !errors.Is(tt.err, tt.wantErr) {
			t.Errorf("%s: %v, want %v", tt.name, tt.err, tt.wantErr)
		}
	}
}

func TestSessions_ConcurrentDecisionsAllLandInTimeOrder(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	c := ctx(t)
	writers := []*state.Sessions{m.sessionStore(), m.sessionStore()}
	sess, err := writers[0].Create(c, "planner", time.Hour, "race")
	if err != nil {
		t.Fatal(err)
	}
	base := time.Now().UTC()
	const perWriter = 20
	var wg sync.WaitGroup
	start := make(chan struct{})
	for w, s := range writers {
		agent := []string{"agent_a", "agent_b"}[w]
		wg.Go(func() {
			<-start
			for i := range perWriter {
				// Interleaved timestamps, written out of order.
				at := base.Add(time.Duration((perWriter-i)*2+w) * time.Millisecond)
				if _, err := s.AddDecision(c, sess.ID, state.Decision{By: agent, Decision: at.Format(time.RFC3339Nano), At: at}); err != nil {
					t.Errorf("AddDecision: %v", err)
				}
			}
		})
	}
	close(start)
	wg.Wait()

	got, err := writers[1].Get(c, sess.ID)
	if err != nil {
		t.Fatal(err)
	}
	ds := got.Context.Decisions
	if len(ds) != 2*perWriter {
		t.Fatalf("%d decisions, want %d: concurrent decisions were lost", len(ds), 2*perWriter)
	}
	if !sort.SliceIsSorted(ds, func(i, j int) bool { return ds[i].At.Before(ds[j].At) }) {
		t.Fatalf("decisions not sorted by At: %v", ds)
	}
	by := map[string]int{}
	for _, d := range ds {
		by[d.By]++
	}
	if by["agent_a"] != perWriter || by["agent_b"] != perWriter {
		t.Errorf("decisions per agent = %v", by)
	}
}

// TestSessions_ExpiresAfterUpdate checks that a session updated after its
// creation still expires: KV Update would have dropped the key's TTL.
func TestSessions_ExpiresAfterUpdate(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	s := m.sessionStore()
	c := ctx(t)
	js, err := jetstream.New(m.conn())
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(c, "mesh_sessions")
	if err != nil {
		t.Fatal(err)
	}

	const ttl = 2 * time.Second
	updated, err := s.Create(c, "planner", ttl, "short")
	if err != nil {
		t.Fatal(err)
	}
	untouched, err := s.Create(c, "planner", ttl, "short")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Join(c, updated.ID, "executor"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AddDecision(c, updated.ID, state.Decision{By: "executor", Decision: "go"}); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Get(c, updated.ID); err != nil || len(got.Participants) != 2 {
		t.Fatalf("Get before expiry = %+v, %v", got, err)
	}

	for _, id := range []string{updated.ID, untouched.ID} {
		// Get hides the session from ExpiresAt on ...
		eventually(t, ttl+3*time.Second, "Get reports "+id+" expired", func() bool {
			_, err := s.Get(c, id)
			return errors.Is(err, state.ErrNotFound)
		})
		// ... and the server removes it, updated or not.
		eventually(t, ttl+3*time.Second, "server removes "+id, func() bool {
			_, err := kv.Get(c, id)
			return errors.Is(err, jetstream.ErrKeyNotFound)
		})
	}
	if _, err := s.Join(c, updated.ID, "late"); !errors.Is(err, state.ErrNotFound) {
		t.Fatalf("Join of an expired session: %v, want ErrNotFound", err)
	}
}

func TestSessions_BucketWithoutTTLRefused(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	c := ctx(t)
	js, err := jetstream.New(m.conn())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateKeyValue(c, jetstream.KeyValueConfig{Bucket: "mesh_sessions"}); err != nil {
		t.Fatal(err)
	}
	if _, err := state.OpenSessions(c, js, subjects.Default, 1, true); !errors.Is(err, state.ErrInvalid) {
		t.Fatalf("OpenSessions on a bucket without LimitMarkerTTL: %v, want ErrInvalid", err)
	}
}

func TestSessions_JSON(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 1, 10, 14, 30, 0, 0, time.UTC)
	b := jsontest.Marshal(t, state.Session{ID: "sess_1", Initiator: "a", Participants: []string{"a"}, CreatedAt: at, ExpiresAt: at,
		Context: state.SessionContext{Task: "t",
			Decisions: []state.Decision{{By: "a", Decision: "d", At: at}},
			Artifacts: []state.Artifact{{Name: "n", Kind: "k", URI: "u", By: "a", At: at}}}})
	jsontest.Keys(t, b, "id", "initiator", "participants", "created_at", "expires_at", "context")
	jsontest.Keys(t, jsontest.Member(t, b, "context"), "task", "decisions", "artifacts")
}
