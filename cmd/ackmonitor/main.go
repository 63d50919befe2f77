// Command ackmonitor runs the agentmesh ack monitor: it records every send
// and consumer event of the mesh in the ack ledger (SQLite in the data
// directory, or PostgreSQL), computes ack/NACK/timeout rates, raises
// alerts, dead-letters and escalates exhausted messages, and serves a
// dashboard, a JSON API and Prometheus metrics.
//
// It reads the configuration shared with the agentmesh CLI (package
// config): defaults < -config FILE < AGENTMESH_* environment < flags.
//
//	ackmonitor -nats nats://localhost:4222 -data ./data -http :8222
//
// Exit codes: 0 success (and -help), 1 failure, 2 usage error (a bad flag
// or an invalid configuration).
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agentmesh-io/agentmesh/cmd/internal/monitorsvc"
	"github.com/agentmesh-io/agentmesh/config"
)

func main() {
	os.Exit(exitCode(run(os.Args[1:]), os.Stderr))
}

// usageError is a bad flag or configuration: exit code 2.
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

// exitCode reports err on stderr and returns the exit code: 0 for none and
// for -help (the usage is already printed), 2 for a usage error, else 1.
func exitCode(err error, stderr io.Writer) int {
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return 0
	}
	fmt.Fprintln(stderr, "ackmonitor:", err)
	var ue *usageError
	if errors.As(err, &ue) || errors.Is(err, config.ErrInvalid) {
		return 2
	}
	return 1
}

func run(args []string) error {
	cfg, err := configure(args)
	if err != nil {
		return err
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(cfg.Monitor.LogLevel)); err != nil {
		return err
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	dataDir := cmp.Or(cfg.Monitor.DataDir, "./data")
	openCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	st, err := monitorsvc.OpenLedger(openCtx, cfg, dataDir)
	cancel()
	if err != nil {
		return err
	}
	defer st.Close()

	cfg.NATS.Name = cmp.Or(cfg.NATS.Name, "agentmesh-ackmonitor-"+cfg.Monitor.ID)
	nc, err := cfg.NATS.Connect(ctx,
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) { log.Warn("nats disconnected", "err", err) }),
		nats.ReconnectHandler(func(nc *nats.Conn) { log.Info("nats reconnected", "url", nc.ConnectedUrl()) }),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { log.Warn("nats async error", "err", err) }))
	if err != nil {
		return err
	}
	defer nc.Close()

	mcfg, err := monitorsvc.MonitorConfig(cfg, st, log)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cfg.Monitor.HTTPAddr)
	if err != nil {
		return fmt.Errorf("http: %w", err)
	}
	svc, err := monitorsvc.Start(nc, mcfg, ln, log)
	if err != nil {
		return err
	}
	select {
	case <-ctx.Done():
	case <-svc.Done():
	}
	shutCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	runErr := svc.Stop(shutCtx)
	if err := nc.Drain(); err != nil {
		log.Warn("nats drain", "err", err)
	}
	return runErr
}

// configure loads the shared configuration (the file of -config or
// $AGENTMESH_CONFIG, then the AGENTMESH_* environment; see package config
// and deploy/agentmesh.example.yaml) and applies the flags given on top.
func configure(args []string) (*config.Config, error) {
	fs := flag.NewFlagSet("ackmonitor", flag.ContinueOnError)
	path := fs.String("config", os.Getenv("AGENTMESH_CONFIG"), "configuration file, YAML (AGENTMESH_CONFIG)")
	// The flags override the configuration; their defaults are only shown.
	d := config.Default()
	fs.String("nats", strings.Join(d.NATS.URLs, ","), "NATS server URL(s), comma separated (nats.urls, AGENTMESH_NATS_URLS)")
	fs.String("creds", "", "NATS credentials file: JWT creds or an nkey seed file such as auth/ackmonitor.nk (nats.creds, AGENTMESH_NATS_CREDS)")
	fs.String("data", "./data", "directory of the SQLite ledger, created if needed (monitor.data_dir, AGENTMESH_MONITOR_DATA_DIR)")
	fs.String("postgres", "", "PostgreSQL DSN; the ledger lives there instead of SQLite (monitor.postgres_dsn, AGENTMESH_MONITOR_POSTGRES_DSN)")
	fs.String("http", d.Monitor.HTTPAddr, "dashboard, API and /metrics address (monitor.http_addr, AGENTMESH_MONITOR_HTTP_ADDR)")
	fs.String("default-director", d.Monitor.DefaultDirector, "director of senders without one in the registry (monitor.default_director)")
	fs.String("prefix", d.Mesh.Prefix, "subject prefix of the mesh (mesh.prefix, AGENTMESH_MESH_PREFIX)")
	fs.String("id", d.Monitor.ID, "monitor id: escalation sender and consumer prefix (monitor.id)")
	fs.Int("replicas", d.Mesh.Replicas, "replicas of the streams the monitor creates (mesh.replicas)")
	fs.Duration("window", d.Monitor.Window, "sliding window of rates and alerts (monitor.window)")
	fs.Int("min-samples", d.Monitor.MinSamples, "resolved messages before an agent's rates can alert (monitor.min_samples)")
	fs.Duration("pinned-ttl", d.Monitor.PinnedTTL, "failover time between monitor instances (monitor.pinned_ttl)")
	fs.Bool("escalate-terminated", false, "also escalate terminated messages (monitor.escalate_terminated)")
	fs.String("log-level", d.Monitor.LogLevel, "debug, info, warn or error (monitor.log_level)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, err
		}
		return nil, &usageError{err} // the flag package printed it and the usage
	}
	if fs.NArg() > 0 {
		fs.Usage()
		return nil, &usageError{fmt.Errorf("unexpected arguments %q", fs.Args())}
	}
	cfg, err := config.Read(*path) // validated once the flags are applied
	if err != nil {
		return nil, err
	}
	fs.Visit(func(f *flag.Flag) {
		v := f.Value.String()
		m := &cfg.Monitor
		switch f.Name {
		case "nats":
			cfg.NATS.URLs = strings.Split(v, ",")
		case "creds":
			cfg.NATS.Creds = v
		case "data":
			m.DataDir = v
		case "postgres":
			m.PostgresDSN = v
		case "http":
			m.HTTPAddr = v
		case "default-director":
			m.DefaultDirector = v
		case "prefix":
			cfg.Mesh.Prefix = v
		case "id":
			m.ID = v
		case "log-level":
			m.LogLevel = v
		default: // typed flags: read back through the flag's getter
			switch g := f.Value.(flag.Getter).Get().(type) {
			case int:
				if f.Name == "replicas" {
					cfg.Mesh.Replicas = g
				} else {
					m.MinSamples = g
				}
			case time.Duration:
				if f.Name == "window" {
					m.Window = g
				} else {
					m.PinnedTTL = g
				}
			case bool:
				m.EscalateTerminated = g
			}
		}
	})
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return cfg, nil
}
