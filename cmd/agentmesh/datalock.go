package main

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// ErrDataDirInUse is a data directory another agentmesh up holds.
var ErrDataDirInUse = errors.New("data directory in use")

// dataLockFile, in the data directory of up, is locked while up runs: two
// servers on one JetStream store would corrupt it. It names its holder.
const dataLockFile = "agentmesh-up.lock"

// lockDataDir takes the data directory dir (created if needed) for this
// process until release is called, or fails with ErrDataDirInUse naming
// the holder. The lock is the operating system's (flock), so it goes with
// a process that dies; the file stays behind.
func lockDataDir(dir string) (release func(), err error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("data directory: %w", err)
	}
	path := filepath.Join(dir, dataLockFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("data directory lock: %w", err)
	}
	if err := lockFile(f); err != nil {
		holder, _ := os.ReadFile(path)
		f.Close()
		if errors.Is(err, errLocked) {
			return nil, fmt.Errorf("%w: %s is used by another agentmesh up (%s); stop that one or pass another --data",
				ErrDataDirInUse, dir, cmp.Or(strings.TrimSpace(string(holder)), "holder unknown"))
		}
		return nil, fmt.Errorf("data directory lock %s: %w", path, err)
	}
	host, _ := os.Hostname()
	f.Truncate(0)
	fmt.Fprintf(f, "pid %d on %s, since %s\n", os.Getpid(), host, time.Now().Format(time.RFC3339))
	return func() {
		unlockFile(f)
		f.Close()
	}, nil
}
