// Command ackmonitor runs the agentmesh ack monitor: it records every send
// and consumer event of the mesh in the ack ledger (SQLite in the data
// directory, or PostgreSQL), computes ack/NACK/timeout rates, raises
// alerts, dead-letters and escalates exhausted messages, and serves a
// dashboard, a JSON API and Prometheus metrics.
//
// Every flag has an AGENTMESH_* environment variable; flags win.
//
//	ackmonitor -nats nats://localhost:4222 -data ./data -http :8222
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agentmesh-io/agentmesh/ackmonitor"
	"github.com/agentmesh-io/agentmesh/ackmonitor/store"
	"github.com/agentmesh-io/agentmesh/subjects"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "ackmonitor:", err)
		os.Exit(1)
	}
}

func env(name, def string) string {
	if v, ok := os.LookupEnv(name); ok {
		return v
	}
	return def
}

func envDur(name string, def time.Duration) time.Duration {
	if d, err := time.ParseDuration(os.Getenv(name)); err == nil {
		return d
	}
	return def
}

func envInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil {
		return n
	}
	return def
}

func run(args []string) error {
	fs := flag.NewFlagSet("ackmonitor", flag.ContinueOnError)
	natsURL := fs.String("nats", env("AGENTMESH_NATS_URL", nats.DefaultURL), "NATS server URL(s), comma separated (AGENTMESH_NATS_URL)")
	creds := fs.String("creds", env("AGENTMESH_NATS_CREDS", ""), "NATS credentials file (AGENTMESH_NATS_CREDS)")
	dataDir := fs.String("data", env("AGENTMESH_DATA_DIR", "./data"), "data directory for the SQLite ledger (AGENTMESH_DATA_DIR)")
	dsn := fs.String("postgres", env("AGENTMESH_POSTGRES_DSN", ""), "PostgreSQL DSN; when set the ledger lives there instead of SQLite (AGENTMESH_POSTGRES_DSN)")
	httpAddr := fs.String("http", env("AGENTMESH_HTTP_ADDR", ":8222"), "HTTP listen address for the dashboard, API and /metrics (AGENTMESH_HTTP_ADDR)")
	director := fs.String("default-director", env("AGENTMESH_DEFAULT_DIRECTOR", "director"), "director for senders without one in the registry (AGENTMESH_DEFAULT_DIRECTOR)")
	prefix := fs.String("prefix", env("AGENTMESH_PREFIX", subjects.DefaultPrefix), "subject prefix of the mesh (AGENTMESH_PREFIX)")
	id := fs.String("id", env("AGENTMESH_MONITOR_ID", "ackmonitor"), "monitor id: escalation sender and consumer prefix (AGENTMESH_MONITOR_ID)")
	replicas := fs.Int("replicas", envInt("AGENTMESH_REPLICAS", 1), "replicas of the streams the monitor creates (AGENTMESH_REPLICAS)")
	window := fs.Duration("window", envDur("AGENTMESH_WINDOW", 5*time.Minute), "sliding window of rates and alerts (AGENTMESH_WINDOW)")
	minSamples := fs.Int("min-samples", envInt("AGENTMESH_MIN_SAMPLES", 20), "resolved messages needed before an agent's rates alert (AGENTMESH_MIN_SAMPLES)")
	pinTTL := fs.Duration("pinned-ttl", envDur("AGENTMESH_PINNED_TTL", 10*time.Second), "failover time between monitor instances (AGENTMESH_PINNED_TTL)")
	escTerm := fs.Bool("escalate-terminated", env("AGENTMESH_ESCALATE_TERMINATED", "") == "true", "also escalate terminated messages (AGENTMESH_ESCALATE_TERMINATED)")
	logLevel := fs.String("log-level", env("AGENTMESH_LOG_LEVEL", "info"), "debug, info, warn or error (AGENTMESH_LOG_LEVEL)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return err
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	scheme, err := subjects.New(*prefix)
	if err != nil {
		return err
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	var st store.Store
	openCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	if *dsn != "" {
		st, err = store.OpenPostgres(openCtx, *dsn)
	} else {
		st, err = store.OpenSQLite(openCtx, *dataDir)
	}
	cancel()
	if err != nil {
		return err
	}
	defer st.Close()

	opts := []nats.Option{nats.Name("agentmesh-ackmonitor-" + *id), nats.MaxReconnects(-1), nats.ReconnectWait(time.Second),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) { log.Warn("nats disconnected", "err", err) }),
		nats.ReconnectHandler(func(nc *nats.Conn) { log.Info("nats reconnected", "url", nc.ConnectedUrl()) }),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { log.Warn("nats async error", "err", err) })}
	if *creds != "" {
		opts = append(opts, nats.UserCredentials(*creds))
	}
	nc, err := nats.Connect(*natsURL, opts...)
	if err != nil {
		return fmt.Errorf("connect %s: %w", *natsURL, err)
	}
	defer nc.Close()

	mon, err := ackmonitor.New(nc, ackmonitor.Config{
		Store: st, Scheme: scheme, MonitorID: *id, Logger: log, Replicas: *replicas, Window: *window,
		PinnedTTL: *pinTTL, DefaultDirector: *director, EscalateTerminated: *escTerm,
		Thresholds: ackmonitor.Thresholds{MinSamples: int64(*minSamples)},
	})
	if err != nil {
		return err
	}
	srv := &http.Server{Addr: *httpAddr, Handler: mon.Handler(), ReadHeaderTimeout: 10 * time.Second}
	httpErr := make(chan error, 1)
	go func() {
		log.Info("http listening", "addr", *httpAddr)
		if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
			httpErr <- err
			stop()
		}
		close(httpErr)
	}()
	runErr := mon.Run(ctx)
	if errors.Is(runErr, context.Canceled) {
		runErr = nil // stopped by a signal while provisioning
	}
	shutCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutCtx); err != nil {
		log.Warn("http shutdown", "err", err)
	}
	if err := <-httpErr; err != nil {
		return fmt.Errorf("http: %w", err)
	}
	if err := nc.Drain(); err != nil {
		log.Warn("nats drain", "err", err)
	}
	return runErr
}
