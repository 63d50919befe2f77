package bench_test

import (
	"strings"
	"testing"

	"github.com/agentmesh-io/agentmesh/cmd/agentmesh/internal/bench"
)

func TestWriteTable_SkippedListedWithReason(t *testing.T) {
	t.Parallel()
	results := []bench.Result{
		{Scenario: bench.ScenarioRequest, Impl: bench.ImplRaw, Messages: 10, Seconds: 1, MsgPerSec: 10, RatioToRaw: 1},
		{Scenario: bench.ScenarioRequest, Impl: bench.ImplRawMesh, Skipped: "a reference"},
		{Scenario: bench.ScenarioBacklog, Impl: bench.ImplRaw, Messages: 10, Seconds: 1},
		{Scenario: bench.ScenarioBacklog, Impl: bench.ImplRawMesh, Skipped: "a reference"},
	}
	var out strings.Builder
	if err := bench.WriteTable(&out, results); err != nil {
		t.Fatal(err)
	}
	table := out.String()
	want := "Not run:\n  raw-mesh in request-response, critical-behind-backlog: a reference\n"
	if !strings.Contains(table, want) {
		t.Errorf("table lacks %q:\n%s", want, table)
	}
	for line := range strings.Lines(table) {
		if strings.Contains(line, bench.ImplRawMesh) && !strings.HasPrefix(line, "  raw-mesh in ") {
			t.Errorf("skipped combination as a row: %q", line)
		}
	}
}
