//go:build !unix

package main

import (
	"errors"
	"os"
)

// errLocked is a lock another open file holds.
var errLocked = errors.New("locked")

// lockFile does not lock where flock is missing: two ups on one data
// directory are not detected there.
func lockFile(*os.File) error { return nil }

func unlockFile(*os.File) {}
