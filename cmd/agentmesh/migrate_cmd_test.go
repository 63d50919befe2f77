package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/internal/natstest"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// oldMesh stores what an older agentmesh left: stream MESH on the wide
// subjects and worker's direct consumers, each reading its broadcasts and
// topic "findings" too.
func oldMesh(t *testing.T, ctx context.Context, js jetstream.JetStream, scheme subjects.Scheme) {
	t.Helper()
	sc := agentkit.StreamConfig(scheme, 1)
	sc.Subjects, sc.MaxConsumers = scheme.WideStreamSubjects(), 0
	if _, err := js.CreateStream(ctx, sc); err != nil {
		t.Fatal(err)
	}
	for _, p := range wire.Priorities {
		cfg, err := agentkit.ConsumerConfig(scheme, "worker", p, agentkit.DefaultPolicies()[p])
		if err != nil {
			t.Fatal(err)
		}
		broadcast, _ := scheme.BroadcastFilter(string(p))
		topic, _ := scheme.TopicFilter("findings", string(p))
		cfg.FilterSubjects, cfg.FilterSubject = []string{cfg.FilterSubject, broadcast, topic}, ""
		if _, err := js.CreateConsumer(ctx, scheme.Stream(), cfg); err != nil {
			t.Fatal(err)
		}
	}
}

// consumerConfigs returns the config of every consumer of stream by name.
func consumerConfigs(t *testing.T, ctx context.Context, js jetstream.JetStream, stream string) map[string]jetstream.ConsumerConfig {
	t.Helper()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]jetstream.ConsumerConfig{}
	l := s.ListConsumers(ctx)
	for ci := range l.Info() {
		out[ci.Name] = ci.Config
	}
	if err := l.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestMigrate_OldMeshToFanout: migrate narrows an older mesh's stream and
