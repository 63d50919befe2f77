package agentkit_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// The agents on one connection share one registry watch: the server holds
// one watcher per connection, not per agent, and the view outlives any
// one agent that used it.
func TestRegistry_OneWatchPerConnection(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	nc := m.conn()
	var agents []*agentkit.Agent
	for _, id := range []string{"a1", "a2", "a3"} {
		a, err := agentkit.New(nc, id)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(a.Stop)
		if err := a.Start(ctx(t)); err != nil {
			t.Fatal(err)
		}
		agents = append(agents, a)
	}
	js, err := jetstream.New(m.conn())
	if err != nil {
		t.Fatal(err)
	}
	watchers := func() int {
		st, err := js.Stream(ctx(t), subjects.KVStream(subjects.Default.RegistryBucket()))
		if err != nil {
			t.Fatal(err)
		}
		info, err := st.Info(ctx(t))
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Consumers
	}
	if n := watchers(); n != 1 {
		t.Errorf("%d registry watchers for three agents on one connection, want 1", n)
	}
	if agents[0].Registry() != agents[2].Registry() {
		t.Error("the agents on one connection hold different registry views")
	}
	// Another connection has its own.
	other := m.started("b1", nil)
	if n := watchers(); n != 2 {
		t.Errorf("%d registry watchers for two connections, want 2", n)
	}
	agents[0].Stop()
	agents[1].Stop()
	reg := agents[2].Registry()
	if err := reg.Err(); err != nil {
		t.Fatalf("the view ended with the agents that opened it: %v", err)
	}
	other.Stop()
	eventually(t, 10*time.Second, "the last agent sees b1 stop", func() bool {
		rec, ok := reg.Get("b1")
		return ok && rec.Status == agentkit.StatusStopped
	})
	agents[2].Stop()
	eventually(t, 10*time.Second, "no watcher left", func() bool { return watchers() == 0 })
}
