package agentkit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/internal/natstest"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// TestPublishOutcome classifies the failures nats.go and the server give
// a publish attempt: only those that prove nothing was stored may become
// ErrPublish.
func TestPublishOutcome(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want pubOutcome
	}{
		{"ack timeout", jetstream.ErrAsyncPublishTimeout, pubUnknown},
		{"ctx cancelled waiting for the ack", context.Canceled, pubUnknown},
		{"ctx deadline waiting for the ack", context.DeadlineExceeded, pubUnknown},
		{"reconnect dropped the pending acks", nats.ErrDisconnected, pubUnknown},
		{"publisher cleaned up", jetstream.ErrJetStreamPublisherClosed, pubUnknown},
		{"unreadable ack", jetstream.ErrInvalidJSAck, pubUnknown},
		{"duplicate id in process", &jetstream.APIError{Code: 409, ErrorCode: jsDuplicateInProcess}, pubUnknown},
		{"taken into a fast batch", &attemptError{err: context.Canceled, outcome: pubUnknown}, pubUnknown},
		{"no stream", jetstream.ErrNoStreamResponse, pubNone},
		{"no responders", nats.ErrNoResponders, pubNone},
		{"no leader", &jetstream.APIError{Code: 503, ErrorCode: 10008}, pubNone},
		{"permission denied", fmt.Errorf("%w: %w", ErrPermissionDenied, nats.ErrPermissionViolation), pubNone},
		{"stream full", &jetstream.APIError{Code: 503, ErrorCode: jsStreamStoreFailed, Description: "maximum messages exceeded"}, pubRefused},
		{"larger than max_msg_size", fmt.Errorf("wrapped: %w", &jetstream.APIError{Code: 400, ErrorCode: jsMessageExceedsMaximum}), pubRefused},
		{"ctx ended before sending", unsent(context.Canceled), pubUnsent},
		{"connection closed", unsent(nats.ErrConnectionClosed), pubUnsent},
		{"too many pending", unsent(jetstream.ErrTooManyStalledMsgs), pubUnsent},
	} {
		if got := publishOutcome(tc.err); got != tc.want {
			t.Errorf("%s: publishOutcome(%v) = %d, want %d", tc.name, tc.err, got, tc.want)
		}
	}
}

// TestPublishOutcome_RealAttempts makes single attempts against a real
// server in each condition and classifies what nats.go returned.
func TestPublishOutcome_RealAttempts(t *testing.T) {
	t.Parallel()
	attempt := func(t *testing.T, a *Agent, ctx context.Context) error {
		t.Helper()
		e, err := a.NewRequest(context.Background(), "receiver", "work", nil)
		if err != nil {
			t.Fatal(err)
		}
		subject, err := a.send.subjectFor(e)
		if err != nil {
			t.Fatal(err)
		}
		msg, err := a.send.encode(context.Background(), subject, e)
		if err != nil {
			t.Fatal(err)
		}
		return a.send.publishOnce(ctx, msg)
	}
	edit := func(t *testing.T, a *Agent, stream jetstream.Stream, change func(*jetstream.StreamConfig)) {
		t.Helper()
		cfg := stream.CachedInfo().Config
		change(&cfg)
		js, _ := jetstream.New(a.nc)
		if _, err := js.UpdateStream(context.Background(), cfg); err != nil {
			t.Fatal(err)
		}
	}
	t.Run("no stream", func(t *testing.T) {
		t.Parallel()
		a, stream := streamAgent(t, false, WithPublishTimeout(2*time.Second))
		js, _ := jetstream.New(a.nc)
		if err := js.DeleteStream(context.Background(), stream.CachedInfo().Config.Name); err != nil {
			t.Fatal(err)
		}
		if err := attempt(t, a, context.Background()); publishOutcome(err) != pubNone {
			t.Fatalf("%v: outcome %d, want none", err, publishOutcome(err))
		}
	})
	t.Run("stream full", func(t *testing.T) {
		t.Parallel()
		a, stream := streamAgent(t, false, WithPublishTimeout(2*time.Second))
		edit(t, a, stream, func(c *jetstream.StreamConfig) { c.MaxMsgs, c.Discard = 1, jetstream.DiscardNew })
		if err := attempt(t, a, context.Background()); err != nil {
			t.Fatal(err)
		}
		if err := attempt(t, a, context.Background()); publishOutcome(err) != pubRefused {
			t.Fatalf("%v: outcome %d, want refused", err, publishOutcome(err))
		}
	})
	t.Run("no ack", func(t *testing.T) {
		t.Parallel()
		a, stream := streamAgent(t, false, WithPublishTimeout(400*time.Millisecond))
		edit(t, a, stream, func(c *jetstream.StreamConfig) { c.NoAck = true })
		if err := attempt(t, a, context.Background()); publishOutcome(err) != pubUnknown {
			t.Fatalf("%v: outcome %d, want unknown", err, publishOutcome(err))
		}
	})
	t.Run("ended ctx", func(t *testing.T) {
		t.Parallel()
		a, stream := streamAgent(t, false)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := attempt(t, a, ctx); publishOutcome(err) != pubUnsent || !errors.Is(err, context.Canceled) {
			t.Fatalf("%v: outcome %d, want unsent", err, publishOutcome(err))
		}
		// A later publish on the same connection is acked after anything
		// the ended attempt had sent would have been stored.
		if err := attempt(t, a, context.Background()); err != nil {
			t.Fatal(err)
		}
		if info, err := stream.Info(context.Background()); err != nil || info.State.Msgs != 1 {
			t.Fatalf("stream info %v, %v: want 1 message", info, err)
		}
	})
}

