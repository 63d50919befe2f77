package agentkit_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/internal/natstest"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// meshStream returns the MESH stream through a connection of its own, to
// read its message count at the broker.
func (m *mesh) meshStream() jetstream.Stream {
	m.t.Helper()
	js, err := jetstream.New(m.conn())
	if err != nil {
		m.t.Fatal(err)
	}
	s, err := js.Stream(ctx(m.t), subjects.Default.Stream())
	if err != nil {
		m.t.Fatal(err)
	}
	return s
}

// msgCount returns how many messages s holds now.
func msgCount(t *testing.T, s jetstream.Stream) uint64 {
	t.Helper()
	info, err := s.Info(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

// sendPaths sends one message to "recv" with ctx through each way an
// agent sends, and returns each one's error by name.
func sendPaths(t *testing.T, a *agentkit.Agent, ctx context.Context) map[string]error {
	t.Helper()
	return sendPathsWith(t, a, ctx, "work")
}

// sendPathsWith is sendPaths with the caller's action and options.
func sendPathsWith(t *testing.T, a *agentkit.Agent, ctx context.Context, action string, opts ...agentkit.SendOption) map[string]error {
	t.Helper()
	env := func() *wire.Envelope {
		e, err := a.NewRequest(context.Background(), "recv", action, nil, opts...)
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	errs := map[string]error{}
	_, errs["Send"] = a.Send(ctx, "recv", action, nil, opts...)
	_, errs["Publish"] = a.Publish(ctx, "news", action, nil, opts...)
	_, errs["Broadcast"] = a.Broadcast(ctx, action, nil, opts...)
	_, errs["Request"] = a.Request(ctx, "recv", action, nil, opts...)
	_, errs["SendAndWait"] = a.SendAndWait(ctx, "recv", action, nil, opts...)
	errs["SendEnvelope"] = a.SendEnvelope(ctx, env())
	errs["SendBatch of one"] = a.SendBatch(ctx, []*wire.Envelope{env()})
	errs["SendBatch"] = a.SendBatch(ctx, []*wire.Envelope{env(), env(), env()})
	return errs
}

// A ctx that has ended before a send publishes nothing, whichever way the
// agent sends, and the error is the ctx's: not ErrPublish ("not stored",
// which invites a resend under a new id) nor ErrPublishUnconfirmed.
func TestSend_EndedContextPublishesNothing(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	sender := m.started("sender", nil, agentkit.WithRegistration(false))
	stream := m.meshStream()
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	expired, cancel2 := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel2()
	for _, tc := range []struct {
		ctx  context.Context
		want error
	}{{cancelled, context.Canceled}, {expired, context.DeadlineExceeded}} {
		for path, err := range sendPaths(t, sender, tc.ctx) {
			if !errors.Is(err, tc.want) || errors.Is(err, agentkit.ErrPublish) || errors.Is(err, agentkit.ErrPublishUnconfirmed) {
				t.Errorf("%s with an ended ctx: %v, want %v alone", path, err, tc.want)
			}
		}
	}
	// The stream stores one connection's messages in the order they come:
	// once a later message on the sender's connection is acked, anything
	// the ended sends had published would be stored too.
	if _, err := sender.Send(ctx(t), "recv", "marker", nil); err != nil {
		t.Fatal(err)
	}
	if n := msgCount(t, stream); n != 1 {
		t.Fatalf("stream holds %d messages, want only the marker: a send with an ended ctx published", n)
	}
}

// noAckMesh returns a mesh whose stream stores messages but never acks
// them: every publish reaches the stream and no answer comes back, the
// ambiguous case, deterministically.
func noAckMesh(t *testing.T) (*mesh, jetstream.Stream) {
	t.Helper()
	m := newMesh(t)
	m.createStream(func(c *jetstream.StreamConfig) { c.NoAck = true })
	return m, m.meshStream()
}

// A publish that reached the stream but got no answer before its time
// ran out may have been stored: ErrPublishUnconfirmed, not ErrPublish.
// The stream did store it, and resending the same envelope once acks are
// back stores nothing new.
func TestSend_NoAckIsUnconfirmed(t *testing.T) {
	t.Parallel()
	m, stream := noAckMesh(t)
	// Attempts of 100ms, retried for 400ms.
	sender := m.agent("sender", agentkit.WithRegistration(false), agentkit.WithPublishTimeout(400*time.Millisecond))
	env, err := sender.Send(context.Background(), "recv", "work", nil)
	if !errors.Is(err, agentkit.ErrPublishUnconfirmed) || errors.Is(err, agentkit.ErrPublish) || !agentkit.IsRetryable(err) {
		t.Fatalf("Send: %v, want ErrPublishUnconfirmed (and retryable), not ErrPublish", err)
	}
	if env == nil || !strings.Contains(err.Error(), env.MessageID) {
		t.Fatalf("Send returned envelope %v and error %q: the caller needs the message id to resend", env, err)
	}
	eventually(t, 10*time.Second, "the unconfirmed message stored", func() bool { return msgCount(t, stream) == 1 })

	cfg := stream.CachedInfo().Config
	cfg.NoAck = false
	js, err := jetstream.New(m.conn())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.UpdateStream(ctx(t), cfg); err != nil {
		t.Fatal(err)
	}
	if err := sender.SendEnvelope(ctx(t), env); err != nil {
		t.Fatalf("resending the unconfirmed envelope: %v", err)
	}
	if n := msgCount(t, stream); n != 1 {
		t.Fatalf("stream holds %d messages after the resend, want 1", n)
	}
	if d := sender.Stats().PublishDuplicates; d != 1 {
		t.Fatalf("PublishDuplicates = %d, want the resend's 1", d)
	}
}

// A Request whose publish is never acked fails the same way, before it
// waits for any reply.
func TestRequest_NoAckIsUnconfirmed(t *testing.T) {
	t.Parallel()
	m, _ := noAckMesh(t)
	sender := m.started("sender", nil, agentkit.WithRegistration(false), agentkit.WithPublishTimeout(400*time.Millisecond))
	reqCtx, cancel := context.WithTimeout(ctx(t), 500*time.Millisecond)
	defer cancel()
	_, err := sender.Request(reqCtx, "recv", "work", nil)
	if !errors.Is(err, agentkit.ErrPublishUnconfirmed) || errors.Is(err, agentkit.ErrPublish) {
		t.Fatalf("Request: %v, want ErrPublishUnconfirmed, not ErrPublish", err)
	}
}

// SendBatch reports each message stored without an answer as
// unconfirmed, whether a fast batch sent it (several messages) or a
// publish of its own (one). A stream acks fast batches even with NoAck, so
// here the answers cannot come back instead: the sender may not subscribe
// to its inboxes, where the acks go.
func TestSendBatch_UnansweredIsUnconfirmed(t *testing.T) {
	t.Parallel()
	for _, n := range []int{5, 1} {
		t.Run(fmt.Sprintf("%d messages", n), func(t *testing.T) {
			t.Parallel()
			s := natstest.RunServer(t, func(o *server.Options) {
				o.Users = []*server.User{
					{Username: "admin", Password: "pw"},
					{Username: "deaf", Password: "pw", Permissions: &server.Permissions{
						Subscribe: &server.SubjectPermission{Deny: []string{"_INBOX.>"}},
					}},
				}
			})
			js, err := jetstream.New(natstest.Connect(t, s, nats.UserInfo("admin", "pw")))
			if err != nil {
				t.Fatal(err)
			}
			stream, err := js.CreateStream(ctx(t), agentkit.StreamConfig(subjects.Default, 1))
			if err != nil {
				t.Fatal(err)
			}
			nc := natstest.Connect(t, s, nats.UserInfo("deaf", "pw"), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
			sender, err := agentkit.New(nc, "sender", agentkit.WithRegistration(false), agentkit.WithPublishTimeout(400*time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(sender.Stop)
			envs := requests(t, sender, n, nil)
			err = sender.SendBatch(context.Background(), envs)
			var batchErr *agentkit.BatchError
			if !errors.As(err, &batchErr) || !errors.Is(err, agentkit.ErrPublishUnconfirmed) || !strings.Contains(err.Error(), "may have been") {
				t.Fatalf("SendBatch: %v, want a *BatchError of unconfirmed messages", err)
			}
			for i, err := range batchErr.Errs {
				if !errors.Is(err, agentkit.ErrPublishUnconfirmed) || errors.Is(err, agentkit.ErrPublish) {
					t.Errorf("item %d: %v, want ErrPublishUnconfirmed, not ErrPublish", i, err)
				}
			}
			eventually(t, 10*time.Second, "every message stored", func() bool { return msgCount(t, stream) == uint64(len(envs)) })
			if st := sender.Stats(); n > 1 && (st.FastBatched != 0 || st.FastBatchFallbacks != uint64(n)) {
				t.Errorf("FastBatched %d, FastBatchFallbacks %d; want a fast batch of %d, none of them confirmed", st.FastBatched, st.FastBatchFallbacks, n)
			}
		})
	}
}
