package main

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/registry"
	"github.com/agentmesh-io/agentmesh/internal/natstest"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// registryStream is the stream of a registry bucket as an older writer
// created it: per-key TTLs allowed or not, no limit markers.
func registryStream(bucket string, allowTTL bool) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name: subjects.KVStream(bucket), Subjects: []string{subjects.KVSubject(bucket, ">")},
		MaxMsgsPerSubject: 1, MaxBytes: -1, MaxMsgSize: -1, MaxMsgs: -1, MaxConsumers: -1,
		Storage: jetstream.FileStorage, Replicas: 1, AllowRollup: true, DenyDelete: true, AllowDirect: true,
		Discard: jetstream.DiscardNew, Duplicates: 2 * time.Minute, AllowMsgTTL: allowTTL,
	}
}

// TestMigrate_RegistryMarkers: on a registry bucket without limit markers
// a crashed agent vanishes from agents' list; migrate gives the bucket its
// markers, which then cover a key put before the change, so agents lists
// an agent that crashed afterwards as UNAVAILABLE.
func TestMigrate_RegistryMarkers(t *testing.T) {
	srv := natstest.RunServer(t)
	t.Setenv("NATS_URL", srv.ClientURL())
	t.Setenv("NATS_CREDS", "")
	// The whole test's budget: two agents crash and expire and the CLI
	// runs five times, which took a minute under two suites at once.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	js, _ := jetstream.New(natstest.Connect(t, srv))
	bucket := subjects.Default.RegistryBucket()
	if _, err := js.CreateStream(ctx, registryStream(bucket, true)); err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, bucket)
	if err != nil {
		t.Fatal(err)
	}
	markerTTL := func() time.Duration {
		t.Helper()
		st, err := kv.Status(ctx)
		if err != nil {
			t.Fatalf("registry bucket status: %v", err)
		}
		return st.LimitMarkerTTL()
	}
	// crash starts agent id, kills it without Stop once registered and
	// waits until its key has expired.
	crash := func(id string, before func()) {
		t.Helper()
		nc := natstest.Connect(t, srv)
		a, err := agentkit.New(nc, id, agentkit.WithHeartbeat(400*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(a.Stop)
		if err := a.Start(ctx); err != nil {
			t.Fatal(err)
		}
		if before != nil {
			before()
		}
		nc.Close()
		natstest.WaitFor(t, 10*time.Second, func() error {
			ins, err := kv.ListKeysFiltered(ctx, "agent."+id+".*")
			if errors.Is(err, jetstream.ErrNoKeysFound) {
				return nil
			}
			if err != nil {
				return err
			}
			for k := range ins.Keys() {
				return errMsg(k + " still there")
			}
			return nil
		})
	}

	crash("lost", nil)
	code, out, errOut := cli(t, "agents")
	if code != exitOK || strings.Contains(out, "lost") || !strings.Contains(errOut, "keeps no markers") ||
		!strings.Contains(errOut, "agentmesh migrate") {
		t.Fatalf("agents on a markerless bucket: exit %d, want lost missing and a note\n%s%s", code, out, errOut)
	}

	code, out, errOut = cli(t, "migrate", "--dry-run")
	if code != exitOK || !strings.Contains(out, "would keep the markers of expired keys in registry bucket mesh_registry for 168h0m0s") {
		t.Fatalf("migrate --dry-run: exit %d\n%s%s", code, out, errOut)
	}
	if ttl := markerTTL(); ttl != 0 {
		t.Fatalf("migrate --dry-run set the marker TTL: %v", ttl)
	}

	// The victim registers before migrate and crashes after it.
	crash("victim", func() {
		code, out, errOut := cli(t, "migrate")
		if code != exitOK || !strings.Contains(out, "keep the markers of expired keys in registry bucket mesh_registry") ||
			strings.Contains(out, "allow per-key TTLs") {
			t.Fatalf("migrate: exit %d\n%s%s", code, out, errOut)
		}
	})
	if ttl := markerTTL(); ttl != registry.MarkerTTL {
		t.Fatalf("after migrate the bucket keeps markers %v, want %v", ttl, registry.MarkerTTL)
	}
	code, out, errOut = cli(t, "agents")
	if code != exitOK || !strings.Contains(out, "victim") || !strings.Contains(out, "UNAVAILABLE") || errOut != "" {
		t.Fatalf("agents after migrate: exit %d, want victim UNAVAILABLE and no note\n%s%s", code, out, errOut)
	}
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "victim ") && !strings.Contains(line, "UNAVAILABLE") {
			t.Fatalf("agents: %q, want victim UNAVAILABLE", line)
		}
	}
	if code, out, errOut := cli(t, "migrate"); code != exitOK || !strings.Contains(out, "registry bucket mesh_registry: current") ||
		!strings.Contains(out, "nothing to do") {
		t.Fatalf("migrate again: exit %d, want nothing to do\n%s%s", code, out, errOut)
	}
}

// TestMigrate_RegistryTTLs: an agent cannot register in a registry bucket
// that does not allow per-key TTLs, and its error says what allows them;
// after migrate it can.
func TestMigrate_RegistryTTLs(t *testing.T) {
	srv := natstest.RunServer(t)
	t.Setenv("NATS_URL", srv.ClientURL())
	t.Setenv("NATS_CREDS", "")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	js, _ := jetstream.New(natstest.Connect(t, srv))
	if _, err := js.CreateStream(ctx, registryStream(subjects.Default.RegistryBucket(), false)); err != nil {
		t.Fatal(err)
	}
	start := func() error {
		a, err := agentkit.New(natstest.Connect(t, srv), "worker")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(a.Stop)
		return a.Start(ctx)
	}
	if err := start(); err == nil || !strings.Contains(err.Error(), "agentmesh migrate") {
		t.Fatalf("Start on a bucket without per-key TTLs: %v, want an error naming agentmesh migrate", err)
	}
	code, out, errOut := cli(t, "migrate")
	if code != exitOK || !strings.Contains(out, "allow per-key TTLs in registry bucket mesh_registry") ||
		!strings.Contains(out, "keep the markers of expired keys") {
		t.Fatalf("migrate: exit %d\n%s%s", code, out, errOut)
	}
	if err := start(); err != nil {
		t.Fatalf("Start after migrate: %v", err)
	}
}
