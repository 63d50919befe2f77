package bench_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/cmd/agentmesh/internal/bench"
	"github.com/agentmesh-io/agentmesh/internal/natstest"
)

// TestRun_EveryScenarioTiny runs every scenario with every implementation
// at a tiny size and checks the result table is well formed (no timing
// assertions) and that the runs leave no stream (nor KV bucket) behind, as
// on an --external server they must not. The N-agents scenarios run with
// a few receivers: their code path does not change with N, and a hundred
// agents' setup would be most of the test's work.
func TestRun_EveryScenarioTiny(t *testing.T) {
	srv := natstest.RunServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var progress strings.Builder
	cfg := bench.Config{URL: srv.ClientURL(), Messages: 120, Rate: 200, Progress: &progress}
	bench.CapAgents(&cfg, 3)
	bench.WithWatermill(&cfg)
	impls := bench.ImplNames(&cfg)
	results, err := bench.Run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if left := streams(t, srv.ClientURL()); len(left) > 0 {
		t.Errorf("streams left behind: %v", left)
	}
	if want := len(bench.Scenarios) * len(impls); len(results) != want {
		t.Fatalf("%d results, want %d", len(results), want)
	}
	for _, r := range results {
		if r.Skipped != "" {
			continue
		}
		if r.Messages <= 0 || r.Seconds <= 0 || r.P50ms < 0 || r.P50ms > r.P90ms || r.P90ms > r.P99ms {
			t.Errorf("malformed result %+v", r)
		}
		if r.Scenario != bench.ScenarioBacklog && (r.MsgPerSec <= 0 || r.RatioToRaw <= 0) {
			t.Errorf("no rate: %+v", r)
		}
	}
	var table strings.Builder
	if err := bench.WriteTable(&table, results); err != nil {
		t.Fatal(err)
	}
	for _, s := range append(bench.Scenarios, impls...) {
		if !strings.Contains(table.String(), s) {
			t.Errorf("table lacks %s:\n%s", s, table.String())
		}
	}
	if _, err := json.Marshal(results); err != nil {
		t.Fatal(err)
	}
	// A strings.Builder is no terminal: plain lines, each run's last one
	// with every message counted.
	if strings.Contains(progress.String(), "\r") {
		t.Errorf("carriage returns in plain progress:\n%q", progress.String())
	}
	for _, r := range results {
		if r.Skipped != "" {
			continue
		}
		if line := fmt.Sprintf("%s / %s: %d/%d\n", r.Scenario, r.Impl, r.Messages, r.Messages); !strings.Contains(progress.String(), line) {
			t.Errorf("progress lacks %q:\n%s", line, progress.String())
		}
	}
}

func TestConfig_Validate(t *testing.T) {
	t.Parallel()
	for _, c := range []bench.Config{{}, {URL: "x", Messages: -1}, {URL: "x", Messages: 1, Payload: 512, Rate: 1, Scenarios: []string{"nope"}}} {
		if _, err := bench.Run(context.Background(), c); err == nil {
			t.Errorf("%+v: no error", c)
		}
	}
}

// streams lists the streams on the server at url.
func streams(t *testing.T, url string) []string {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	names := js.StreamNames(ctx)
	var out []string
	for n := range names.Name() {
		out = append(out, n)
	}
	if err := names.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
