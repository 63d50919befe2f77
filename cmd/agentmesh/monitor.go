package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agentmesh-io/agentmesh/ackmonitor"
	"github.com/agentmesh-io/agentmesh/ackmonitor/store"
	"github.com/agentmesh-io/agentmesh/config"
)

// monitorHandle is a running ack monitor as the CLI sees it.
type monitorHandle struct {
	// running says a monitor is consuming the mesh's events, so
	// escalations will reach the director.
	running bool
	// dashboard is the monitor's HTTP address ("" when none).
	dashboard string
	stop      func()
}

// startMonitor starts the ack monitor (package ackmonitor) over nc: its
// ledger st (which it closes when it stops, or fails to start), its
// dashboard, API and /metrics on httpAddr (a free port when that one is
// taken), and director as the default escalation target. It returns once
// the monitor has provisioned its streams and consumers; stop ends
// everything it started.
func startMonitor(ctx context.Context, cfg *config.Config, nc *nats.Conn, st store.Store, httpAddr, director string, log *slog.Logger) (monitorHandle, error) {
	octx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	mcfg, err := cfg.AckMonitor(st, log)
	if err != nil {
		st.Close()
		return monitorHandle{}, err
	}
	mcfg.DefaultDirector = director
	mon, err := ackmonitor.New(nc, mcfg)
	if err != nil {
		st.Close()
		return monitorHandle{}, err
	}
	ln, err := net.Listen("tcp", httpAddr)
	if err != nil {
		if ln, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			st.Close()
			return monitorHandle{}, err
		}
	}
	srv := &http.Server{Handler: mon.Handler(), ReadHeaderTimeout: 10 * time.Second}
	rctx, rcancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	runErr := make(chan error, 1)
	wg.Go(func() { runErr <- mon.Run(rctx) })
	wg.Go(func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Warn("monitor http", "err", err)
		}
	})
	var once sync.Once
	stop := func() {
		once.Do(func() {
			rcancel()
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			srv.Shutdown(sctx)
			wg.Wait()
			st.Close()
		})
	}
	select {
	case <-mon.Ready():
	case err := <-runErr:
		stop()
		return monitorHandle{}, fmt.Errorf("ack monitor: %w", err)
	case <-octx.Done():
		stop()
		return monitorHandle{}, fmt.Errorf("ack monitor not ready: %w", octx.Err())
	}
	return monitorHandle{running: true, dashboard: "http://" + ln.Addr().String() + "/", stop: stop}, nil
}
