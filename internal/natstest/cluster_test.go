package natstest_test

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/internal/natstest"
)

// TestCluster_FailoverAndCatchUp checks that an R3 stream keeps
// every message while its leader is shut down, and the restarted node
// catches up.
func TestCluster_FailoverAndCatchUp(t *testing.T) {
	c := natstest.RunCluster(t, 3)
	nc := c.Connect(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	natstest.WaitFor(t, 10*time.Second, func() error {
		_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"}, Replicas: 3})
		return err
	})
	publish := func(from, to int) {
		for i := from; i < to; i++ {
			natstest.WaitFor(t, 20*time.Second, func() error {
				pctx, pcancel := context.WithTimeout(ctx, time.Second)
				defer pcancel()
				_, err := js.Publish(pctx, "t.x", []byte(fmt.Sprint(i)), jetstream.WithMsgID(fmt.Sprint(i)))
				return err
			})
		}
	}
	publish(0, 100)
	leader, err := c.StreamLeader(ctx, js, "T")
	if err != nil {
		t.Fatal(err)
	}
	c.Shutdown(leader)
	publish(100, 200)
	natstest.WaitFor(t, 20*time.Second, func() error {
		st, err := js.Stream(ctx, "T")
		if err != nil {
			return err
		}
		info, err := st.Info(ctx)
		if err != nil {
			return err
		}
		if info.State.Msgs != 200 {
			return fmt.Errorf("%d messages", info.State.Msgs)
		}
		return nil
	})
	c.Restart(t, leader)
	c.WaitStreamCurrent(t, js, "T", 30*time.Second)
}

// TestStartCluster_StartsAgainWhenAPortIsTaken takes the first node's
// cluster port between its reservation and the start, as a parallel
// test could, and checks that the cluster starts on fresh ports.
func TestStartCluster_StartsAgainWhenAPortIsTaken(t *testing.T) {
	builds := 0
	c := natstest.StartCluster(t, 3, func(ports []int) []*server.Options {
		builds++
		if builds == 1 {
			l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", ports[0]))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { l.Close() })
		}
		all := make([]*server.Options, len(ports))
		for i := range ports {
			all[i] = &server.Options{
				ServerName: fmt.Sprintf("S-%d", i+1),
				Host:       "127.0.0.1",
				Port:       -1,
				JetStream:  true,
				StoreDir:   t.TempDir(),
				NoLog:      true,
				NoSigs:     true,
				Cluster:    server.ClusterOpts{Name: "MESH", Host: "127.0.0.1", Port: ports[i]},
				Routes:     natstest.RoutesTo(ports),
			}
		}
		return all
	})
	if builds != 2 {
		t.Fatalf("built the cluster %d times, want 2", builds)
	}
	if len(c.Servers) != 3 {
		t.Fatalf("%d servers", len(c.Servers))
	}
}
