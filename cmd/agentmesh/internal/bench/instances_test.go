package bench_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/agentmesh-io/agentmesh/cmd/agentmesh/internal/bench"
	"github.com/agentmesh-io/agentmesh/internal/natstest"
)

// TestRunInstances_Tiny runs the instances benchmark with a few messages
// and checks every run is there, in order, with the handler's runs adding
// up to the messages and their duplicates (no timing assertions), the
// standing-by instance of the turns runs idle, and no stream or bucket
// left behind.
func TestRunInstances_Tiny(t *testing.T) {
	srv := natstest.RunServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var progress strings.Builder
	cfg := bench.InstancesConfig{URL: srv.ClientURL(), Messages: 200, Hold: time.Millisecond, Progress: &progress}
	results, err := bench.RunInstances(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if left := streams(t, srv.ClientURL()); len(left) > 0 {
		t.Errorf("streams left behind: %v", left)
	}
	if len(results) != 6 {
		t.Fatalf("%d results, want 6", len(results))
	}
	consume := []string{bench.ConsumeAlone, bench.ConsumeTurns, bench.ConsumeConcurrent}
	for i, r := range results {
		handler, instances := "trivial", 2
		if i >= 3 {
			handler = "hold"
		}
		if i%3 == 0 {
			instances = 1
		}
		if r.Handler != handler || r.Instances != instances || r.Consume != consume[i%3] || len(r.Runs) != instances {
			t.Errorf("result %d: %+v, want %s with %d instances %s", i, r, handler, instances, consume[i%3])
			continue
		}
		if r.Messages != cfg.Messages || r.Seconds <= 0 || r.MsgPerSec <= 0 || r.P50ms < 0 || r.P50ms > r.P99ms {
			t.Errorf("malformed result %+v", r)
		}
		var runs int64
		for _, n := range r.Runs {
			runs += n
		}
		if r.Duplicates < 0 || runs != int64(r.Messages)+r.Duplicates {
			t.Errorf("%s %s: runs %v, %d duplicates for %d messages", r.Handler, r.Consume, r.Runs, r.Duplicates, r.Messages)
		}
		if r.Consume == bench.ConsumeTurns && r.Runs[1] != 0 {
			t.Errorf("%s: the standing-by instance ran the handler %d times", r.Handler, r.Runs[1])
		}
		if r.RatioToAlone <= 0 || r.RatioToConcurrent <= 0 ||
			(r.Consume == bench.ConsumeAlone && r.RatioToAlone != 1) || (r.Consume == bench.ConsumeConcurrent && r.RatioToConcurrent != 1) {
			t.Errorf("%s %s: ratios %g to alone, %g to concurrent", r.Handler, r.Consume, r.RatioToAlone, r.RatioToConcurrent)
		}
	}
	var table strings.Builder
	if err := bench.WriteInstancesTable(&table, results); err != nil {
		t.Fatal(err)
	}
	for _, s := range append(consume, "trivial", "hold 1ms", "200 / 0") {
		if !strings.Contains(table.String(), s) {
			t.Errorf("table lacks %q:\n%s", s, table.String())
		}
	}
	if _, err := json.Marshal(results); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(progress.String(), "instances / hold / 2, turns: 200/200\n") {
		t.Errorf("progress:\n%s", progress.String())
	}
}

func TestInstancesConfig_Validate(t *testing.T) {
	t.Parallel()
	for _, c := range []bench.InstancesConfig{{}, {URL: "x", Messages: -1}, {URL: "x", Hold: -time.Millisecond}} {
		if _, err := bench.RunInstances(context.Background(), c); err == nil {
			t.Errorf("%+v: no error", c)
		}
	}
}
