package main

import (
	"strings"
	"testing"
)

// A server that does not answer is reported as such, with how to start
// one, not as a configuration error.
func TestConnect_NoServerHint(t *testing.T) {
	t.Setenv("NATS_URL", "")
	code, _, errOut := cli(t, "agents", "-s", "nats://127.0.0.1:1")
	if code != exitFailure || !strings.Contains(errOut, "cannot connect to nats at nats://127.0.0.1:1") ||
		!strings.Contains(errOut, "agentmesh up") || strings.Contains(errOut, "config:") {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
}