// consumers, creates the fan-out consumers where the old ones left off,
// and an agent started afterwards handles what was stored before, once.
func TestMigrate_OldMeshToFanout(t *testing.T) {
	srv := natstest.RunServer(t)
	t.Setenv("NATS_URL", srv.ClientURL())
	t.Setenv("NATS_CREDS", "")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	nc := natstest.Connect(t, srv)
	js, _ := jetstream.New(nc)
	scheme := subjects.Default
	oldMesh(t, ctx, js, scheme)
	before := consumerConfigs(t, ctx, js, scheme.Stream())

	orch, err := agentkit.New(natstest.Connect(t, srv), "orch", agentkit.WithRegistration(false))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(orch.Stop)
	var ids []string
	for _, send := range []func() (*wire.Envelope, error){
		func() (*wire.Envelope, error) { return orch.Send(ctx, "worker", "work", nil) },
		func() (*wire.Envelope, error) {
			return orch.Publish(ctx, "findings", "work", nil, agentkit.WithPriority(wire.PriorityHigh))
		},
		func() (*wire.Envelope, error) {
			return orch.Broadcast(ctx, "work", nil, agentkit.WithPriority(wire.PriorityLow))
		},
	} {
		e, err := send()
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, e.MessageID)
	}
	malformed := "mesh.agent.worker.urgent.orch" // no such priority
	if _, err := js.Publish(ctx, malformed, []byte("{}")); err != nil {
		t.Fatalf("the wide stream refuses %s: %v", malformed, err)
	}

	// --dry-run says what it would do and changes nothing.
	code, out, errOut := cli(t, "migrate", "--dry-run")
	if code != exitOK {
		t.Fatalf("migrate --dry-run: exit %d\n%s%s", code, out, errOut)
	}
	for _, want := range []string{"would set the subjects of stream MESH", "would create consumer worker_fanout-urgent",
		"would create consumer worker_fanout-bulk", "would narrow consumer worker_normal to mesh.agent.worker.normal.*", "would set the consumer limit of stream MESH to 100000",
		"dry run: 9 changes, none made"} {
		if !strings.Contains(out, want) {
			t.Errorf("migrate --dry-run does not say %q:\n%s", want, out)
		}
	}
	if got := consumerConfigs(t, ctx, js, scheme.Stream()); fmt.Sprint(got) != fmt.Sprint(before) {
		t.Errorf("migrate --dry-run changed the consumers:\n%v\nwant\n%v", got, before)
	}
	if info, err := js.Stream(ctx, scheme.Stream()); err != nil || !slices.Equal(info.CachedInfo().Config.Subjects, scheme.WideStreamSubjects()) {
		t.Fatalf("migrate --dry-run changed the stream: %v", err)
	}

	code, out, errOut = cli(t, "migrate")
	if code != exitOK {
		t.Fatalf("migrate: exit %d\n%s%s", code, out, errOut)
	}
	t.Logf("migrate:\n%s", out)
	for _, want := range []string{"set the subjects of stream MESH: removed mesh.agent.>, mesh.topic.>, mesh.broadcast.>",
		"create consumer worker_fanout-urgent: broadcasts and topics findings at critical, high, from stream sequence 1",
		"create consumer worker_fanout-bulk", "narrow consumer worker_batch", "migrated: 9 changes"} {
		if !strings.Contains(out, want) {
			t.Errorf("migrate does not say %q:\n%s", want, out)
		}
	}
	stream, err := js.Stream(ctx, scheme.Stream())
	if err != nil {
		t.Fatal(err)
	}
	if got := stream.CachedInfo().Config.Subjects; !slices.Equal(got, scheme.StreamSubjects()) {
		t.Errorf("stream subjects %q, want %q", got, scheme.StreamSubjects())
	}
	if got := stream.CachedInfo().Config.MaxConsumers; got != agentkit.MaxStreamConsumers {
		t.Errorf("stream consumer limit %d, want %d", got, agentkit.MaxStreamConsumers)
	}
	_, err = js.Publish(ctx, malformed, []byte("{}"))
	if !errors.Is(err, jetstream.ErrNoStreamResponse) && !errors.Is(err, nats.ErrNoResponders) {
		t.Errorf("publish to %s after migrate: %v; want no stream to answer", malformed, err)
	}
	after := consumerConfigs(t, ctx, js, scheme.Stream())
	for _, p := range wire.Priorities {
		name, _ := scheme.Consumer("worker", string(p))
		direct, _ := scheme.DirectFilter("worker", string(p))
		got, old := after[name], before[name]
		if got.FilterSubject != direct || len(got.FilterSubjects) != 0 {
			t.Errorf("%s filters %q %q, want %s alone", name, got.FilterSubject, got.FilterSubjects, direct)
		}
		if got.AckWait != old.AckWait || !slices.Equal(got.BackOff, old.BackOff) || got.MaxDeliver != old.MaxDeliver ||
			got.MaxAckPending != old.MaxAckPending || got.DeliverPolicy != old.DeliverPolicy || got.SampleFrequency != old.SampleFrequency {
			t.Errorf("%s settings changed: %+v, was %+v", name, got, old)
		}
	}
	for _, class := range subjects.FanoutClasses {
		name, _ := scheme.FanoutConsumer("worker", class)
		want, _ := scheme.FanoutFilters(class, []string{"findings"})
		got, ok := after[name]
		if !ok || !slices.Equal(got.FilterSubjects, want) || got.DeliverPolicy != jetstream.DeliverByStartSequencePolicy || got.OptStartSeq != 1 {
			t.Errorf("%s: %v %+v; want filters %q from stream sequence 1", name, ok, got, want)
		}
	}

	// Again: nothing to do, with --dry-run too.
	for _, args := range [][]string{{"migrate"}, {"migrate", "--dry-run"}} {
		code, out, errOut := cli(t, args...)
		if code != exitOK || !strings.Contains(out, "nothing to do") || strings.Contains(out, "would") {
			t.Errorf("%v after migrate: exit %d, want nothing to do:\n%s%s", args, code, out, errOut)
		}
	}
	if got := consumerConfigs(t, ctx, js, scheme.Stream()); fmt.Sprint(got) != fmt.Sprint(after) {
		t.Errorf("migrate again changed the consumers:\n%v\nwant\n%v", got, after)
	}

	// An agent started now, with provisioning rights as by default, handles
	// the three messages stored before, once each: its Start updates the
	// consumers migrate left without moving their start.
	var mu sync.Mutex
	handled := map[string]int{}
	worker, err := agentkit.New(natstest.Connect(t, srv), "worker", agentkit.WithTopics("findings"),
		agentkit.WithRegistration(false))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(worker.Stop)
	if err := worker.HandleFunc("work", func(_ context.Context, m *agentkit.Message) error {
		mu.Lock()
		handled[m.MessageID]++
		mu.Unlock()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := worker.Start(ctx); err != nil {
		t.Fatal(err)
	}
	// Every consumer of worker has delivered and acked all it has: nothing
	// more can come.
	natstest.WaitFor(t, 30*time.Second, func() error {
		for name := range after {
			c, err := js.Consumer(ctx, scheme.Stream(), name)
			if err != nil {
				return err
			}
			info, err := c.Info(ctx)
			if err != nil {
				return err
			}
			if info.NumPending+uint64(info.NumAckPending) > 0 {
				return fmt.Errorf("%s: %d pending, %d awaiting an ack", name, info.NumPending, info.NumAckPending)
			}
		}
		return nil
	})
	mu.Lock()
	defer mu.Unlock()
	for _, id := range ids {
		if handled[id] != 1 {
			t.Errorf("message %s handled %d times, want once (handled: %v)", id, handled[id], handled)
		}
	}
	if len(handled) != len(ids) {
		t.Errorf("handled %v, want %v once each", handled, ids)
	}
}

// TestMigrate_StartsWhereTheOldConsumersLeftOff: a fan-out consumer
// starts after the lowest ack floor of the old consumers of its
// priorities; old consumers with nothing pending start it after the
// stream's last message.
func TestMigrate_StartsWhereTheOldConsumersLeftOff(t *testing.T) {
	srv := natstest.RunServer(t)
	t.Setenv("NATS_URL", srv.ClientURL())
	t.Setenv("NATS_CREDS", "")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	js, _ := jetstream.New(natstest.Connect(t, srv))
	scheme := subjects.Default
	oldMesh(t, ctx, js, scheme)
	for range 3 {
		if _, err := js.Publish(ctx, "mesh.broadcast.normal.orch", []byte("{}")); err != nil {
			t.Fatal(err)
		}
	}
	// worker handled the first broadcast (seq 1) and holds the second
	// unacked (seq 2); the third is not delivered yet.
	cons, err := js.Consumer(ctx, scheme.Stream(), "worker_normal")
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(2)
	if err != nil {
		t.Fatal(err)
	}
	var msgs []jetstream.Msg
	for msg := range batch.Messages() {
		msgs = append(msgs, msg)
	}
	if len(msgs) != 2 {
		t.Fatalf("fetched %d, want 2", len(msgs))
	}
	if err := msgs[0].DoubleAck(ctx); err != nil {
		t.Fatal(err)
	}

	code, out, errOut := cli(t, "migrate")
	if code != exitOK {
		t.Fatalf("migrate: exit %d\n%s%s", code, out, errOut)
	}
	for class, want := range map[string]uint64{"bulk": 2, "urgent": 4} {
		name, _ := scheme.FanoutConsumer("worker", class)
		c, err := js.Consumer(ctx, scheme.Stream(), name)
		if err != nil {
			t.Fatal(err)
		}
		if got := c.CachedInfo().Config.OptStartSeq; got != want {
			t.Errorf("%s starts at %d, want %d:\n%s", name, got, want, out)
		}
	}
}

// TestMigrate_NoStream: a server without the stream has nothing to migrate.
func TestMigrate_NoStream(t *testing.T) {
	srv := natstest.RunServer(t)
	t.Setenv("NATS_URL", srv.ClientURL())
	t.Setenv("NATS_CREDS", "")
	code, out, errOut := cli(t, "migrate")
	if code != exitOK || !strings.Contains(out, "stream MESH does not exist: nothing to do") {
		t.Fatalf("migrate without the stream: exit %d\n%s%s", code, out, errOut)
	}
}

// TestMigrate_Credentials: migrate with an agent's credentials fails at
// once, the denial reported once with what it needs; an administrator
// finds nothing to do in a mesh provisioned by this version.
func TestMigrate_Credentials(t *testing.T) {
	url, dir := isolatedMesh(t)
	start := time.Now()
	code, out, errOut := cli(t, "migrate", "-s", url, "--creds", filepath.Join(dir, "orch_1.nk"))
	if code != exitFailure || strings.Count(errOut, "ermission denied") != 1 || !strings.Contains(errOut, "an administrator's") ||
		time.Since(start) > 10*time.Second {
		t.Fatalf("migrate as orch_1: exit %d after %v\n%s\n%s", code, time.Since(start), out, errOut)
	}
	code, out, errOut = cli(t, "migrate", "-s", url, "--creds", filepath.Join(dir, "admin.nk"))
	if code != exitOK || !strings.Contains(out, "nothing to do") {
		t.Fatalf("migrate as admin: exit %d\n%s\n%s", code, out, errOut)
	}
}

// TestMigrate_Help says when to run it and what delivery it gives.
func TestMigrate_Help(t *testing.T) {
	t.Setenv("NATS_URL", "")
	code, out, errOut := cli(t, "migrate", "--help")
	for _, want := range []string{"Usage:", "after upgrading", "before or while the agents restart", "at least once", "--dry-run", "2  usage error"} {
		if code != exitOK || !strings.Contains(out, want) {
			t.Errorf("migrate --help: exit %d, no %q:\n%s%s", code, want, out, errOut)
		}
	}
	if code, _, errOut := cli(t, "migrate", "extra"); code != exitUsage {
		t.Errorf("migrate extra: exit %d, want 2: %s", code, errOut)
	}
}