// TestAttemptsFailure checks the error a publish ends with after its
// attempts: the ctx's alone if nothing went out, ErrPublishUnconfirmed as
// long as an attempt may have stored the message (a later one that
// reached no stream proves nothing), ErrPublish otherwise.
func TestAttemptsFailure(t *testing.T) {
	timeout, noStream := jetstream.ErrAsyncPublishTimeout, jetstream.ErrNoStreamResponse
	full := &jetstream.APIError{Code: 503, ErrorCode: jsStreamStoreFailed}
	for _, tc := range []struct {
		name     string
		tried    []error
		err      error
		want     error
		notWant  []error
		wantText string
	}{
		{"ended before sending", []error{unsent(context.Canceled)}, unsent(context.Canceled),
			context.Canceled, []error{ErrPublish, ErrPublishUnconfirmed}, "not sent"},
		{"no stream until the deadline", []error{noStream, noStream}, context.DeadlineExceeded,
			ErrPublish, []error{ErrPublishUnconfirmed}, "attempts failed with"},
		{"unanswered", []error{timeout, timeout}, context.DeadlineExceeded,
			ErrPublishUnconfirmed, []error{ErrPublish}, ""},
		{"unanswered, then no stream", []error{timeout, noStream}, context.DeadlineExceeded,
			ErrPublishUnconfirmed, []error{ErrPublish}, ""},
		{"unanswered, then not sent", []error{timeout, unsent(context.DeadlineExceeded)}, context.DeadlineExceeded,
			ErrPublishUnconfirmed, []error{ErrPublish}, ""},
		{"unanswered, then refused after the duplicate check", []error{timeout, full}, context.DeadlineExceeded,
			ErrPublish, []error{ErrPublishUnconfirmed}, ""},
	} {
		var a attempts
		for _, err := range tc.tried {
			a.add(err)
		}
		err := a.failure("request m1 to mesh.agent.b.normal.a", tc.err, tc.tried[len(tc.tried)-1])
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
		for _, not := range tc.notWant {
			if errors.Is(err, not) {
				t.Errorf("%s: %v matches %v", tc.name, err, not)
			}
		}
		if !errors.Is(err, tc.err) {
			t.Errorf("%s: %v does not wrap %v", tc.name, err, tc.err)
		}
		if tc.wantText != "" && !strings.Contains(err.Error(), tc.wantText) {
			t.Errorf("%s: %q does not say %q", tc.name, err, tc.wantText)
		}
	}
}

// TestFastUnconfirmed checks which fast batch endings leave the messages
// the batch sent but did not confirm as maybe stored, on the errors
// fastBatchResult makes of the server's replies.
func TestFastUnconfirmed(t *testing.T) {
	result := func(v any, hdr nats.Header) error {
		data, _ := json.Marshal(v)
		_, err := fastBatchResult(&nats.Msg{Data: data, Header: hdr}, "b1")
		return err
	}
	for _, tc := range []struct {
		name string
		err  error
		want pubOutcome
	}{
		{"ack counting fewer", nil, pubNone},
		{"no responders", result(nil, nats.Header{"Status": {"503"}}), pubNone},
		{"fast batches disabled", result(fastBatchReply{Error: &jetstream.APIError{Code: 400, ErrorCode: jsBatchPublishDisabled}}, nil), pubNone},
		{"a plain ack: the first stored alone", result(fastBatchReply{Batch: "b2", Count: 1}, nil), pubUnknown},
		{"one message's error", result(fastBatchReply{Error: &jetstream.APIError{Code: 503, ErrorCode: jsStreamStoreFailed}}, nil), pubUnknown},
		{"other status", result(nil, nats.Header{"Status": {"408"}}), pubUnknown},
		{"no ack in time", fmt.Errorf("agentkit: fast batch: no ack within 1s: %w", context.DeadlineExceeded), pubUnknown},
		{"ctx ended", context.Canceled, pubUnknown},
		{"connection closed mid-batch", nats.ErrConnectionClosed, pubUnknown},
	} {
		if got := fastUnconfirmed(tc.err); got != tc.want {
			t.Errorf("%s: fastUnconfirmed(%v) = %d, want %d", tc.name, tc.err, got, tc.want)
		}
	}
}

