package auth_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/auth"
	"github.com/agentmesh-io/agentmesh/internal/natstest"
)

// TestPermissionDenied_AgentkitToday documents how a denied send surfaces
// through agentkit today (commit 16d201c): the server drops the publish and
// reports the violation only asynchronously, so the first publish attempt
// waits out its attempt timeout (a quarter of WithPublishTimeout, at most
// 2s); agentkit then finds the violation in nc.LastError() and fails with
// agentkit.ErrPermissionDenied without retrying. Before that commit the
// send retried until its deadline and failed with ErrPublish wrapping
// context.DeadlineExceeded.
//
// When agentkit wakes on the violation itself (see the auth report),
// the lower bound below fails: flip it to an upper bound like
// TestWatcher_Guard's.
func TestPermissionDenied_AgentkitToday(t *testing.T) {
	t.Parallel()
	m := newIsolatedMesh(t)
	ncA, w := conn(t, m.s, m.b, "A")
	const publishTimeout = 2 * time.Second // one attempt: 500ms
	impostor := isolatedAgent(t, ncA, "B", agentkit.WithPublishTimeout(publishTimeout))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	_, err := impostor.Send(ctx, "C", "spoof", nil)
	took := time.Since(start)
	if !errors.Is(err, agentkit.ErrPermissionDenied) || !errors.Is(err, nats.ErrPermissionViolation) || agentkit.IsRetryable(err) {
		t.Fatalf("err = %v, want a non-retryable agentkit.ErrPermissionDenied", err)
	}
	if !strings.Contains(err.Error(), `"mesh.agent.C.normal.B"`) {
		t.Fatalf("err = %v does not name the refused subject", err)
	}
	if attempt := publishTimeout / 4; took < attempt*9/10 {
		t.Fatalf("Send failed after %v, before one %v attempt timed out: agentkit now fails fast, flip this test", took, attempt)
	}
	if took > 5*time.Second {
		t.Fatalf("Send took %v: agentkit retried a denied publish", took)
	}
	if n := impostor.Stats().PublishRetries; n != 0 {
		t.Fatalf("%d retries of a denied publish", n)
	}
	// The connection knew why almost at once.
	if w.Count() == 0 {
		t.Fatal("no violation reported on the connection")
	}
	t.Logf("today: Send as another agent fails after %v: %v", took.Round(time.Millisecond), err)
}

// TestWatcher_Guard shows the auth-level helper: the same denied send
// fails at once with an error that names the refused subject.
func TestWatcher_Guard(t *testing.T) {
	t.Parallel()
	m := newIsolatedMesh(t)
	ncA, w := conn(t, m.s, m.b, "A")
	impostor := isolatedAgent(t, ncA, "B")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	err := w.Guard(ctx, func(ctx context.Context) error {
		_, err := impostor.Send(ctx, "C", "spoof", nil)
		return err
	})
	took := time.Since(start)
	if !errors.Is(err, auth.ErrPermissionDenied) || !errors.Is(err, agentkit.ErrPublish) {
		t.Fatalf("err = %v, want ErrPermissionDenied and ErrPublish", err)
	}
	var pe *auth.PermissionError
	if !errors.As(err, &pe) || pe.Op != "publish" || pe.Subject != "mesh.agent.C.normal.B" {
		t.Fatalf("PermissionError = %+v, want publish to mesh.agent.C.normal.B", pe)
	}
	if took > 2*time.Second {
		t.Fatalf("Guard took %v to fail", took)
	}
	t.Logf("with Guard: fails after %v: %v", took.Round(time.Millisecond), err)

	// An allowed operation passes through untouched.
	a := isolatedAgent(t, ncA, "A")
	if err := w.Guard(ctx, func(ctx context.Context) error {
		_, err := a.Send(ctx, "C", "hello", nil)
		return err
	}); err != nil {
		t.Fatalf("allowed send under Guard: %v", err)
	}
	// And an error that is not a violation is returned unchanged.
	sentinel := errors.New("boom")
	if err := w.Guard(ctx, func(context.Context) error { return sentinel }); err != sentinel {
		t.Fatalf("Guard returned %v, want the function's own error", err)
	}
}

func TestWatcher_passesErrorsOn(t *testing.T) {
	t.Parallel()
	b := generate(t, []auth.AgentSpec{{ID: "A"}}, auth.Options{})
	s := natstest.RunServer(t, withAuth(t, b))
	got := make(chan error, 4)
	w := auth.NewWatcher(func(_ *nats.Conn, _ *nats.Subscription, err error) { got <- err })
	opts, err := b.Agents()[0].Credentials.Options()
	if err != nil {
		t.Fatal(err)
	}
	nc := natstest.Connect(t, s, append(opts, w.Option())...)
	if err := nc.Publish("mesh.agent.x.normal.B", nil); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if !errors.Is(err, nats.ErrPermissionViolation) {
			t.Fatalf("next handler got %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the next error handler was not called")
	}
	if r := w.Recent(); len(r) != 1 || r[0].Subject != "mesh.agent.x.normal.B" {
		t.Fatalf("Recent = %v", r)
	}
}
