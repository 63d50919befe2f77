package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agentmesh-io/agentmesh/ackmonitor/store"
	"github.com/agentmesh-io/agentmesh/cmd/internal/monitorsvc"
	"github.com/agentmesh-io/agentmesh/config"
)

// monitorHandle is a running ack monitor as the CLI sees it.
type monitorHandle struct {
	// running says a monitor is consuming the mesh's events, so
	// escalations will reach the director.
	running bool
	// dashboard is the monitor's HTTP address ("" when none).
	dashboard string
	// fellBack says httpAddr was taken and the dashboard listens on a
	// free port instead.
	fellBack bool
	stop     func()
}

// ErrHTTPAddrInUse is a monitor.http_addr set explicitly that another
// process listens on.
var ErrHTTPAddrInUse = errors.New("address taken")

// httpAddrExplicit reports whether monitor.http_addr was set (file,
// environment) rather than left at its default, which alone may fall back
// to a free port.
func httpAddrExplicit(cfg *config.Config) bool {
	return cfg.Monitor.HTTPAddr != defaultHTTPAddr()
}

// defaultHTTPAddr is monitor.http_addr's default; tests replace it so the
// fallback can be shown on a port they hold rather than a fixed one.
var defaultHTTPAddr = func() string { return config.Default().Monitor.HTTPAddr }

// startMonitor starts the ack monitor (package ackmonitor) over nc: its
// ledger st (which it closes when it stops, or fails to start), its
// dashboard, API and /metrics on httpAddr, and director as the default
// escalation target. A taken httpAddr is an error naming it unless
// fallback is set, when the dashboard takes a free port of 127.0.0.1
// instead (monitorHandle.fellBack). It returns once
// the monitor has provisioned its streams and consumers; stop ends
// everything it started.
func startMonitor(ctx context.Context, cfg *config.Config, nc *nats.Conn, st store.Store, httpAddr string, fallback bool, director string, log *slog.Logger) (monitorHandle, error) {
	mcfg, err := monitorsvc.MonitorConfig(cfg, st, log)
	if err != nil {
		st.Close()
		return monitorHandle{}, err
	}
	mcfg.DefaultDirector = director
	ln, err := net.Listen("tcp", httpAddr)
	fellBack := false
	switch {
	case err != nil && !fallback:
		st.Close()
		return monitorHandle{}, fmt.Errorf("dashboard: monitor.http_addr %s: %w (%w; set another with AGENTMESH_MONITOR_HTTP_ADDR or monitor.http_addr)", httpAddr, ErrHTTPAddrInUse, err)
	case err != nil:
		if ln, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			st.Close()
			return monitorHandle{}, err
		}
		fellBack = true
	}
	svc, err := monitorsvc.Start(nc, mcfg, ln, log)
	if err != nil {
		st.Close()
		return monitorHandle{}, err
	}
	var once sync.Once
	stop := func() {
		once.Do(func() {
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := svc.Stop(sctx); err != nil {
				log.Warn("ack monitor", "err", err)
			}
			st.Close()
		})
	}
	octx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	select {
	case <-svc.Ready():
	case <-svc.Done():
		err := svc.Err()
		stop()
		return monitorHandle{}, err
	case <-octx.Done():
		stop()
		return monitorHandle{}, fmt.Errorf("ack monitor not ready: %w", octx.Err())
	}
	return monitorHandle{running: true, dashboard: "http://" + svc.Addr() + "/", fellBack: fellBack, stop: stop}, nil
}
