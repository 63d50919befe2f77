package agentkit_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/internal/natstest"
)

// A publish the server's permissions refuse is a clear, typed error after
// one attempt, not a retry loop ending in a timeout.
func TestPermissionDenied_SurfacesFast(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t, func(o *server.Options) {
		o.Users = []*server.User{{Username: "alice", Password: "pw", Permissions: &server.Permissions{
			Publish:   &server.SubjectPermission{Allow: []string{"mesh.*.*.*.alice", "$JS.API.>"}},
			Subscribe: &server.SubjectPermission{Allow: []string{"_INBOX.>"}},
		}}}
	})
	nc := natstest.Connect(t, s, nats.UserInfo("alice", "pw"), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	// Pretending to be bob: the subject carries the sender, so the server refuses.
	bob, err := agentkit.New(nc, "bob", agentkit.WithPublishTimeout(2*time.Second), agentkit.WithRegistration(false))
	if err != nil {
		t.Fatal(err)
	}
	defer bob.Stop()
	start := time.Now()
	_, err = bob.Send(context.Background(), "carol", "work", nil)
	if !errors.Is(err, agentkit.ErrPermissionDenied) || !errors.Is(err, nats.ErrPermissionViolation) || agentkit.IsRetryable(err) {
		t.Fatalf("err = %v, want ErrPermissionDenied", err)
	}
	// One attempt (a quarter of the 2s publish timeout), no retries.
	if waited := time.Since(start); waited > time.Second {
		t.Fatalf("took %v", waited)
	}
	if n := bob.Stats().PublishRetries; n != 0 {
		t.Fatalf("%d retries of a denied publish", n)
	}
}
