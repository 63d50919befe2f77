package wire_test

import (
	"fmt"
	"time"

	"github.com/agentmesh-io/agentmesh/agentkit/wire"
)

func ExampleNewCorrelationID() {
	at := time.Unix(1692633612, 0)
	fmt.Println(wire.NewCorrelationID("session_user_1692633600", "show me datacenter-01 devices", at))
	// Output:
	// session_user_1692633600_87cb0a94_1692633612
}
