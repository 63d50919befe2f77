package natstest_test

import (
	"context"
	"fmt"
	"testing"
	"time"

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
