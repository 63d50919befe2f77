package main

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/agentmesh-io/agentmesh/cmd/agentmesh/internal/bench"
)

func (a *app) benchCmd() *cobra.Command {
	cfg := bench.Config{}
	scale := bench.ScaleConfig{}
	inst := bench.InstancesConfig{}
	var asJSON, quiet, external, instances bool
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Compare raw nats.go and agentkit on one NATS server",
		Long: `bench runs the same workloads with raw nats.go (PublishAsync → Consume → Ack;
raw-mesh: the same on agentkit's stream and consumer configuration, the broker's
share of agentkit's cost) and agentkit (SendBatch of 256, and Send from 64
goroutines; agentkit-group-batch and agentkit-group: the same with the receivers
hosted as one process would, in one Group on one connection) on one embedded
NATS server in one process (or --external: the configured server), and prints
msg/s, the ratio to raw and latency percentiles.
The comparison with Watermill runs from the source tree's tests, so this binary
does not link it (see the README's Performance section).

Scenarios: 1-agent, 10-agents, 100-agents (a burst of --messages sent round
robin to that many receivers), request-response (requests at --rate per second,
min(--messages, 3×rate) of them, answered through the stream), and
critical-behind-backlog (--messages low-priority messages stored first, then 10
critical ones: their latency). Payloads are --payload bytes of JSON.

Absolute figures depend on the machine; compare the ratios of one run. A
warning on stderr says when --messages is below 10000 and names the runs too
short (under a second) for their ratios to be stable: run more --messages.
Progress goes to stderr, redrawn in place on a terminal and as a line every
few seconds otherwise (--quiet: none).

--scale N,N,... runs the scale benchmark instead, one row per count N
(agentmesh bench --scale 100,300,1000 is the full run): N agents registered with
heartbeats and handlers, on --scale-runtimes connections (agent i on connection
i mod runtimes, as that many processes would hold them; the agents of one
connection share its group's five consumers, or read five each with
--scale-per-agent), declaring no fan-out action, and one driver agent on its
own. For each N it reports the time to start all N (8 at a time); the process's
CPU (in percent of one core) over --scale-idle of idleness and its RSS
(server and agents: the embedded server runs in this process; Linux only, n/a
elsewhere); the consumers on the message stream and the registry bucket's stream
and the registry's keys; the msg/s of a burst of --messages sent with SendBatch
round robin over the N agents, and its ratio to raw 1-agent throughput measured
in the same run; request round trips (p50, p99) at --scale-rate per second to
random agents for --scale-request-time; and the time to Drain all N. A count
whose agents fail to start (the server's limit of consumers per stream, say)
shows how many started and why, and the run goes on with the next count.

--instances runs the instances benchmark instead: one agent id, registered, as
one instance, as two taking turns (the default: only the eldest consumes) and as
two consuming at once (WithConcurrentInstances), each instance on its own
connection, receiving --messages sent with SendBatch; once with a trivial handler
and once with one holding its worker for --instances-hold. It reports msg/s, the
ratios to one instance and to two consuming at once, the handler's runs on each
instance and its duplicate runs.` + exitCodesHelp,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			if !quiet {
				cfg.Progress = a.stderr
			}
			isScale := cmd.Flags().Changed("scale")
			if instances {
				for _, f := range []string{"rate", "scenario", "impl", "scale"} {
					if cmd.Flags().Changed(f) {
						return usageErr(fmt.Errorf("--%s does not apply to --instances", f))
					}
				}
				inst.Messages, inst.Payload, inst.Progress = cfg.Messages, cfg.Payload, cfg.Progress
				check := inst
				check.URL = "nats://127.0.0.1:4222"
				if err := check.Validate(); err != nil {
					return usageErr(err)
				}
			} else if cmd.Flags().Changed("instances-hold") {
				return usageErr(fmt.Errorf("--instances-hold applies to --instances only"))
			}
			if isScale {
				for _, f := range []string{"rate", "scenario", "impl"} {
					if cmd.Flags().Changed(f) {
						return usageErr(fmt.Errorf("--%s does not apply to --scale", f))
					}
				}
				scale.Messages, scale.Payload, scale.Progress = cfg.Messages, cfg.Payload, cfg.Progress
				check := scale // the embedded server's URL is known once it runs
				check.URL = "nats://127.0.0.1:4222"
				if err := check.Validate(); err != nil {
					return usageErr(err)
				}
			} else {
				check := cfg
				check.URL = cmp.Or(check.URL, "nats://127.0.0.1:4222")
				if err := check.Validate(); err != nil {
					return usageErr(err)
				}
			}
			if external {
				cfg.URL = a.cfg.NATS.URLs[0]
			} else {
				dir, err := os.MkdirTemp("", "agentmesh-bench-")
				if err != nil {
					return err
				}
				defer os.RemoveAll(dir)
				srv, err := startEmbedded(dir, "127.0.0.1:-1")
				if err != nil {
					return err
				}
				defer srv.WaitForShutdown()
				defer srv.Shutdown()
				cfg.URL = srv.ClientURL()
			}
			if instances {
				inst.URL = cfg.URL
				return a.runInstances(ctx, inst, asJSON)
			}
			if isScale {
				scale.URL = cfg.URL
				return a.runScale(ctx, scale, asJSON)
			}
			results, err := bench.Run(ctx, cfg)
			if err != nil {
				return err
			}
			warnings := bench.Warnings(results)
			if w := bench.MessagesWarning(cfg.Messages); w != "" {
				warnings = append([]string{w}, warnings...)
			}
			if asJSON {
				enc := json.NewEncoder(a.stdout)
				enc.SetIndent("", "  ")
				err = enc.Encode(map[string]any{"gomaxprocs": runtime.GOMAXPROCS(0), "messages": cfg.Messages,
					"payload_bytes": cfg.Payload, "rate": cfg.Rate, "results": results, "warnings": warnings})
			} else {
				fmt.Fprintf(a.stdout, "%d messages of %d bytes per run, GOMAXPROCS %d, NATS %s\n\n", cfg.Messages, cfg.Payload, runtime.GOMAXPROCS(0), cfg.URL)
				err = bench.WriteTable(a.stdout, results)
			}
			// Warnings go to stderr even with --quiet, after the figures
			// they qualify, where a reader of the terminal sees them last.
			for _, w := range warnings {
				fmt.Fprintln(a.stderr, "warning:", w)
			}
			return err
		},
	}
	fl := cmd.Flags()
	fl.IntVar(&cfg.Messages, "messages", 20000, "messages per run")
	fl.IntVar(&cfg.Payload, "payload", 512, "payload bytes")
	fl.IntVar(&cfg.Rate, "rate", 1000, "offered requests per second in request-response")
	fl.StringSliceVar(&cfg.Scenarios, "scenario", nil, "scenarios to run (default all): "+strings.Join(bench.Scenarios, ", "))
	fl.StringSliceVar(&cfg.Impls, "impl", nil, "implementations to run (default all): "+strings.Join(bench.Impls, ", "))
	fl.BoolVar(&asJSON, "json", false, "print results as JSON")
	fl.BoolVar(&quiet, "quiet", false, "no progress display")
	fl.BoolVar(&external, "external", false, "benchmark against the configured server instead of an embedded one")
	fl.IntSliceVar(&scale.Agents, "scale", nil, "run the scale benchmark for these agent counts (e.g. 100,300,1000) instead of the comparison")
	fl.IntVar(&scale.Runtimes, "scale-runtimes", 20, "with --scale, the connections the agents are spread over")
	fl.DurationVar(&scale.Idle, "scale-idle", 10*time.Second, "with --scale, the idle window CPU is measured over")
	fl.IntVar(&scale.Rate, "scale-rate", 500, "with --scale, offered requests per second")
	fl.DurationVar(&scale.RequestTime, "scale-request-time", 5*time.Second, "with --scale, how long requests are offered")
	fl.BoolVar(&scale.PerAgent, "scale-per-agent", false, "with --scale, each agent reads five consumers of its own instead of sharing its connection's group")
	fl.BoolVar(&instances, "instances", false, "run the instances benchmark (one instance, two taking turns, two at once) instead of the comparison")
	fl.DurationVar(&inst.Hold, "instances-hold", time.Millisecond, "with --instances, how long the holding handler keeps its worker")
	return cmd
}

