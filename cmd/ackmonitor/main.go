// Command ackmonitor runs the agentmesh ack monitor: it records every send
// and consumer event of the mesh in the ack ledger (SQLite in the data
// directory, or PostgreSQL), computes ack/NACK/timeout rates, raises
// alerts, dead-letters and escalates exhausted messages, and serves a
// dashboard, a JSON API and Prometheus metrics.
//
// It reads the configuration shared with the agentmesh CLI (package
// config) the way the CLI does: defaults < --config FILE < AGENTMESH_*
// environment < NATS_URL / NATS_CREDS < flags.
//
//	ackmonitor --nats nats://localhost:4222 --data ./data --http 127.0.0.1:8281
//
// Instances that should fail over to each other share a PostgreSQL ledger
// (--postgres): on SQLite each has its own.
//
// Exit codes: 0 success (and --help, --version), 1 failure, 2 usage error
// (a bad flag or an invalid configuration).
package main

import (
	"cmp"
	"context"
	"errors"
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
	"github.com/spf13/pflag"

	"github.com/agentmesh-io/agentmesh/cmd/internal/buildinfo"
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

// errVersion ends a run that printed the version.
var errVersion = errors.New("version printed")

// exitCode reports err on stderr and returns the exit code: 0 for none and
// for --help and --version (already printed), 2 for a usage error, else 1.
func exitCode(err error, stderr io.Writer) int {
	if err == nil || errors.Is(err, pflag.ErrHelp) || errors.Is(err, errVersion) {
		return 0
	}
	fmt.Fprintln(stderr, "ackmonitor:", err)
	var ue *usageError
	if errors.As(err, &ue) {
		fmt.Fprintln(stderr, "Run 'ackmonitor --help' for usage.")
		return 2
	}
	if errors.Is(err, config.ErrInvalid) {
		return 2
	}
	return 1
}

func run(args []string) error { return runTo(args, os.Stdout, os.Stderr) }

// runTo is run printing --help and --version to stdout and logging to
// stderr.
func runTo(args []string, stdout, stderr io.Writer) error {
	cfg, err := configureTo(args, stdout)
	if err != nil {
		return err
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(cfg.Monitor.LogLevel)); err != nil {
		return err
	}
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: level}))
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
	sqlite := cfg.Monitor.PostgresDSN == ""
	if sqlite {
		log.Info("ledger: SQLite, this instance's own; instances that fail over to each other need a shared PostgreSQL ledger (--postgres)", "dir", dataDir)
	}

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
		return fmt.Errorf("http (--http, monitor.http_addr %s): %w", cfg.Monitor.HTTPAddr, err)
	}
	svc, err := monitorsvc.Start(nc, mcfg, ln, log)
	if err != nil {
		return err
	}
	// A standby on SQLite serves a ledger no active instance writes to:
	// say so once, when the active instance would have taken over.
	var standbyCheck <-chan time.Time
	if sqlite {
		t := time.NewTimer(2 * cfg.Monitor.PinnedTTL)
		defer t.Stop()
		standbyCheck = t.C
	}
wait:
	for {
		select {
		case <-ctx.Done():
			break wait
		case <-svc.Done():
			break wait
		case <-standbyCheck:
			standbyCheck = nil
			if !svc.Active() {
				log.Warn("standby on a SQLite ledger: another instance is active and its ledger is not shared, so this one's dashboard and API show none of its figures, and on failover it starts from an empty ledger; give every instance the same --postgres DSN")
			}
		}
	}
	shutCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	runErr := svc.Stop(shutCtx)
	if err := nc.Drain(); err != nil {
		log.Warn("nats drain", "err", err)
	}
	return runErr
}

const usageHead = `ackmonitor watches an agentmesh mesh on NATS JetStream: it records every
send and every ack, NAK, timeout and exhausted delivery in its ledger,
computes ack, NACK and timeout rates per agent and priority over a sliding
window, raises alerts, dead-letters exhausted messages to MESH_DLQ and
escalates them to the sender's director, and serves a dashboard, a JSON API
(/api/v1) and Prometheus metrics (/metrics) on --http.

Several instances may run for failover: one is active, the others stand by
and take over after --pinned-ttl. They must share the PostgreSQL ledger
(--postgres); on the default SQLite ledger each instance has its own, and a
standby's dashboard shows none of the active instance's figures.

Configuration: defaults < --config FILE (YAML, shared with the agentmesh CLI)
< AGENTMESH_* environment < NATS_URL / NATS_CREDS < flags. Single-dash long
flags (-http) are accepted too.

Usage: ackmonitor [flags]

Flags:
`

const usageTail = `
Exit codes: 0 success (and --help, --version), 1 failure, 2 usage error
(a bad flag or an invalid configuration).
`

// configure loads the shared configuration (the file of --config or
// $AGENTMESH_CONFIG, then the AGENTMESH_* environment, then NATS_URL and
// NATS_CREDS like the agentmesh CLI; see package config and
// deploy/agentmesh.example.yaml) and applies the flags given on top.
// --help and --version print to stdout and return pflag.ErrHelp or
// errVersion.
func configure(args []string) (*config.Config, error) { return configureTo(args, os.Stdout) }

