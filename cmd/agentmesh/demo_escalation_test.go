package main

import (
	"regexp"
	"testing"
	"time"
)

// The demo's own monitor escalates the hung executor's message without
// the failover margin a monitor among several needs: under a second, not
// the two status checks of the default pinned TTL (4s).
func TestDemo_EscalationPrompt(t *testing.T) {
	t.Setenv("NATS_URL", "")
	t.Setenv("AGENTMESH_MONITOR_HTTP_ADDR", "127.0.0.1:0")
	code, out, errOut := cli(t, "demo")
	if code != exitOK {
		t.Fatalf("exit %d\n%s\n%s", code, out, errOut)
	}
	m := regexp.MustCompile(`escalation → received from ackmonitor +\[([^\]]+)\]`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no escalation step:\n%s", out)
	}
	took, err := time.ParseDuration(m[1])
	if err != nil {
		t.Fatal(err)
	}
	if took > 2*time.Second {
		t.Fatalf("escalation took %v after the exhausted delivery; want well under the default pinned TTL's 4s", took)
	}
}
