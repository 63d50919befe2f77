package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/agentmesh-io/agentmesh/cmd/internal/monitorsvc"
	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"
)

func (a *app) upCmd() *cobra.Command {
	var dataDir, listen string
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Run an embedded NATS server with JetStream (and the ack monitor) for development",
		Long: `up runs a single NATS server with JetStream in this process, storing in a data
directory that survives restarts (--data, else dev.data_dir, else
<user cache dir>/agentmesh), and the ack monitor with its dashboard (monitor.http_addr; its ledger in
<data>/ackmonitor unless monitor.data_dir or monitor.postgres_dsn is set). It prints the client URL and runs until SIGINT or SIGTERM, then
stops the monitor and shuts the server down cleanly.

A monitor.http_addr set in the configuration or AGENTMESH_MONITOR_HTTP_ADDR
must be free. The default, 127.0.0.1:8281, falls back to a free port,
printed, when something else holds it. Either way up writes
the dashboard's URL to <data>/` + monitorURLFile + `, where agentmesh stats
finds it. A second up on the same data directory fails, naming the first:
the directory is locked (<data>/` + dataLockFile + `) while up runs.` + exitCodesHelp,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if listen == "" {
				listen = a.cfg.Dev.Listen
			}
			if dataDir == "" {
				dataDir = a.cfg.Dev.DataDir
			}
			return a.runUp(cmd.Context(), dataDir, listen)
		},
	}
	cmd.Flags().StringVar(&dataDir, "data", "", "JetStream store directory (default: dev.data_dir or <user cache dir>/agentmesh)")
	cmd.Flags().StringVar(&listen, "listen", "", "client address host:port (default: dev.listen, 127.0.0.1:4222)")
	return cmd
}

func (a *app) runUp(ctx context.Context, dataDir, listen string) error {
	dir, err := devDataDir(dataDir)
	if err != nil {
		return err
	}
	release, err := lockDataDir(dir)
	if err != nil {
		return err
	}
	defer release()
	srv, err := startEmbedded(dir, listen)
	if err != nil {
		return err
	}
	defer srv.WaitForShutdown()
	defer srv.Shutdown()
	fmt.Fprintf(a.stdout, "NATS server with JetStream: %s\nstore: %s\n", srv.ClientURL(), dir)
	nc, err := nats.Connect(srv.ClientURL(), nats.Name("agentmesh-up-monitor"))
	if err != nil {
		return err
	}
	defer nc.Close()
	monDir := a.cfg.Monitor.DataDir
	if monDir == "" {
		monDir = filepath.Join(dir, "ackmonitor")
	}
	octx, cancel := context.WithTimeout(ctx, 30*time.Second)
	st, err := monitorsvc.OpenLedger(octx, a.cfg, monDir)
	cancel()
	if err != nil {
		return fmt.Errorf("ack monitor: %w", err)
	}
	mon, err := startMonitor(ctx, a.cfg, nc, st, a.cfg.Monitor.HTTPAddr, !httpAddrExplicit(a.cfg), a.cfg.Monitor.DefaultDirector,
		slog.New(slog.NewTextHandler(a.stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err != nil {
		return fmt.Errorf("ack monitor: %w", err)
	}
	defer mon.stop()
	fmt.Fprintf(a.stdout, "ack monitor dashboard: %s\n", mon.dashboard)
	base := strings.TrimSuffix(mon.dashboard, "/")
	if err := writeMonitorURL(dir, base); err != nil {
		return fmt.Errorf("ack monitor: %w", err)
	}
	defer removeMonitorURL(dir, base)
	if mon.fellBack {
		fmt.Fprintf(a.stdout, "  (monitor.http_addr %s is taken; agentmesh stats finds this one through %s, or pass --monitor %s)\n",
			a.cfg.Monitor.HTTPAddr, filepath.Join(dir, monitorURLFile), base)
	}
	fmt.Fprintf(a.stdout, "export NATS_URL=%s\nCtrl-C to stop\n", srv.ClientURL())
	<-ctx.Done()
	fmt.Fprintln(a.stdout, "shutting down")
	mon.stop()
	removeMonitorURL(dir, base)
	dctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := nc.FlushWithContext(dctx); err == nil {
		nc.Drain()
	}
	return nil
}

// monitorURLFile, in the data directory of up, holds the base URL of the
// dashboard up serves while it runs, for agentmesh stats.
const monitorURLFile = "ackmonitor.url"

func writeMonitorURL(dir, base string) error {
	return os.WriteFile(filepath.Join(dir, monitorURLFile), []byte(base+"\n"), 0o644)
}

// removeMonitorURL removes the file, unless it no longer names base.
func removeMonitorURL(dir, base string) {
	path := filepath.Join(dir, monitorURLFile)
	if b, err := os.ReadFile(path); err == nil && strings.TrimSpace(string(b)) == base {
		os.Remove(path)
	}
}

// runningMonitorURL returns the dashboard URL a running up wrote into its
// data directory dir, or "".
func runningMonitorURL(dir string) string {
	b, err := os.ReadFile(filepath.Join(dir, monitorURLFile))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}
