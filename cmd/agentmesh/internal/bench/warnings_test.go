package bench_test

import (
	"strings"
	"testing"

	"github.com/agentmesh-io/agentmesh/cmd/agentmesh/internal/bench"
)

func TestWarnings_ShortRunsOnly(t *testing.T) {
	t.Parallel()
	results := []bench.Result{
		{Scenario: bench.Scenario1Agent, Impl: bench.ImplRaw, Seconds: 0.2},
		{Scenario: bench.Scenario1Agent, Impl: bench.ImplAgentkit, Seconds: 1.5},
		{Scenario: bench.Scenario10Agents, Impl: bench.ImplRaw, Seconds: 2},
		{Scenario: bench.Scenario10Agents, Impl: bench.ImplWatermill, Seconds: 3},
		{Scenario: bench.ScenarioRequest, Impl: bench.ImplRaw, Seconds: 3},
		{Scenario: bench.ScenarioRequest, Impl: bench.ImplRawMesh, Skipped: "a throughput reference only"},
		{Scenario: bench.ScenarioRequest, Impl: bench.ImplAgentkit, Seconds: 0.5},
		{Scenario: bench.ScenarioBacklog, Impl: bench.ImplRaw, Seconds: 0.01},
	}
	got := bench.Warnings(results)
	if len(got) != 2 {
		t.Fatalf("warnings %q, want one for 1-agent and one for request-response", got)
	}
	for i, want := range [][]string{{bench.Scenario1Agent + ":", "raw 0.20s"}, {bench.ScenarioRequest + ":", "agentkit 0.50s"}} {
		for _, w := range want {
			if !strings.Contains(got[i], w) {
				t.Errorf("warning %q lacks %q", got[i], w)
			}
		}
	}
	if strings.Contains(got[0], "agentkit") || strings.Contains(got[1], "raw-mesh") {
		t.Errorf("warnings name runs long enough or skipped: %q", got)
	}
	long := []bench.Result{{Scenario: bench.Scenario1Agent, Impl: bench.ImplRaw, Seconds: bench.MinStableSeconds}}
	if w := bench.Warnings(long); len(w) != 0 {
		t.Errorf("warnings for runs long enough: %q", w)
	}
}
