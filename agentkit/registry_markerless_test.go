package agentkit_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/registry"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// createMarkerlessRegistry creates the registry bucket as a writer that
// knows per-key TTLs but not limit markers does: per-message TTLs
// allowed, no subject-delete-marker TTL. A key whose TTL runs out then
// vanishes without a marker, so nothing tells a watcher it went.
func createMarkerlessRegistry(t *testing.T, js jetstream.JetStream) {
	t.Helper()
	bucket := subjects.Default.RegistryBucket()
	_, err := js.CreateStream(ctx(t), jetstream.StreamConfig{
		Name:              subjects.KVStream(bucket),
		Subjects:          []string{subjects.KVSubject(bucket, ">")},
		MaxMsgsPerSubject: 1,
		MaxBytes:          -1,
		MaxMsgSize:        -1,
		MaxMsgs:           -1,
		MaxConsumers:      -1,
		Storage:           jetstream.FileStorage,
		Replicas:          1,
		AllowRollup:       true,
		DenyDelete:        true,
		AllowDirect:       true,
		Discard:           jetstream.DiscardNew,
		Duplicates:        2 * time.Minute,
		AllowMsgTTL:       true,
	})
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx(t), bucket)
	if err != nil {
		t.Fatal(err)
	}
	st, err := kv.Status(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if st.LimitMarkerTTL() != 0 {
		t.Fatalf("bucket created with marker TTL %v, want none", st.LimitMarkerTTL())
	}
}

// On a bucket without limit markers an instance whose heartbeats stopped
// is UNAVAILABLE to a watching registry although the server told it
// nothing: the record states its TTL, the view judges it stale by itself
// and its watch tells Watch channels. A registry that loads the bucket
// after the key vanished cannot know the instance ran: it does not list
// the agent (agentmesh migrate gives the bucket its markers).
func TestRegistry_MarkerlessCrashIsUnavailableToWatcher(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	js, err := jetstream.New(m.conn())
	if err != nil {
		t.Fatal(err)
	}
	createMarkerlessRegistry(t, js)
	watcher := m.started("watcher", nil, agentkit.WithHeartbeat(testHeartbeat))
	reg := watcher.Registry()
	events := reg.Watch(ctx(t))
	nc := m.conn()
	victim, err := agentkit.New(nc, "victim", agentkit.WithHeartbeat(testHeartbeat))
	if err != nil {
		t.Fatal(err)
	}
	if err := victim.Start(ctx(t)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(victim.Stop)
	eventually(t, 5*time.Second, "victim READY", func() bool {
		rec, ok := reg.Get("victim")
		return ok && rec.Status == agentkit.StatusReady
	})
	kv, err := js.KeyValue(ctx(t), subjects.Default.RegistryBucket())
	if err != nil {
		t.Fatal(err)
	}
	keys, err := kv.ListKeysFiltered(ctx(t), "agent.victim.*")
	if err != nil {
		t.Fatal(err)
	}
	var key string
	for k := range keys.Keys() {
		key = k
	}
	if key == "" {
		t.Fatal("no registry key for the victim")
	}
	nc.Close() // crash: no Stop, no deregistration
	crashed := time.Now()
	// The key's TTL is 3 heartbeats rounded up to whole seconds; the
	// server removes it at its next expiry scan after that, leaving no
	// marker.
	eventually(t, 3*testHeartbeat+5*time.Second, "the victim's key expired", func() bool {
		_, err := kv.Get(context.Background(), key)
		return errors.Is(err, jetstream.ErrKeyNotFound)
	})

	if rec, ok := reg.Get("victim"); !ok || rec.Status != agentkit.StatusUnavailable || rec.Instances != 0 {
		t.Fatalf("watched cache: victim %+v (found %v), want UNAVAILABLE with no live instance", rec, ok)
	}
	got, err := reg.Find(ctx(t), registry.Query{Status: agentkit.StatusReady})
	if err != nil || len(got) != 1 || got[0].ID != "watcher" {
		t.Fatalf("READY agents = %+v, %v; want only the watcher", got, err)
	}
	got, err = reg.Find(ctx(t), registry.Query{Status: agentkit.StatusUnavailable})
	if err != nil || len(got) != 1 || got[0].ID != "victim" {
		t.Fatalf("UNAVAILABLE agents = %+v, %v; want the victim", got, err)
	}
	deadline := time.After(5 * time.Second)
	for told := false; !told; {
		select {
		case ev, ok := <-events:
			if !ok {
				t.Fatal("Watch ended")
			}
			told = ev.Agent.ID == "victim" && ev.Agent.Status == agentkit.StatusUnavailable
		case <-deadline:
			t.Fatal("Watch did not report the victim UNAVAILABLE")
		}
	}
	t.Logf("Watch told UNAVAILABLE %v after the crash (TTL 2s)", time.Since(crashed).Round(10*time.Millisecond))

	loaded, err := registry.Open(ctx(t), js, subjects.Default, 1, false)
	if err != nil {
		t.Fatal(err)
	}
	defer loaded.Close()
	if rec, ok := loaded.Get("victim"); ok {
		t.Fatalf("a registry loaded after the key vanished lists the victim: %+v", rec)
	}
}
