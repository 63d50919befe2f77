//go:build unix

package main

import (
	"errors"
	"os"
	"syscall"
)

// errLocked is a lock another open file holds.
var errLocked = errors.New("locked")

// lockFile takes an exclusive lock on f without waiting.
func lockFile(f *os.File) error {
	err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	if errors.Is(err, syscall.EWOULDBLOCK) {
		return errLocked
	}
	return err
}

func unlockFile(f *os.File) { syscall.Flock(int(f.Fd()), syscall.LOCK_UN) }