// configureTo is configure printing --help and --version to stdout.
func configureTo(args []string, stdout io.Writer) (*config.Config, error) {
	fs := pflag.NewFlagSet("ackmonitor", pflag.ContinueOnError)
	fs.SetOutput(stdout)
	fs.Usage = func() {
		fmt.Fprint(stdout, usageHead)
		fmt.Fprint(stdout, fs.FlagUsages())
		fmt.Fprint(stdout, usageTail)
	}
	path := fs.String("config", os.Getenv("AGENTMESH_CONFIG"), "configuration file, YAML [$AGENTMESH_CONFIG]")
	version := fs.Bool("version", false, "print the version and exit")
	// The flags override the configuration; their defaults are only shown.
	d := config.Default()
	fs.String("nats", strings.Join(d.NATS.URLs, ","), "NATS server URL(s), comma separated (nats.urls) [$NATS_URL, $AGENTMESH_NATS_URLS]")
	fs.String("creds", "", "NATS credentials file: JWT creds or an nkey seed file such as auth/ackmonitor.nk (nats.creds) [$NATS_CREDS, $AGENTMESH_NATS_CREDS]")
	fs.String("data", "./data", "directory of the SQLite ledger, created if needed; not shared between instances (monitor.data_dir) [$AGENTMESH_MONITOR_DATA_DIR]")
	fs.String("postgres", "", "PostgreSQL DSN; the ledger lives there instead of SQLite, shared by every instance (monitor.postgres_dsn) [$AGENTMESH_MONITOR_POSTGRES_DSN]")
	fs.String("http", d.Monitor.HTTPAddr, "dashboard, API and /metrics address (monitor.http_addr) [$AGENTMESH_MONITOR_HTTP_ADDR]")
	fs.String("default-director", d.Monitor.DefaultDirector, "director of senders without one in the registry (monitor.default_director)")
	fs.String("prefix", d.Mesh.Prefix, "subject prefix of the mesh (mesh.prefix) [$AGENTMESH_MESH_PREFIX]")
	fs.String("id", d.Monitor.ID, "monitor id: escalation sender and consumer prefix (monitor.id)")
	fs.Int("replicas", d.Mesh.Replicas, "replicas of the streams the monitor creates (mesh.replicas)")
	fs.Duration("window", d.Monitor.Window, "sliding window of rates and alerts (monitor.window)")
	fs.Int("min-samples", d.Monitor.MinSamples, "resolved messages before an agent's rates can alert (monitor.min_samples)")
	fs.Duration("pinned-ttl", d.Monitor.PinnedTTL, "failover time between monitor instances (monitor.pinned_ttl)")
	fs.Bool("escalate-terminated", false, "also escalate terminated messages (monitor.escalate_terminated)")
	fs.String("log-level", d.Monitor.LogLevel, "debug, info, warn or error (monitor.log_level)")
	if err := fs.Parse(doubleDash(fs, args)); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return nil, err
		}
		return nil, &usageError{err}
	}
	if *version {
		fmt.Fprintln(stdout, buildinfo.Line("ackmonitor"))
		return nil, errVersion
	}
	if fs.NArg() > 0 {
		return nil, &usageError{fmt.Errorf("unexpected arguments %q (see --help)", fs.Args())}
	}
	cfg, err := config.Read(*path) // validated once the flags are applied
	if err != nil {
		return nil, err
	}
	if u := os.Getenv("NATS_URL"); u != "" {
		cfg.NATS.URLs = splitURLs(u)
	}
	if c := os.Getenv("NATS_CREDS"); c != "" {
		cfg.NATS.Creds = c
	}
	var ferr error
	fs.Visit(func(f *pflag.Flag) {
		v := f.Value.String()
		m := &cfg.Monitor
		var err error
		switch f.Name {
		case "nats":
			cfg.NATS.URLs = splitURLs(v)
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
		case "replicas":
			cfg.Mesh.Replicas, err = fs.GetInt(f.Name)
		case "min-samples":
			m.MinSamples, err = fs.GetInt(f.Name)
		case "window":
			m.Window, err = fs.GetDuration(f.Name)
		case "pinned-ttl":
			m.PinnedTTL, err = fs.GetDuration(f.Name)
		case "escalate-terminated":
			m.EscalateTerminated, err = fs.GetBool(f.Name)
		}
		ferr = cmp.Or(ferr, err)
	})
	if ferr != nil {
		return nil, &usageError{ferr}
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return cfg, nil
}

// doubleDash rewrites the single-dash long flags of fs ("-http :8281",
// "-data=x") as double-dash ones, so the flags written for the standard
// library's flag package keep working. Everything after "--" is left as is.
func doubleDash(fs *pflag.FlagSet, args []string) []string {
	out := make([]string, 0, len(args))
	for i, a := range args {
		if a == "--" {
			return append(out, args[i:]...)
		}
		if len(a) > 2 && a[0] == '-' && a[1] != '-' {
			name, _, _ := strings.Cut(a[1:], "=")
			if fs.Lookup(name) != nil || name == "help" {
				a = "-" + a
			}
		}
		out = append(out, a)
	}
	return out
}

func splitURLs(s string) []string {
	var out []string
	for u := range strings.SplitSeq(s, ",") {
		if u = strings.TrimSpace(u); u != "" {
			out = append(out, u)
		}
	}
	return out
}
