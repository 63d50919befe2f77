package auth_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/auth"
	"github.com/agentmesh-io/agentmesh/internal/natstest"
)

// denyWait bounds how long a test waits for a request the server refused
// (it is never answered) or for the asynchronous violation.
const denyWait = 300 * time.Millisecond

// isolatedMesh is a server with the authorization of agents A, B and C,
// provisioned by the admin.
type isolatedMesh struct {
	s *server.Server
	b *auth.Bundle
}

func newIsolatedMesh(t *testing.T) isolatedMesh {
	t.Helper()
	b := generate(t, []auth.AgentSpec{{ID: "A"}, {ID: "B", Topics: []string{"news"}}, {ID: "C"}}, auth.Options{})
	s := natstest.RunServer(t, withAuth(t, b))
	provision(t, s, b, auth.ProvisionOptions{})
	return isolatedMesh{s: s, b: b}
}

// expectViolation waits for w to report a violation on subject after count.
func expectViolation(t *testing.T, w *auth.Watcher, count uint64, op, subject string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	pe, err := w.Wait(ctx, count, func(pe *auth.PermissionError) bool { return pe.Subject == subject })
	if err != nil {
		t.Fatalf("no permissions violation for %s %q: %v (seen: %v)", op, subject, err, w.Recent())
	}
	if pe.Op != op || !errors.Is(pe, auth.ErrPermissionDenied) || !errors.Is(pe, nats.ErrPermissionViolation) {
		t.Fatalf("violation = %+v, want op %q matching ErrPermissionDenied and nats.ErrPermissionViolation", pe, op)
	}
}

