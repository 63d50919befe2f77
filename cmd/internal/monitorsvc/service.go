package monitorsvc

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
)

// Service is a running ack monitor with its dashboard, API and /metrics
// served over HTTP. Its ledger stays the caller's to close.
type Service struct {
	mon    *ackmonitor.Monitor
	srv    *http.Server
	addr   string
	cancel context.CancelFunc
	wg     sync.WaitGroup

	done chan struct{} // closed when Run or the HTTP server ended
	once sync.Once
	mu   sync.Mutex
	err  error // why it ended by itself (nil when Stop ended it)
}

// Start creates the ack monitor over nc with cfg, runs it and serves its
// handler on ln, until [Service.Stop] or until either ends by itself (see
// [Service.Done]). It does not wait for the monitor to provision its
// streams; [Service.Ready] says when it has.
func Start(nc *nats.Conn, cfg ackmonitor.Config, ln net.Listener, log *slog.Logger) (*Service, error) {
	mon, err := ackmonitor.New(nc, cfg)
	if err != nil {
		ln.Close()
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Service{mon: mon, srv: &http.Server{Handler: mon.Handler(), ReadHeaderTimeout: 10 * time.Second},
		addr: ln.Addr().String(), cancel: cancel, done: make(chan struct{})}
	s.wg.Go(func() {
		err := mon.Run(ctx)
		if ctx.Err() == nil { // ended by itself
			s.end(fmt.Errorf("ack monitor: %w", err))
		}
	})
	s.wg.Go(func() {
		log.Info("http listening", "addr", s.addr)
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.end(fmt.Errorf("ack monitor http: %w", err))
		}
	})
	return s, nil
}

// end records why the service ended by itself and closes done, once.
func (s *Service) end(err error) {
	s.mu.Lock()
	if s.err == nil {
		s.err = err
	}
	s.mu.Unlock()
	s.once.Do(func() { close(s.done) })
}

// Addr is the HTTP address the service listens on.
func (s *Service) Addr() string { return s.addr }

// Active reports whether this instance is the active monitor (see
// [ackmonitor.Monitor.Active]); a standby serves its own ledger only.
func (s *Service) Active() bool { return s.mon.Active() }

// Ready is closed once the monitor has provisioned its streams and
// consumers and consumes.
func (s *Service) Ready() <-chan struct{} { return s.mon.Ready() }

// Done is closed when the monitor or its HTTP server ended by itself;
// [Service.Err] says why.
func (s *Service) Done() <-chan struct{} { return s.done }

// Err returns why the service ended by itself, or nil.
func (s *Service) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// Stop shuts the HTTP server down (waiting for requests in progress until
// ctx ends), stops the monitor and waits for both. It returns why the
// service had ended by itself, if it had.
func (s *Service) Stop(ctx context.Context) error {
	shutErr := s.srv.Shutdown(ctx)
	s.cancel()
	s.wg.Wait()
	s.once.Do(func() { close(s.done) })
	if err := s.Err(); err != nil {
		return err
	}
	if shutErr != nil {
		return fmt.Errorf("ack monitor http shutdown: %w", shutErr)
	}
	return nil
}
