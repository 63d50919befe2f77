package bench_test

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/agentmesh-io/agentmesh/cmd/agentmesh/internal/bench"
	"github.com/agentmesh-io/agentmesh/internal/natstest"
)

// tinyScale is a scale run small enough for a test: its code path is the
// full run's, only the counts and windows shrink.
func tinyScale(url string, agents ...int) bench.ScaleConfig {
	return bench.ScaleConfig{URL: url, Agents: agents, Runtimes: 4, Messages: 200,
		Idle: 200 * time.Millisecond, Rate: 100, RequestTime: 300 * time.Millisecond}
}

// TestRunScale_Tiny runs the scale benchmark for 10 agents over 4
// runtimes and checks every figure is there and sensible (no timing
// assertions), and that the run leaves no stream or bucket behind.
func TestRunScale_Tiny(t *testing.T) {
	srv := natstest.RunServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := tinyScale(srv.ClientURL(), 10)
	var progress strings.Builder
	cfg.Progress = &progress
	report, err := bench.RunScale(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if left := streams(t, srv.ClientURL()); len(left) > 0 {
		t.Errorf("streams left behind: %v", left)
	}
	if report.Raw.Messages != cfg.Messages || report.Raw.MsgPerSec <= 0 {
		t.Errorf("raw reference %+v", report.Raw)
	}
	if len(report.Results) != 1 {
		t.Fatalf("%d rows, want 1", len(report.Results))
	}
	r := report.Results[0]
	if r.Error != "" || r.StoppedIn != "" {
		t.Fatalf("row stopped in %s: %s", r.StoppedIn, r.Error)
	}
	if r.Agents != 10 || r.Runtimes != 4 || r.Started != 10 || r.StartSeconds <= 0 {
		t.Errorf("start: %+v", r)
	}
	if r.IdleSeconds < 0.2 {
		t.Errorf("idle window %gs, want at least 0.2s", r.IdleSeconds)
	}
	if runtime.GOOS == "linux" {
		if r.IdleCPUPercent == nil || *r.IdleCPUPercent < 0 || r.RSSBytes == nil || *r.RSSBytes <= 0 {
			t.Errorf("idle CPU %v, RSS %v: want measured on Linux", r.IdleCPUPercent, r.RSSBytes)
		}
	}
	if r.MeshConsumers <= 0 || r.RegistryKeys < r.Agents {
		t.Errorf("server state: %d consumers on the message stream, %d registry keys for %d agents", r.MeshConsumers, r.RegistryKeys, r.Agents)
	}
	if r.BurstMessages != cfg.Messages || r.BurstMsgPerSec <= 0 || r.BurstRatioToRaw <= 0 {
		t.Errorf("burst: %d messages, %g msg/s, %g of raw", r.BurstMessages, r.BurstMsgPerSec, r.BurstRatioToRaw)
	}
	if r.Requests != 30 || r.RequestP50ms <= 0 || r.RequestP99ms < r.RequestP50ms {
		t.Errorf("requests: %d, p50 %gms, p99 %gms", r.Requests, r.RequestP50ms, r.RequestP99ms)
	}
	if r.DrainSeconds <= 0 {
		t.Errorf("drain %gs", r.DrainSeconds)
	}

	var table strings.Builder
	if err := bench.WriteScaleTable(&table, report); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(table.String(), "10/10") || strings.Contains(table.String(), "Stopped early") {
		t.Errorf("table:\n%s", table.String())
	}
	if _, err := json.Marshal(report); err != nil {
		t.Fatal(err)
	}
	for _, phase := range []string{"start", "idle", "burst", "requests", "drain"} {
		if !strings.Contains(progress.String(), "scale 10 agents / "+phase) {
			t.Errorf("progress lacks the %s phase:\n%s", phase, progress.String())
		}
	}
}

// TestRunScale_StartFailureIsARow runs 31 agents on a server allowing 30
// consumers per stream: whatever an agent's consumers, they cannot all
// start. The row says how many started and the server's error, and the
// next count (1 agent, on a stream of its own) runs in full.
func TestRunScale_StartFailureIsARow(t *testing.T) {
	const limit = 30
	// The message stream sets its own consumer limit, above the server's
	// default; an account limit below it still applies.
	srv := natstest.RunServer(t)
	if err := srv.GlobalAccount().UpdateJetStreamLimits(map[string]server.JetStreamAccountLimits{
		"": {MaxConsumers: limit, MaxMemory: -1, MaxStore: -1, MaxStreams: -1, MaxAckPending: -1},
	}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := tinyScale(srv.ClientURL(), limit+1, 1)
	cfg.PerAgent = true // five consumers per agent: a group's five would not reach the limit
	report, err := bench.RunScale(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if left := streams(t, srv.ClientURL()); len(left) > 0 {
		t.Errorf("streams left behind: %v", left)
	}
	if len(report.Results) != 2 {
		t.Fatalf("%d rows, want 2", len(report.Results))
	}
	failed, next := report.Results[0], report.Results[1]
	if failed.Started >= failed.Agents || failed.StoppedIn != "start" || !strings.Contains(failed.Error, "maximum consumers limit reached") {
		t.Errorf("%d agents at %d consumers per stream: %d started, stopped in %q: %s", failed.Agents, limit, failed.Started, failed.StoppedIn, failed.Error)
	}
	if failed.BurstMessages != 0 || failed.DrainSeconds != 0 {
		t.Errorf("phases after the failed start ran: %+v", failed)
	}
	if next.Error != "" || next.Started != 1 || next.BurstMessages == 0 {
		t.Errorf("the count after the failure: %+v", next)
	}
	var table strings.Builder
	if err := bench.WriteScaleTable(&table, report); err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("Stopped early:\n  %d agents, in start: ", limit+1); !strings.Contains(table.String(), want) {
		t.Errorf("table lacks %q:\n%s", want, table.String())
	}
}

func TestScaleConfig_Validate(t *testing.T) {
	t.Parallel()
	for _, c := range []bench.ScaleConfig{{}, {URL: "x"}, {URL: "x", Agents: []int{0}}, {URL: "x", Agents: []int{1}, Runtimes: -1}} {
		if _, err := bench.RunScale(context.Background(), c); err == nil {
			t.Errorf("%+v: no error", c)
		}
	}
}
