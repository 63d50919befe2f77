package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/internal/jsontest"
	"github.com/agentmesh-io/agentmesh/internal/natstest"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// replicasOf returns the configured replica count of stream.
func replicasOf(t *testing.T, ctx context.Context, js jetstream.JetStream, stream string) int {
	t.Helper()
	st, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	return st.CachedInfo().Config.Replicas
}

// streamsJSON runs streams --json and returns its streams by name.
func streamsJSON(t *testing.T) map[string]streamJSON {
	t.Helper()
	code, out, errOut := cli(t, "streams", "--json")
	if code != exitOK {
		t.Fatalf("streams --json: exit %d\n%s%s", code, out, errOut)
	}
	var list []streamJSON
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatalf("streams --json: %v\n%s", err, out)
	}
	byName := map[string]streamJSON{}
	for _, s := range list {
		byName[s.Name] = s
	}
	return byName
}

// TestStreams_ScaleUpOnCluster: on a three-node cluster, streams shows the
// R1 stream and registry an agent created, with their leaders; an agent
// asking for R3 refuses to start until streams --replicas 3 scales them
// up, which a cluster of three cannot do to R5 and never does down.
func TestStreams_ScaleUpOnCluster(t *testing.T) {
	c := natstest.RunCluster(t, 3)
	t.Setenv("NATS_URL", c.ClientURLs())
	t.Setenv("NATS_CREDS", "")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	js, err := jetstream.New(c.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	scheme := subjects.Default
	mesh, registry := scheme.Stream(), subjects.KVStream(scheme.RegistryBucket())

	first, err := agentkit.New(c.Connect(t), "first") // default replicas: creates the stream and registry R1
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(first.Stop)
	if err := first.Start(ctx); err != nil {
		t.Fatal(err)
	}

	code, out, errOut := cli(t, "streams")
	if code != exitOK {
		t.Fatalf("streams: exit %d\n%s%s", code, out, errOut)
	}
	t.Logf("streams:\n%s", out)
	lines := map[string]string{}
	for l := range strings.Lines(out) {
		if f := strings.Fields(l); len(f) > 0 {
			lines[f[0]] = l
		}
	}
	for _, name := range []string{mesh, registry} {
		l := lines[name]
		if !strings.Contains(l, " R1 ") || !strings.Contains(l, " S-") {
			t.Errorf("streams shows %s as %q, want R1 with its leader", name, l)
		}
	}
	for _, name := range []string{scheme.DLQStream(), subjects.ObjectStream(scheme.PayloadsBucket())} {
		if !strings.Contains(lines[name], "not created") {
			t.Errorf("streams shows %s as %q, want not created", name, lines[name])
		}
	}
	listed := streamsJSON(t)
	if s := listed[mesh]; !s.Created || s.Replicas != 1 || s.Leader == "" || len(s.Peers) != 0 || s.Consumers == 0 {
		t.Errorf("streams --json: %s %+v, want created, R1, a leader, no other replica, the agent's consumers", mesh, s)
	}
	if s, ok := listed[scheme.EventsStream()]; !ok || s.Created {
		t.Errorf("streams --json: %s %v %+v, want listed as not created", scheme.EventsStream(), ok, s)
	}
	jsontest.Keys(t, jsontest.Marshal(t, listed[scheme.EventsStream()]), "name", "holds", "created", "messages", "bytes", "consumers")

	second, err := agentkit.New(c.Connect(t), "second", agentkit.WithReplicas(3))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(second.Stop)
	if err := second.Start(ctx); !errors.Is(err, agentkit.ErrTooFewReplicas) {
		t.Fatalf("Start with R3 on an R1 stream: %v, want ErrTooFewReplicas", err)
	}

	// A cluster of three cannot hold five replicas: the server says so for
	// each stream, and nothing changes.
	code, out, errOut = cli(t, "streams", "--replicas", "5")
	if code != exitFailure || !strings.Contains(out, mesh+": the server refused R5") || !strings.Contains(out, "R5 needs 5 servers") ||
		!strings.Contains(errOut, "2 of 2 scale-ups to R5 refused") {
		t.Errorf("streams --replicas 5 on three servers: exit %d, want 1 and the server's refusals\n%s%s", code, out, errOut)
	}
	t.Logf("streams --replicas 5:\n%s%s", out, errOut)

	code, out, errOut = cli(t, "streams", "--replicas", "3", "--dry-run")
	if code != exitOK || !strings.Contains(out, mesh+": would scale from R1 to R3") || !strings.Contains(out, registry+": would scale from R1 to R3") ||
		!strings.Contains(out, "dry run: 2 streams would be scaled to R3, none changed") {
		t.Errorf("streams --replicas 3 --dry-run: exit %d\n%s%s", code, out, errOut)
	}
	for _, name := range []string{mesh, registry} {
		if got := replicasOf(t, ctx, js, name); got != 1 {
			t.Fatalf("%s has %d replicas after a refused or dry run, want 1", name, got)
		}
	}

	code, out, errOut = cli(t, "streams", "--replicas", "3")
	if code != exitOK || !strings.Contains(out, mesh+": scaled from R1 to R3") || !strings.Contains(out, registry+": scaled from R1 to R3") ||
		!strings.Contains(out, "not created") {
		t.Fatalf("streams --replicas 3: exit %d\n%s%s", code, out, errOut)
	}
	t.Logf("streams --replicas 3:\n%s", out)
	for _, name := range []string{mesh, registry} {
		if got := replicasOf(t, ctx, js, name); got != 3 {
			t.Errorf("%s has %d replicas, want 3", name, got)
		}
		c.WaitStreamCurrent(t, js, name, time.Minute)
	}
	// The agent's consumers, which set no replica count, follow the stream.
	consumer, _ := scheme.Consumer("first", "normal")
	natstest.WaitFor(t, time.Minute, func() error {
		cons, err := js.Consumer(ctx, mesh, consumer)
		if err != nil {
			return err
		}
		info, err := cons.Info(ctx)
		if err != nil {
			return err
		}
		if info.Cluster == nil || len(info.Cluster.Replicas) != 2 {
			return fmt.Errorf("consumer %s: cluster %+v, want two other replicas", consumer, info.Cluster)
		}
		return nil
	})

	// Once copied, the listing shows each one led, with its two other
	// replicas current.
	natstest.WaitFor(t, time.Minute, func() error {
		listed := streamsJSON(t)
		for _, name := range []string{mesh, registry} {
			s := listed[name]
			current := 0
			for _, p := range s.Peers {
				if p.Current && !p.Offline {
					current++
				}
			}
			if s.Replicas != 3 || s.Leader == "" || current != 2 {
				return fmt.Errorf("streams --json: %s %+v, want R3, a leader and two current replicas", name, s)
			}
		}
		if _, out, _ := cli(t, "streams"); !strings.Contains(out, " current, S-") {
			return fmt.Errorf("streams does not show the replicas current:\n%s", out)
		}
		return nil
	})

	if err := second.Start(ctx); err != nil {
		t.Fatalf("Start with R3 after streams --replicas 3: %v", err)
	}

	// Asked for fewer, or for what is there: nothing changes.
	code, out, errOut = cli(t, "streams", "--replicas", "1")
	if code != exitOK || !strings.Contains(out, mesh+": R3, more than the R1 asked for: left as it is") ||
		!strings.Contains(out, "nothing to do") {
		t.Errorf("streams --replicas 1 on R3: exit %d\n%s%s", code, out, errOut)
	}
	if code, out, errOut := cli(t, "streams", "--replicas", "3"); code != exitOK || !strings.Contains(out, mesh+": R3 already") {
		t.Errorf("streams --replicas 3 again: exit %d\n%s%s", code, out, errOut)
	}
	if got := replicasOf(t, ctx, js, mesh); got != 3 {
		t.Errorf("%s has %d replicas after --replicas 1, want 3", mesh, got)
	}
}

// TestStreams_SingleServer: one server lists its streams, and scaling up
// fails with the server's reason and what it would take.
func TestStreams_SingleServer(t *testing.T) {
	srv := natstest.RunServer(t)
	t.Setenv("NATS_URL", srv.ClientURL())
	t.Setenv("NATS_CREDS", "")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	js, err := jetstream.New(natstest.Connect(t, srv))
	if err != nil {
		t.Fatal(err)
	}
	scheme := subjects.Default
	if err := agentkit.EnsureStream(ctx, js, agentkit.StreamConfig(scheme, 1)); err != nil {
		t.Fatal(err)
	}

	listed := streamsJSON(t)
	if s := listed[scheme.Stream()]; !s.Created || s.Replicas != 1 {
		t.Errorf("streams --json: %+v, want %s created R1", s, scheme.Stream())
	}
	if len(listed) != len(meshStreams(scheme)) {
		t.Errorf("streams --json lists %d, want %d", len(listed), len(meshStreams(scheme)))
	}

	code, out, errOut := cli(t, "streams", "--replicas", "3")
	t.Logf("streams --replicas 3:\n%s%s", out, errOut)
	if code != exitFailure || !strings.Contains(out, scheme.Stream()+": the server refused R3") ||
		!strings.Contains(out, "not in a JetStream cluster; R3 needs a cluster of at least 3 servers") ||
		!strings.Contains(errOut, "1 of 1 scale-ups to R3 refused ("+scheme.Stream()+")") {
		t.Errorf("streams --replicas 3 on one server: exit %d, want 1 with the server's reason\n%s%s", code, out, errOut)
	}
	if got := replicasOf(t, ctx, js, scheme.Stream()); got != 1 {
		t.Errorf("%s has %d replicas, want 1", scheme.Stream(), got)
	}
}

// TestStreams_Credentials: an agent's credentials may not scale streams:
// the denial comes at once, reported once with what it needs; an
// administrator's list them.
func TestStreams_Credentials(t *testing.T) {
	url, dir := isolatedMesh(t)
	for _, args := range [][]string{{"streams"}, {"streams", "--replicas", "3"}} {
		start := time.Now()
		args = append(args, "-s", url, "--creds", filepath.Join(dir, "orch_1.nk"))
		code, out, errOut := cli(t, args...)
		t.Logf("%v as orch_1: %s", args[:len(args)-4], errOut)
		if code != exitFailure || strings.Count(errOut, "ermission denied") != 1 || !strings.Contains(errOut, "an administrator's") ||
			time.Since(start) > 10*time.Second {
			t.Errorf("%v as orch_1: exit %d after %v\n%s\n%s", args[:len(args)-4], code, time.Since(start), out, errOut)
		}
	}
	code, out, errOut := cli(t, "streams", "-s", url, "--creds", filepath.Join(dir, "admin.nk"))
	if code != exitOK || !strings.Contains(out, subjects.Default.Stream()+" ") {
		t.Errorf("streams as admin: exit %d\n%s\n%s", code, out, errOut)
	}
}

// TestStreams_Usage: bad flag combinations are usage errors; the help
// says why scaling up matters.
func TestStreams_Usage(t *testing.T) {
	t.Setenv("NATS_URL", "")
	for _, args := range [][]string{
		{"streams", "--replicas", "0"}, {"streams", "--replicas", "6"}, {"streams", "--dry-run"},
		{"streams", "--replicas", "3", "--json"}, {"streams", "extra"},
	} {
		if code, out, errOut := cli(t, args...); code != exitUsage {
			t.Errorf("%v: exit %d, want 2\n%s%s", args, code, out, errOut)
		}
	}
	code, out, errOut := cli(t, "streams", "--help")
	for _, want := range []string{"Usage:", "refuses to start", "opening never changes what exists", "never lowers", "--dry-run", "2  usage error"} {
		if code != exitOK || !strings.Contains(out, want) {
			t.Errorf("streams --help: exit %d, no %q:\n%s%s", code, want, out, errOut)
		}
	}
}
