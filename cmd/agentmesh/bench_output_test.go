package main

import (
	"strings"
	"testing"
)

// bench on a pipe: no carriage returns, no placeholder cells, and a
// warning that so few messages give unstable ratios.
func TestBench_ShortRunOnPipe(t *testing.T) {
	t.Setenv("NATS_URL", "")
	code, out, errOut := cli(t, "bench", "--messages", "200", "--scenario", "1-agent,critical-behind-backlog", "--impl", "raw,agentkit")
	if code != exitOK {
		t.Fatalf("exit %d\n%s\n%s", code, out, errOut)
	}
	if strings.Contains(errOut, "\r") {
		t.Errorf("carriage returns on a pipe: %q", errOut)
	}
	if !strings.Contains(errOut, "warning: --messages 200: runs below 10000 messages") {
		t.Errorf("no warning about the short run:\n%s", errOut)
	}
	for line := range strings.Lines(out) {
		for _, f := range strings.Fields(line) {
			if f == "-" {
				t.Errorf("placeholder cell in %q", line)
			}
		}
	}
}
