package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// startEmbedded starts a single-node JetStream server storing in dir and
// listening on listen ("host:port"; port -1 or 0 picks a free one). The
// caller shuts it down.
func startEmbedded(dir, listen string) (*server.Server, error) {
	host, portStr, err := net.SplitHostPort(listen)
	if err != nil {
		return nil, fmt.Errorf("embedded server: listen %q: %w", listen, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return nil, fmt.Errorf("embedded server: port %q: %w", portStr, err)
	}
	if port == 0 {
		port = -1
	}
	if port > 0 {
		// The server only logs a listen error (and we run it without
		// logs): check the address first, so a taken port fails at once.
		l, err := net.Listen("tcp", listen)
		if err != nil {
			return nil, fmt.Errorf("embedded server: %w", err)
		}
		l.Close()
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("embedded server: %w", err)
	}
	s, err := server.NewServer(&server.Options{
		ServerName: "agentmesh-dev",
		Host:       host,
		Port:       port,
		JetStream:  true,
		StoreDir:   dir,
		NoSigs:     true,
		NoLog:      true,
	})
	if err != nil {
		return nil, fmt.Errorf("embedded server: %w", err)
	}
	go s.Start()
	if !s.ReadyForConnections(15 * time.Second) {
		s.Shutdown()
		return nil, errors.New("embedded server: not ready for connections after 15s")
	}
	return s, nil
}

// devDataDir is the data directory of the dev stack: dir if set, else
// <user cache dir>/agentmesh.
func devDataDir(dir string) (string, error) {
	if dir != "" {
		return dir, nil
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("no data directory: %w (use --data)", err)
	}
	return filepath.Join(cache, "agentmesh"), nil
}
