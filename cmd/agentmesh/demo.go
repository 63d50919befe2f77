package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/agentmesh-io/agentmesh/ackmonitor"
	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/cmd/agentmesh/internal/trace"
	"github.com/agentmesh-io/agentmesh/cmd/internal/monitorsvc"
	"github.com/agentmesh-io/agentmesh/internal/demo"
)

func (a *app) demoCmd() *cobra.Command {
	var (
		dataDir   string
		serve     bool
		every     time.Duration
		noMon     bool
		expectEsc bool
	)
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run the demo agents' workflows on an embedded NATS server",
		Long: `demo starts an embedded NATS server with JetStream (unless --server, NATS_URL or
the configuration names one), the ack monitor, and the demo agents
orchestrator, planner, executors, validator and director, each on its own
connection. It runs two workflows:

  1. the complete communication flow: the orchestrator has the planner
     plan the update of CUST001's credit limit (plan_workflow → plan_complete),
     the executor fetch and update it (execute_operation → execution_complete),
     the validator check it (validate → validation_result), then tells the
     director (workflow_complete).
  2. a workflow that goes wrong on purpose: a busy executor NACKs twice and is
     retried with backoff, then succeeds; a hung executor never acks, so the
     broker redelivers after each ack timeout until the attempts are used up
     (MAX_DELIVERIES), which the ack monitor escalates to the director.

The demo uses short delivery policies (ack timeouts 250ms, 500ms, 1s; 3 attempts)
so it ends in seconds. It prints each conversation as a tree read back from the
MESH stream by correlation id, then per-agent and per-priority ack statistics.
With --serve it keeps the agents running and repeats the workflows until Ctrl-C.` + demoExitCodesHelp,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if every <= 0 {
				return usageErr(fmt.Errorf("--every %v: must be positive", every))
			}
			return a.runDemo(cmd.Context(), dataDir, serve, every, !noMon, expectEsc)
		},
	}
	cmd.Flags().StringVar(&dataDir, "data", "", "JetStream store of the embedded server (default: a temporary directory, removed on exit)")
	cmd.Flags().BoolVar(&serve, "serve", false, "keep running, repeating the workflows, until interrupted")
	cmd.Flags().DurationVar(&every, "every", 10*time.Second, "with --serve, the pause between workflow runs")
	cmd.Flags().BoolVar(&noMon, "no-monitor", false, "do not start the ack monitor (on an external server it never starts one)")
	cmd.Flags().BoolVar(&expectEsc, "expect-escalation", false, "on an external server: an ack monitor runs there, so expect its escalation")
	return cmd
}

// demoPinnedTTL is the pinned TTL of the demo's own ack monitor: the
// shortest that keeps the monitor's fetch wait (250ms, at most a quarter
// of it) valid.
const demoPinnedTTL = time.Second

