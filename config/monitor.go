package config

import (
	"log/slog"

	"github.com/agentmesh-io/agentmesh/ackmonitor"
	"github.com/agentmesh-io/agentmesh/ackmonitor/store"
)

// AckMonitor returns the ack monitor's configuration for this mesh, with
// the ledger st and logger log. Both binaries (agentmesh demo/up and
// ackmonitor) build the monitor from it, so one file and one set of
// AGENTMESH_* variables configure both. Thresholds are percent here and
// fractions in ackmonitor.
func (c *Config) AckMonitor(st store.Store, log *slog.Logger) (ackmonitor.Config, error) {
	scheme, err := c.Scheme()
	if err != nil {
		return ackmonitor.Config{}, err
	}
	m, a := c.Monitor, c.Monitor.Alerts
	return ackmonitor.Config{
		Store: st, Scheme: scheme, MonitorID: m.ID, Logger: log, Replicas: c.Mesh.Replicas,
		Window: m.Window, PinnedTTL: m.PinnedTTL, DefaultDirector: m.DefaultDirector,
		EscalateTerminated: m.EscalateTerminated, UnavailableFor: m.UnavailableFor,
		Thresholds: ackmonitor.Thresholds{AckWarning: a.AckRateWarning / 100, AckCritical: a.AckRateCritical / 100,
			TimeoutWarning: a.TimeoutRateWarning / 100, TimeoutCritical: a.TimeoutRateCritical / 100,
			MinSamples: int64(m.MinSamples)},
	}, nil
}
