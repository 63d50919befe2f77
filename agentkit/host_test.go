package agentkit_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/registry"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// A group renews one host record per heartbeat for all its members, which
// read READY in another process's registry; a member that stops reads
// STOPPED; when the hosting process dies, its members read UNAVAILABLE.
func TestGroup_HostRecordCarriesMembersLiveness(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	nc := m.conn()
	g := newGroup(t, nc, "proc1")
	const members = 10
	hb := agentkit.WithHeartbeat(400 * time.Millisecond)
	var agents []*agentkit.Agent
	for i := range members {
		agents = append(agents, groupAgent(t, nc, g, fmt.Sprintf("w%d", i), &recorder{}, hb))
	}
	js, err := jetstream.New(m.conn())
	if err != nil {
		t.Fatal(err)
	}
	view, err := registry.Open(ctx(t), js, subjects.Default, 1, false)
	if err != nil {
		t.Fatal(err)
	}
	defer view.Close()
	ready := func(status registry.Status) func() bool {
		return func() bool {
			for i := range members {
				if rec, _ := view.Get(fmt.Sprintf("w%d", i)); rec.Status != status {
					return false
				}
			}
			return true
		}
	}
	eventually(t, 10*time.Second, "every member READY", ready(registry.StatusReady))

	// Over several heartbeats the bucket takes about one put per
	// heartbeat: the host's, not one per member.
	st, err := js.Stream(ctx(t), subjects.KVStream(subjects.Default.RegistryBucket()))
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx(t), subjects.Default.RegistryBucket())
	if err != nil {
		t.Fatal(err)
	}
	hostKey := func() uint64 {
		w, err := kv.ListKeysFiltered(ctx(t), "host.proc1.*")
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = w.Stop() }()
		for k := range w.Keys() {
			e, err := kv.Get(ctx(t), k)
			if err != nil {
				t.Fatal(err)
			}
			return e.Revision()
		}
		t.Fatal("no host record")
		return 0
	}
	info, err := st.Info(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	first, rev0 := info.State.LastSeq, hostKey()
	eventually(t, 20*time.Second, "five host renewals", func() bool { return hostKey() >= rev0+5 })
	info, err = st.Info(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	renewals := hostKey() - rev0
	if puts := info.State.LastSeq - first; puts > renewals+members+1 {
		t.Fatalf("%d registry puts over %d host renewals of %d members; want about one a renewal", puts, renewals, members)
	}
	eventually(t, 10*time.Second, "members still READY", ready(registry.StatusReady))

	agents[0].Stop()
	eventually(t, 10*time.Second, "the stopped member STOPPED", func() bool {
		rec, _ := view.Get("w0")
		return rec.Status == registry.StatusStopped
	})
	nc.Close() // the hosting process dies: no member deregisters
	eventually(t, 10*time.Second, "the other members UNAVAILABLE", func() bool {
		for i := 1; i < members; i++ {
			if rec, _ := view.Get(fmt.Sprintf("w%d", i)); rec.Status != registry.StatusUnavailable {
				return false
			}
		}
		return true
	})
}