// runInstances runs the instances benchmark and prints its table (or
// JSON), with warnings on stderr after the figures, as the comparison does.
func (a *app) runInstances(ctx context.Context, cfg bench.InstancesConfig, asJSON bool) error {
	results, err := bench.RunInstances(ctx, cfg)
	if err != nil {
		return err
	}
	warnings := bench.InstancesWarnings(results)
	if w := bench.MessagesWarning(cfg.Messages); w != "" {
		warnings = append([]string{w}, warnings...)
	}
	if asJSON {
		enc := json.NewEncoder(a.stdout)
		enc.SetIndent("", "  ")
		err = enc.Encode(map[string]any{"gomaxprocs": runtime.GOMAXPROCS(0), "messages": cfg.Messages, "payload_bytes": cfg.Payload,
			"hold_ms": float64(cfg.Hold) / float64(time.Millisecond), "results": results, "warnings": warnings})
	} else {
		fmt.Fprintf(a.stdout, "%d messages of %d bytes per run, GOMAXPROCS %d, NATS %s\n\n", cfg.Messages, cfg.Payload, runtime.GOMAXPROCS(0), cfg.URL)
		err = bench.WriteInstancesTable(a.stdout, results)
	}
	for _, w := range warnings {
		fmt.Fprintln(a.stderr, "warning:", w)
	}
	return err
}

// runScale runs the scale benchmark and prints its table (or JSON), with
// warnings on stderr after the figures, as the comparison does.
func (a *app) runScale(ctx context.Context, cfg bench.ScaleConfig, asJSON bool) error {
	report, err := bench.RunScale(ctx, cfg)
	if err != nil && report == nil {
		return err
	}
	warnings := bench.ScaleWarnings(report)
	if w := bench.MessagesWarning(cfg.Messages); w != "" {
		warnings = append([]string{w}, warnings...)
	}
	var werr error
	if asJSON {
		enc := json.NewEncoder(a.stdout)
		enc.SetIndent("", "  ")
		werr = enc.Encode(map[string]any{"gomaxprocs": runtime.GOMAXPROCS(0), "messages": cfg.Messages, "payload_bytes": cfg.Payload,
			"runtimes": cfg.Runtimes, "idle_seconds": cfg.Idle.Seconds(), "request_rate": cfg.Rate, "request_seconds": cfg.RequestTime.Seconds(),
			"raw_1_agent": report.Raw, "results": report.Results, "warnings": warnings})
	} else {
		fmt.Fprintf(a.stdout, "bursts of %d messages of %d bytes, idle %v, requests at %d/s for %v, %d runtimes, GOMAXPROCS %d, NATS %s\n\n",
			cfg.Messages, cfg.Payload, cfg.Idle, cfg.Rate, cfg.RequestTime, cfg.Runtimes, runtime.GOMAXPROCS(0), cfg.URL)
		werr = bench.WriteScaleTable(a.stdout, report)
	}
	for _, w := range warnings {
		fmt.Fprintln(a.stderr, "warning:", w)
	}
	return cmp.Or(err, werr)
}
