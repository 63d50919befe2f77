// Package monitorsvc runs the ack monitor the way both binaries do: the
// ledger the configuration names, the monitor's settings from the shared
// configuration, and the monitor with its dashboard, API and /metrics
// over HTTP. It lives here, beside the binaries, so that package config,
// which agents import too, links no database driver.
package monitorsvc

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/agentmesh-io/agentmesh/ackmonitor"
	"github.com/agentmesh-io/agentmesh/ackmonitor/store"
	"github.com/agentmesh-io/agentmesh/config"
)

// MonitorConfig returns the ack monitor's configuration for the mesh c
// describes, with the ledger st and logger log. Both binaries (agentmesh
// demo/up and ackmonitor) build the monitor from it, so one file and one
// set of AGENTMESH_* variables configure both. Thresholds are percent in
// c and fractions in ackmonitor.
func MonitorConfig(c *config.Config, st store.Store, log *slog.Logger) (ackmonitor.Config, error) {
	scheme, err := c.Scheme()
	if err != nil {
		return ackmonitor.Config{}, err
	}
	m, a := c.Monitor, c.Monitor.Alerts
	return ackmonitor.Config{
		Store: st, Scheme: scheme, MonitorID: m.ID, Logger: log, Replicas: c.Mesh.Replicas,
		Window: m.Window, PinnedTTL: m.PinnedTTL, DefaultDirector: m.DefaultDirector,
		EscalateTerminated: m.EscalateTerminated, UnavailableFor: m.UnavailableFor, StalePendingAfter: m.StalePendingAfter,
		FollowUpAttempts: m.FollowUpAttempts,
		Thresholds: ackmonitor.Thresholds{AckWarning: a.AckRateWarning / 100, AckCritical: a.AckRateCritical / 100,
			TimeoutWarning: a.TimeoutRateWarning / 100, TimeoutCritical: a.TimeoutRateCritical / 100,
			InvalidWarning: a.InvalidRateWarning / 100, InvalidCritical: a.InvalidRateCritical / 100,
			MinSamples: int64(m.MinSamples), MeshMinSamples: int64(m.MeshMinSamples)},
	}, nil
}

// OpenLedger opens the monitor's ledger: PostgreSQL when
// monitor.postgres_dsn is set, else SQLite in the data directory dir (see
// [OpenSQLite]). The caller closes it.
func OpenLedger(ctx context.Context, c *config.Config, dir string) (store.Store, error) {
	if c.Monitor.PostgresDSN != "" {
		return store.OpenPostgres(ctx, c.Monitor.PostgresDSN)
	}
	return OpenSQLite(ctx, dir)
}

// OpenSQLite opens the SQLite ledger of the data directory dir: the file
// store.SQLiteFile inside it, dir created (0755) if needed. A dir that is
// an existing file is opened as the ledger, because earlier versions
// created the ledger there when the directory did not exist.
func OpenSQLite(ctx context.Context, dir string) (store.Store, error) {
	path := filepath.Join(dir, store.SQLiteFile)
	if fi, err := os.Stat(dir); err == nil && !fi.IsDir() {
		path = dir
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("monitor data directory: %w", err)
	}
	return store.OpenSQLite(ctx, path)
}