func TestIsolation(t *testing.T) {
	t.Parallel()
	m := newIsolatedMesh(t)
	admin := adminJS(t, m.s, m.b)

	t.Run("A sends to B and B handles it", func(t *testing.T) {
		t.Parallel()
		ncA, _ := conn(t, m.s, m.b, "A")
		ncB, _ := conn(t, m.s, m.b, "B")
		got := make(chan string, 1)
		b := isolatedAgent(t, ncB, "B")
		if err := b.HandleFunc("greet", func(ctx context.Context, msg *agentkit.Message) error {
			got <- msg.Envelope.SenderID
			return msg.Reply(ctx, "greeted", map[string]string{"hello": "A"})
		}); err != nil {
			t.Fatal(err)
		}
		a := isolatedAgent(t, ncA, "A")
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, ag := range []*agentkit.Agent{a, b} {
			if err := ag.Start(ctx); err != nil {
				t.Fatalf("Start %s: %v", ag.ID(), err)
			}
		}
		resp, err := a.Request(ctx, "B", "greet", map[string]string{"from": "A"})
		if err != nil {
			t.Fatalf("Request A→B: %v", err)
		}
		if resp.SenderID != "B" || resp.Action != "greeted" {
			t.Fatalf("response = %s from %s, want greeted from B", resp.Action, resp.SenderID)
		}
		if s := <-got; s != "A" {
			t.Fatalf("B saw sender %q, want A", s)
		}
		// B reads its own consumer info (pending counts).
		if _, err := b.ConsumerInfo(ctx, wire.PriorityNormal); err != nil {
			t.Fatalf("B's own consumer info: %v", err)
		}
	})

	t.Run("A cannot pull B's messages", func(t *testing.T) {
		t.Parallel()
		ncA, w := conn(t, m.s, m.b, "A")
		subject := "$JS.API.CONSUMER.MSG.NEXT.MESH.B_critical"
		n := w.Count()
		_, err := ncA.Request(subject, []byte(`{"batch":1,"expires":100000000}`), denyWait)
		if !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, nats.ErrNoResponders) {
			t.Fatalf("pull on B's consumer: err = %v, want no answer", err)
		}
		expectViolation(t, w, n, "publish", subject)
	})

	t.Run("A cannot read B's consumer info", func(t *testing.T) {
		t.Parallel()
		ncA, w := conn(t, m.s, m.b, "A")
		js, err := jetstream.New(ncA)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), denyWait)
		defer cancel()
		n := w.Count()
		if _, err := js.Consumer(ctx, "MESH", "B_normal"); err == nil {
			t.Fatal("A read B's consumer info")
		}
		expectViolation(t, w, n, "publish", "$JS.API.CONSUMER.INFO.MESH.B_normal")
		// Binding an agent "B" on A's connection fails the same way.
		impostor := isolatedAgent(t, ncA, "B")
		ctx2, cancel2 := context.WithTimeout(context.Background(), denyWait)
		defer cancel2()
		if err := impostor.Start(ctx2); err == nil {
			t.Fatal("an agent B started on A's credentials")
		}
	})

	t.Run("A cannot subscribe to B's inbox", func(t *testing.T) {
		t.Parallel()
		ncA, w := conn(t, m.s, m.b, "A", nats.PermissionErrOnSubscribe(true))
		n := w.Count()
		sub, err := ncA.SubscribeSync("_INBOX_B.>")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := sub.NextMsg(5 * time.Second); !errors.Is(err, nats.ErrPermissionViolation) {
			t.Fatalf("NextMsg on B's inbox: err = %v, want a permissions violation", err)
		}
		expectViolation(t, w, n, "subscribe", "_INBOX_B.>")
		// Nor the default inbox, nor every message of the mesh.
		for _, subj := range []string{"_INBOX.>", "mesh.>", ">"} {
			n := w.Count()
			if _, err := ncA.SubscribeSync(subj); err != nil {
				t.Fatal(err)
			}
			expectViolation(t, w, n, "subscribe", subj)
		}
	})

	t.Run("A cannot publish as B", func(t *testing.T) {
		t.Parallel()
		ncA, w := conn(t, m.s, m.b, "A")
		before := pending(t, admin, "C_normal")
		for _, subj := range []string{
			"mesh.agent.C.normal.B", "mesh.topic.news.normal.B", "mesh.broadcast.normal.B", "mesh.hb.B",
			"mesh.alert.critical.B", "mesh.dlq.C.normal.B",
		} {
			n := w.Count()
			if err := ncA.Publish(subj, []byte("{}")); err != nil {
				t.Fatal(err)
			}
			expectViolation(t, w, n, "publish", subj)
		}
		// Through agentkit: an agent claiming to be B cannot send.
		impostor := isolatedAgent(t, ncA, "B")
		ctx, cancel := context.WithTimeout(context.Background(), denyWait)
		defer cancel()
		if _, err := impostor.Send(ctx, "C", "spoof", nil); !errors.Is(err, agentkit.ErrPublish) {
			t.Fatalf("Send as B on A's credentials: err = %v, want ErrPublish", err)
		}
		if after := pending(t, admin, "C_normal"); after != before {
			t.Fatalf("C_normal went from %d to %d messages: a spoofed message was stored", before, after)
		}
	})

	t.Run("A cannot ack B's messages", func(t *testing.T) {
		t.Parallel()
		ncA, w := conn(t, m.s, m.b, "A")
		subj := "$JS.ACK.MESH.B_normal.1.1.1.1.0"
		n := w.Count()
		if err := ncA.Publish(subj, []byte("+TERM")); err != nil {
			t.Fatal(err)
		}
		expectViolation(t, w, n, "publish", subj)
	})

	t.Run("A cannot create or delete streams and consumers", func(t *testing.T) {
		t.Parallel()
		ncA, w := conn(t, m.s, m.b, "A")
		js, err := jetstream.New(ncA)
		if err != nil {
			t.Fatal(err)
		}
		try := func(what string, f func(ctx context.Context) error) {
			t.Helper()
			ctx, cancel := context.WithTimeout(context.Background(), denyWait)
			defer cancel()
			n := w.Count()
			if err := f(ctx); err == nil {
				t.Errorf("%s: allowed", what)
				return
			}
			wctx, wcancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer wcancel()
			if _, err := w.Wait(wctx, n, func(pe *auth.PermissionError) bool { return strings.HasPrefix(pe.Subject, "$JS.API.") }); err != nil {
				t.Errorf("%s: refused without a permissions violation", what)
			}
		}
		try("create a consumer reading B's messages", func(ctx context.Context) error {
			_, err := js.CreateOrUpdateConsumer(ctx, "MESH", jetstream.ConsumerConfig{Durable: "A_spy", FilterSubject: "mesh.agent.B.>", AckPolicy: jetstream.AckNonePolicy})
			return err
		})
		try("create an ordered consumer on MESH", func(ctx context.Context) error {
			_, err := js.OrderedConsumer(ctx, "MESH", jetstream.OrderedConsumerConfig{FilterSubjects: []string{"mesh.agent.B.>"}})
			return err
		})
		try("delete B's consumer", func(ctx context.Context) error { return js.DeleteConsumer(ctx, "MESH", "B_normal") })
		try("delete its own consumer", func(ctx context.Context) error { return js.DeleteConsumer(ctx, "MESH", "A_normal") })
		try("create a stream", func(ctx context.Context) error {
			_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "SPY", Subjects: []string{"spy.>"}})
			return err
		})
		try("capture B's messages in a new stream", func(ctx context.Context) error {
			_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "SPY2", Sources: []*jetstream.StreamSource{{Name: "MESH", FilterSubject: "mesh.agent.B.>"}}})
			return err
		})
		try("delete the stream", func(ctx context.Context) error { return js.DeleteStream(ctx, "MESH") })
		// Raw API calls, concurrently: none is answered, each is reported.
		n := w.Count()
		var wg sync.WaitGroup
		apis := []string{
			"STREAM.PURGE.MESH", "STREAM.MSG.GET.MESH", "STREAM.MSG.DELETE.MESH", "DIRECT.GET.MESH", "STREAM.UPDATE.MESH",
			"CONSUMER.NAMES.MESH", "CONSUMER.LIST.MESH", "CONSUMER.DURABLE.CREATE.MESH.B_normal", "CONSUMER.CREATE.MESH.B_normal",
			"CONSUMER.CREATE.MESH.A_normal.mesh.agent.A.normal.*", "STREAM.NAMES", "INFO",
		}
		for _, api := range apis {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), denyWait)
				defer cancel()
				if _, err := ncA.RequestWithContext(ctx, "$JS.API."+api, []byte(`{"seq":1}`)); err == nil {
					t.Errorf("%s: answered", api)
				}
			})
		}
		wg.Wait()
		for _, api := range apis {
			expectViolation(t, w, n, "publish", "$JS.API."+api)
		}
		try("read the stream's info", func(ctx context.Context) error {
			_, err := js.Stream(ctx, "MESH")
			return err
		})
		// Nothing changed on the server.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		for _, name := range []string{"A_normal", "B_normal"} {
			if _, err := admin.Consumer(ctx, "MESH", name); err != nil {
				t.Errorf("consumer %s: %v", name, err)
			}
		}
		for _, name := range []string{"A_spy"} {
			if _, err := admin.Consumer(ctx, "MESH", name); !errors.Is(err, jetstream.ErrConsumerNotFound) {
				t.Errorf("consumer %s exists (err %v)", name, err)
			}
		}
		names := admin.StreamNames(ctx)
		var streams []string
		for n := range names.Name() {
			streams = append(streams, n)
		}
		if strings.Join(streams, ",") != "MESH" {
			t.Errorf("streams = %v, want only MESH", streams)
		}
	})

	t.Run("the admin is unrestricted", func(t *testing.T) {
		t.Parallel()
		var seen atomic.Int32
		nc, _ := conn(t, m.s, m.b, "admin")
		sub, err := nc.Subscribe(">", func(*nats.Msg) { seen.Add(1) })
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Unsubscribe()
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
		if err := nc.Publish("anything.at.all", nil); err != nil {
			t.Fatal(err)
		}
		natstest.Eventually(t, 5*time.Second, "the admin's own message", func() bool { return seen.Load() > 0 })
	})
}

