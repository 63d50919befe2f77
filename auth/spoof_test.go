package auth_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/auth"
	"github.com/agentmesh-io/agentmesh/internal/natstest"
)

// TestRegistration_deliverSubject probes what the registry rights
// (Options.Registration) give away. Creating consumers on the registry's
// stream, which agentkit's KV watch needs, includes choosing a push
// consumer's deliver subject, and the server does not check it against
// the creator's publish permissions. So agent A can have the server
// publish content A wrote (a health mark) on any subject:
//
//   - core subscribers receive it: a forged heartbeat "of C" reaches the
//     monitor on mesh.hb.C, although A may not publish there;
//   - streams do not store it (nats-server 2.15.2 does not capture a
//     consumer's deliveries into another stream): a forged envelope "from
//     C" on mesh.agent.B.normal.C never reaches MESH or B.
func TestRegistration_deliverSubject(t *testing.T) {
	t.Parallel()
	b := generate(t, []auth.AgentSpec{{ID: "A"}, {ID: "B"}, {ID: "C"}}, auth.Options{Registration: true})
	s := natstest.RunServer(t, withAuth(t, b))
	provision(t, s, b, auth.ProvisionOptions{Registry: true})
	ncA, wA := conn(t, s, b, "A")
	ncB, _ := conn(t, s, b, "B")
	ncMon, _ := conn(t, s, b, auth.DefaultMonitorID)
	admin := adminJS(t, s, b)

	from := make(chan string, 1)
	bAgent := isolatedAgent(t, ncB, "B")
	if err := bAgent.HandleFunc("pay", func(_ context.Context, m *agentkit.Message) error {
		from <- m.Envelope.SenderID
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := bAgent.Start(ctx); err != nil {
		t.Fatal(err)
	}
	hb, err := ncMon.SubscribeSync("mesh.hb.C")
	if err != nil {
		t.Fatal(err)
	}
	if err := ncMon.Flush(); err != nil {
		t.Fatal(err)
	}

	// A forged envelope from C, written where A may write.
	forged := wire.NewEnvelope(wire.TypeRequest, "C", "pay")
	forged.ReceiverID = "B"
	data, err := forged.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ncA.RequestMsgWithContext(ctx, &nats.Msg{Subject: "$KV.mesh_registry.health.zz", Data: data, Header: nats.Header{
		wire.HeaderMsgID: {forged.MessageID}, wire.HeaderType: {"request"}, wire.HeaderAction: {"pay"},
	}}); err != nil {
		t.Fatalf("write the forged entry: %v", err)
	}
	// Push consumers delivering it on subjects A may not publish to.
	for i, deliver := range []string{"mesh.agent.B.normal.C", "mesh.hb.C"} {
		name := []string{"spoofmsg", "spoofhb"}[i]
		req, _ := json.Marshal(map[string]any{"stream_name": "KV_mesh_registry", "config": map[string]any{
			"name": name, "deliver_subject": deliver, "filter_subject": "$KV.mesh_registry.health.zz",
			"ack_policy": "none", "deliver_policy": "all",
		}})
		resp, err := ncA.RequestWithContext(ctx, "$JS.API.CONSUMER.CREATE.KV_mesh_registry."+name+".$KV.mesh_registry.health.zz", req)
		if err != nil {
			t.Fatalf("create consumer: %v (violations %v)", err, wA.Recent())
		}
		var r struct{ Error *struct{ Description string } }
		if json.Unmarshal(resp.Data, &r) != nil || r.Error != nil {
			t.Fatalf("consumer to %s refused: %s", deliver, resp.Data)
		}
	}
	m, err := hb.NextMsg(5 * time.Second)
	if err != nil {
		t.Fatalf("no forged heartbeat reached the monitor: %v", err)
	}
	if string(m.Data) != string(data) {
		t.Fatalf("monitor got %q", m.Data)
	}
	t.Log("a core subscriber (the monitor, on mesh.hb.C) received content written by A")

	// The stream did not store the forged direct message. A flush round
	// trip through the stream first: a message A sends as itself is
	// stored, the forged one is not.
	if _, err := isolatedAgent(t, ncA, "A").Send(ctx, "C", "probe", nil); err != nil {
		t.Fatal(err)
	}
	st, err := admin.Stream(ctx, "MESH")
	if err != nil {
		t.Fatal(err)
	}
	if n := st.CachedInfo().State.Msgs; n != 1 {
		t.Fatalf("MESH holds %d messages, want only A's probe", n)
	}
	select {
	case sender := <-from:
		t.Fatalf("B handled a message from %q injected by A", sender)
	default:
	}
}
