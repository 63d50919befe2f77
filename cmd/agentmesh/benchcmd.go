package main

import (
	"cmp"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"strings"

	"github.com/spf13/cobra"

	"github.com/agentmesh-io/agentmesh/cmd/agentmesh/internal/bench"
)

func (a *app) benchCmd() *cobra.Command {
	cfg := bench.Config{}
	var asJSON, quiet, external bool
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Compare raw nats.go and agentkit on one NATS server",
		Long: `bench runs the same workloads with raw nats.go (PublishAsync → Consume → Ack;
raw-mesh: the same on agentkit's stream and consumer configuration, the broker's
share of agentkit's cost) and agentkit (SendBatch of 256, and Send from 64
goroutines) on one embedded NATS server in one process (or --external: the
configured server), and prints msg/s, the ratio to raw and latency percentiles.
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
few seconds otherwise (--quiet: none).` + exitCodesHelp,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			if !quiet {
				cfg.Progress = a.stderr
			}
			check := cfg // the embedded server's URL is known once it runs
			check.URL = cmp.Or(check.URL, "nats://127.0.0.1:4222")
			if err := check.Validate(); err != nil {
				return usageErr(err)
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
	return cmd
}
