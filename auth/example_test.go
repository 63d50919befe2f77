package auth_test

import (
	"fmt"

	"github.com/agentmesh-io/agentmesh/auth"
)

// Generate makes one nkey user per agent plus the monitor and the admin.
// The keys are random; the permissions are not.
func ExampleGenerate() {
	b, err := auth.Generate([]auth.AgentSpec{
		{ID: "planner"},
		{ID: "executor", Topics: []string{"tasks"}},
	}, auth.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, u := range b.Users {
		fmt.Printf("%-8s %s (%s)\n", u.Role, u.Name, u.Name+auth.CredentialsExt)
	}
	planner, _ := b.User("planner")
	fmt.Println("planner may publish:")
	for _, s := range planner.Permissions.Publish {
		fmt.Println("  " + s)
	}
	fmt.Println("planner may subscribe:", planner.Permissions.Subscribe)

	_, err = auth.Generate([]auth.AgentSpec{{ID: "planner"}, {ID: "bad.id"}}, auth.Options{})
	fmt.Println(err)
	// Output:
	// agent    planner (planner.nk)
	// agent    executor (executor.nk)
	// monitor  ackmonitor (ackmonitor.nk)
	// admin    admin (admin.nk)
	// planner may publish:
	//   mesh.agent.*.*.planner
	//   mesh.topic.*.*.planner
	//   mesh.broadcast.*.planner
	//   mesh.hb.planner
	//   $JS.API.CONSUMER.MSG.NEXT.MESH.planner_critical
	//   $JS.API.CONSUMER.INFO.MESH.planner_critical
	//   $JS.ACK.MESH.planner_critical.>
	//   $JS.ACK.*.*.MESH.planner_critical.>
	//   $JS.API.CONSUMER.MSG.NEXT.MESH.planner_high
	//   $JS.API.CONSUMER.INFO.MESH.planner_high
	//   $JS.ACK.MESH.planner_high.>
	//   $JS.ACK.*.*.MESH.planner_high.>
	//   $JS.API.CONSUMER.MSG.NEXT.MESH.planner_normal
	//   $JS.API.CONSUMER.INFO.MESH.planner_normal
	//   $JS.ACK.MESH.planner_normal.>
	//   $JS.ACK.*.*.MESH.planner_normal.>
	//   $JS.API.CONSUMER.MSG.NEXT.MESH.planner_low
	//   $JS.API.CONSUMER.INFO.MESH.planner_low
	//   $JS.ACK.MESH.planner_low.>
	//   $JS.ACK.*.*.MESH.planner_low.>
	//   $JS.API.CONSUMER.MSG.NEXT.MESH.planner_batch
	//   $JS.API.CONSUMER.INFO.MESH.planner_batch
	//   $JS.ACK.MESH.planner_batch.>
	//   $JS.ACK.*.*.MESH.planner_batch.>
	//   $JS.API.CONSUMER.MSG.NEXT.MESH.planner_fanout-urgent
	//   $JS.API.CONSUMER.INFO.MESH.planner_fanout-urgent
	//   $JS.ACK.MESH.planner_fanout-urgent.>
	//   $JS.ACK.*.*.MESH.planner_fanout-urgent.>
	//   $JS.API.CONSUMER.MSG.NEXT.MESH.planner_fanout-bulk
	//   $JS.API.CONSUMER.INFO.MESH.planner_fanout-bulk
	//   $JS.ACK.MESH.planner_fanout-bulk.>
	//   $JS.ACK.*.*.MESH.planner_fanout-bulk.>
	// planner may subscribe: [_INBOX_planner.>]
	// auth: invalid spec: agent 1 "bad.id": subjects: invalid agent id "bad.id": character '.' at byte 3 is not in [A-Za-z0-9_-]
}