// deafAgent returns a sender on a server where its connection may not
// subscribe to inboxes, so no ack reaches it though the stream stores
// its messages, and that stream.
func deafAgent(t *testing.T, opts ...Option) (*Agent, jetstream.Stream) {
	t.Helper()
	s := natstest.RunServer(t, func(o *server.Options) {
		o.Users = []*server.User{
			{Username: "admin", Password: "pw"},
			{Username: "deaf", Password: "pw", Permissions: &server.Permissions{
				Subscribe: &server.SubjectPermission{Deny: []string{"_INBOX.>"}},
			}},
		}
	})
	js, _ := jetstream.New(natstest.Connect(t, s, nats.UserInfo("admin", "pw")))
	stream, err := js.CreateStream(context.Background(), StreamConfig(subjects.Default, 1))
	if err != nil {
		t.Fatal(err)
	}
	nc := natstest.Connect(t, s, nats.UserInfo("deaf", "pw"), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	a, err := New(nc, "sender", append([]Option{WithRegistration(false)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Stop)
	return a, stream
}

// A fast batch whose ack cannot come back leaves every message it sent
// maybe stored, for the one-by-one attempts after it to carry.
func TestPublishFast_UnansweredMarksMaybeStored(t *testing.T) {
	t.Parallel()
	a, _ := deafAgent(t, WithPublishTimeout(400*time.Millisecond))
	msgs := make([]outMsg, 3)
	for i := range msgs {
		e, err := a.NewRequest(context.Background(), "receiver", "work", nil)
		if err != nil {
			t.Fatal(err)
		}
		subject, _ := a.send.subjectFor(e)
		if msgs[i], err = a.send.encode(context.Background(), subject, e); err != nil {
			t.Fatal(err)
		}
	}
	tried := make([]attempts, len(msgs))
	if n := a.send.publishFast(context.Background(), msgs, tried); n != 0 {
		t.Fatalf("%d confirmed, want none", n)
	}
	for i, tr := range tried {
		if !tr.sent || !tr.unsure {
			t.Errorf("message %d: %+v, want sent and unsure", i, tr)
		}
	}
}

// A Send that leaves the line before it is published returns its ctx's
// error, not a failed publish.
func TestSendLine_LeftTheLineIsNotAPublishFailure(t *testing.T) {
	a, stream := lineAgent(t, true)
	ctx, cancel := context.WithCancel(context.Background())
	wait := sendAll(a, ctx, 1)
	inLine(t, a, 1)
	cancel()
	if err := wait()[0]; !errors.Is(err, context.Canceled) || errors.Is(err, ErrPublish) || errors.Is(err, ErrPublishUnconfirmed) {
		t.Fatalf("Send cancelled in line: %v, want context.Canceled alone", err)
	}
	if info, err := stream.Info(context.Background()); err != nil || info.State.Msgs != 0 {
		t.Fatalf("stream info %v, %v: want no message", info, err)
	}
}

// A Send taken into a batch whose ctx ends before the batch's ack comes
// back may have been stored (here it is: the stream stores and never
// acks): ErrPublishUnconfirmed, not ErrPublish. So may the leader's own,
// whose retries after the batch get no ack either.
func TestSendLine_MemberInBatchIsUnconfirmed(t *testing.T) {
	t.Parallel()
	a, stream := lineAgent(t, false, WithPublishTimeout(2*time.Second))
	cfg := stream.CachedInfo().Config
	cfg.NoAck = true
	js, _ := jetstream.New(a.nc)
	if _, err := js.UpdateStream(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	leader := sendAll(a, context.Background(), 1)
	inLine(t, a, 1)
	short, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	member := sendAll(a, short, 1)
	inLine(t, a, 2)
	a.send.passSlot()
	if err := member()[0]; !errors.Is(err, ErrPublishUnconfirmed) || errors.Is(err, ErrPublish) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("member: %v, want ErrPublishUnconfirmed at its deadline", err)
	}
	if err := leader()[0]; !errors.Is(err, ErrPublishUnconfirmed) {
		t.Fatalf("leader: %v, want ErrPublishUnconfirmed", err)
	}
}

// A retry is started only if the stream's answer to it may come back
// before the deadline, judging by how long the last answer took; only an
// answered failure says how long answers take.
func TestAnswerTime(t *testing.T) {
	deadline := func(d time.Duration) context.Context {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		t.Cleanup(cancel)
		return ctx
	}
	var answer answerTime
	if answer.tooLate(deadline(time.Millisecond)) {
		t.Fatal("too late before any answer")
	}
	answer.observe(10*time.Millisecond, jetstream.ErrNoStreamResponse)
	answer.observe(time.Minute, jetstream.ErrAsyncPublishTimeout) // unanswered: says nothing
	answer.observe(time.Minute, unsent(context.Canceled))         // never sent: says nothing
	answer.observe(time.Minute, nil)
	if time.Duration(answer) != 10*time.Millisecond {
		t.Fatalf("answer time %v, want the answered failure's 10ms", time.Duration(answer))
	}
	if !answer.tooLate(deadline(20 * time.Millisecond)) {
		t.Error("a retry 20ms before the deadline, answers taking 10ms: want too late")
	}
	if answer.tooLate(deadline(time.Minute)) || answer.tooLate(context.Background()) {
		t.Error("too late with a minute left, or no deadline")
	}
}