func (a *app) runDemo(ctx context.Context, dataDir string, serve bool, every time.Duration, withMonitor, expectEscalation bool) error {
	out := a.stdout
	connect := a.connect
	var dir string // the embedded server's store
	if !a.serverGiven {
		dir = dataDir
		if dir == "" {
			tmp, err := os.MkdirTemp("", "agentmesh-demo-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(tmp)
			dir = tmp
		}
		srv, err := startEmbedded(dir, "127.0.0.1:-1")
		if err != nil {
			return err
		}
		defer srv.WaitForShutdown()
		defer srv.Shutdown()
		url := srv.ClientURL()
		fmt.Fprintf(out, "embedded NATS server %s (JetStream store %s)\n", url, dir)
		connect = func(ctx context.Context, name string) (*nats.Conn, error) {
			return nats.Connect(url, nats.Name(name))
		}
	} else {
		fmt.Fprintf(out, "NATS servers %v\n", a.cfg.NATS.URLs)
	}

	opts, err := a.cfg.AgentOptions()
	if err != nil {
		return err
	}
	scheme := a.scheme()
	monNC, err := connect(ctx, "agentmesh-demo-monitor")
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer monNC.Close()
	mon := monitorHandle{stop: func() {}}
	if withMonitor && !a.serverGiven {
		// The ledger goes with the demo's own store, whatever
		// monitor.data_dir or monitor.postgres_dsn say: its rows name
		// stream sequences of that store only.
		octx, cancel := context.WithTimeout(ctx, 30*time.Second)
		st, err := monitorsvc.OpenSQLite(octx, filepath.Join(dir, "ackmonitor"))
		cancel()
		if err != nil {
			return fmt.Errorf("ack monitor: %w", err)
		}
		// The demo's monitor is the only instance on a server of its
		// own, so nothing needs the failover margin of monitor.pinned_ttl:
		// a newly pinned instance acts only after two status checks
		// (pinned_ttl/5 each), which would hold the first escalation back
		// for seconds.
		mcfg := *a.cfg
		mcfg.Monitor.PinnedTTL = min(mcfg.Monitor.PinnedTTL, demoPinnedTTL)
		mon, err = startMonitor(ctx, &mcfg, monNC, st, a.cfg.Monitor.HTTPAddr, !httpAddrExplicit(a.cfg), demo.Director, slog.New(slog.DiscardHandler))
		if err != nil {
			return fmt.Errorf("ack monitor: %w", err)
		}
		defer mon.stop()
	}
	switch {
	case mon.fellBack:
		fmt.Fprintf(out, "ack monitor dashboard %s (monitor.http_addr %s is taken)\n", mon.dashboard, a.cfg.Monitor.HTTPAddr)
	case mon.dashboard != "":
		fmt.Fprintf(out, "ack monitor dashboard %s\n", mon.dashboard)
	case expectEscalation:
		fmt.Fprintln(out, "ack monitor: external (expecting its escalations)")
	default:
		fmt.Fprintln(out, "ack monitor: not running (no escalations to the director)")
	}

	mesh, err := demo.Start(ctx, demo.Config{Connect: connect, Options: opts, Scheme: scheme, ExpectEscalation: mon.running || expectEscalation})
	if err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		mesh.Stop(sctx)
	}()
	js, err := jetstream.New(monNC)
	if err != nil {
		return err
	}

	ok, err := a.demoRound(ctx, out, mesh, js, true)
	if err != nil {
		return err
	}
	printDemoStats(ctx, out, mesh)
	if mon.dashboard != "" {
		a.printMonitorStats(ctx, out, js, mon.dashboard)
	}
	if !serve {
		if !ok {
			return &exitError{code: exitExpected, err: errors.New("demo: a workflow did not end as expected")}
		}
		fmt.Fprintln(out, "\ndemo: both workflows ended as expected")
		return nil
	}
	fmt.Fprintf(out, "\nserving: repeating the workflows every %v; Ctrl-C to stop\n", every)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			fmt.Fprintln(out, "stopping")
			return nil
		case <-t.C:
		}
		if _, err := a.demoRound(ctx, out, mesh, js, false); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			fmt.Fprintln(a.stderr, "demo round:", err)
		}
	}
}

// demoRound runs both workflows; verbose prints each step and the trees.
func (a *app) demoRound(ctx context.Context, out io.Writer, mesh *demo.Mesh, js jetstream.JetStream, verbose bool) (bool, error) {
	ok := true
	for i, run := range []func(context.Context) (*demo.Workflow, error){mesh.RunCreditLimit, mesh.RunFailure} {
		w, err := run(ctx)
		if err != nil {
			return false, err
		}
		ok = ok && w.OK
		if !verbose {
			fmt.Fprintf(out, "%s  %-32s %s  %v\n", time.Now().Format(time.TimeOnly), w.Name, verdict(w.OK), w.Took.Round(time.Millisecond))
			continue
		}
		printWorkflow(out, i+1, w)
		entries, err := trace.Read(ctx, js, a.scheme(), w.Correlation)
		if err != nil {
			return false, err
		}
		fmt.Fprintf(out, "\n  conversation (%d messages read back from stream %s by correlation id):\n", len(entries), a.scheme().Stream())
		var b indentWriter
		b.w, b.prefix = out, "    "
		trace.Render(&b, trace.Build(entries), a.scheme(), time.Time{})
	}
	return ok, nil
}