// TestAckFormatV2 runs the positive control on a server with the v2 ack
// subject format ("$JS.ACK.<domain>.<account hash>.<stream>.<consumer>...",
// feature flag js_ack_fc_v2), which the agents' ack permissions also cover.
func TestAckFormatV2(t *testing.T) {
	t.Parallel()
	b := generate(t, []auth.AgentSpec{{ID: "A"}, {ID: "B"}}, auth.Options{Registration: true})
	s := natstest.RunServer(t, withAuth(t, b), func(o *server.Options) {
		o.FeatureFlags = map[string]bool{"js_ack_fc_v2": true}
	})
	provision(t, s, b, auth.ProvisionOptions{Registry: true})
	ncA, wA := conn(t, s, b, "A")
	ncB, wB := conn(t, s, b, "B")
	handled := make(chan struct{}, 1)
	bAgent := isolatedAgent(t, ncB, "B", agentkit.WithDoubleAck(true), agentkit.WithRegistration(true))
	if err := bAgent.HandleFunc("work", func(context.Context, *agentkit.Message) error {
		handled <- struct{}{}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := bAgent.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := isolatedAgent(t, ncA, "A").Send(ctx, "B", "work", nil); err != nil {
		t.Fatal(err)
	}
	<-handled
	admin := adminJS(t, s, b)
	natstest.Eventually(t, 5*time.Second, "B's ack to be accepted", func() bool { return pending(t, admin, "B_normal") == 0 })
	// The runtime counts the ack once the server has confirmed it, so the
	// count may lag the consumer's state by a moment.
	natstest.Eventually(t, 5*time.Second, "B to count its ack", func() bool {
		return bAgent.Stats().Outcomes[agentkit.OutcomeAck] == 1
	})
	if n := wA.Count() + wB.Count(); n != 0 {
		t.Fatalf("violations: %v %v", wA.Recent(), wB.Recent())
	}
}
