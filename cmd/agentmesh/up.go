package main

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
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
stops the monitor and shuts the server down cleanly.` + exitCodesHelp,
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
	mon, err := startMonitor(ctx, a.cfg, nc, st, a.cfg.Monitor.HTTPAddr, a.cfg.Monitor.DefaultDirector,
		slog.New(slog.NewTextHandler(a.stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err != nil {
		return fmt.Errorf("ack monitor: %w", err)
	}
	if mon.dashboard != "" {
		fmt.Fprintf(a.stdout, "ack monitor dashboard: %s\n", mon.dashboard)
	} else {
		fmt.Fprintln(a.stdout, "ack monitor: not running")
	}
	fmt.Fprintf(a.stdout, "export NATS_URL=%s\nCtrl-C to stop\n", srv.ClientURL())
	<-ctx.Done()
	fmt.Fprintln(a.stdout, "shutting down")
	mon.stop()
	dctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := nc.FlushWithContext(dctx); err == nil {
		nc.Drain()
	}
	return nil
}