// printMonitorStats waits (briefly) until the monitor has recorded every
// message of the stream and evaluated its alerts since, then prints its
// per-agent and per-priority rates and the alerts.
func (a *app) printMonitorStats(ctx context.Context, out io.Writer, js jetstream.JetStream, dashboard string) {
	base := strings.TrimSuffix(dashboard, "/")
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, a.scheme().Stream())
	if err != nil {
		return
	}
	info, err := st.Info(ctx)
	if err != nil {
		return
	}
	for ctx.Err() == nil {
		var sum summaryView
		if getJSON(ctx, base+"/api/v1/summary", &sum) == nil && sum.Total.Sent >= int64(info.State.Msgs) && sum.Total.Sent == sum.Total.Resolved {
			break
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
	// Alerts are evaluated every few seconds: one evaluation that read
	// the rates after the ledger caught up judges every message.
	caught := time.Now()
	evalCtx, cancelEval := context.WithTimeout(context.WithoutCancel(ctx), 2*ackmonitor.DefaultEvaluateInterval)
	defer cancelEval()
	for evalCtx.Err() == nil {
		var sum summaryView
		if getJSON(evalCtx, base+"/api/v1/summary", &sum) == nil && sum.EvaluatedAt.After(caught) {
			break
		}
		select {
		case <-evalCtx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
	fmt.Fprintf(out, "\nack monitor (%s/api/v1): per receiving agent and priority\n", base)
	if err := a.runStats(context.WithoutCancel(ctx), base, false); err != nil {
		fmt.Fprintln(a.stderr, "ack monitor stats:", err)
	}
}

func verdict(ok bool) string {
	if ok {
		return "as expected"
	}
	return "NOT AS EXPECTED"
}

func printWorkflow(out io.Writer, n int, w *demo.Workflow) {
	fmt.Fprintf(out, "\n== workflow %d: %s\n   workflow_id %s  correlation_id %s\n", n, w.Name, w.WorkflowID, w.Correlation)
	for _, s := range w.Steps {
		mark := "✓"
		if !s.OK {
			mark = "✗"
		}
		task := ""
		if s.TaskID != "" {
			task = " (" + s.TaskID + ")"
		}
		fmt.Fprintf(out, "   %s %-14s %s%s → %s  [%v]\n", mark, s.To, s.Action, task, s.Outcome, s.Took.Round(time.Millisecond))
	}
	for _, note := range w.Notes {
		fmt.Fprintf(out, "   note: %s\n", note)
	}
	fmt.Fprintf(out, "   expected: %s\n   result: %s in %v\n", w.Expected, verdict(w.OK), w.Took.Round(time.Millisecond))
}

func printDemoStats(ctx context.Context, out io.Writer, mesh *demo.Mesh) {
	stats := mesh.Stats(ctx)
	fmt.Fprintln(out, "\nack statistics (agentkit counters of each demo agent):")
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	cols := []agentkit.Outcome{agentkit.OutcomeAck, agentkit.OutcomeNak, agentkit.OutcomeTerm, agentkit.OutcomeReply,
		agentkit.OutcomeLateReply, agentkit.OutcomeInvalid, agentkit.OutcomeExpired, agentkit.OutcomePanic}
	fmt.Fprint(tw, "agent\t")
	for _, c := range cols {
		fmt.Fprintf(tw, "%s\t", c)
	}
	fmt.Fprintln(tw)
	for _, s := range stats {
		fmt.Fprintf(tw, "%s\t", s.Agent)
		for _, c := range cols {
			fmt.Fprintf(tw, "%d\t", s.Outcomes[c])
		}
		fmt.Fprintln(tw)
	}
	tw.Flush()
	fmt.Fprintln(out, "\nper agent and priority (the server's consumer info):")
	tw = tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "agent\tpriority\tdeliveries\tredelivered now\tack pending\tpending\t")
	for _, s := range stats {
		ps := slices.Clone(s.Priorities)
		for _, p := range ps {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t\n", s.Agent, p.Priority, p.Delivered, p.Redelivered, p.AckPending, p.Pending)
		}
	}
	tw.Flush()
	fmt.Fprintln(out, "(the hung executor is not an agentkit runtime: its deliveries show only in the consumer info)")
}

// indentWriter prefixes every line written through it.
type indentWriter struct {
	w      io.Writer
	prefix string
	mid    bool
}

func (iw *indentWriter) Write(p []byte) (int, error) {
	for i, c := range p {
		if !iw.mid {
			if _, err := io.WriteString(iw.w, iw.prefix); err != nil {
				return i, err
			}
			iw.mid = true
		}
		if _, err := iw.w.Write([]byte{c}); err != nil {
			return i, err
		}
		if c == '\n' {
			iw.mid = false
		}
	}
	return len(p), nil
}
