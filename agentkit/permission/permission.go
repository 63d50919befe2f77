// Package permission is the error of a subject the NATS server refused a
// connection's credentials, and the parser of the server's "Permissions
// Violation" reports. It imports nothing of agentmesh, so the runtime
// (agentkit) and the credentials tooling (auth) share one sentinel.
package permission

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/nats-io/nats.go"
)

// ErrDenied is matched (errors.Is) by every [*Error] and by the runtime's
// refused sends: the server refused this connection's credentials a
// subject (publishing as another agent, another agent's consumer, a
// JetStream API call). Retrying cannot help.
var ErrDenied = errors.New("permission denied")

// Error is a server's permissions violation. The server sends "-ERR
// 'Permissions Violation for Publish to "<subject>"'" and drops the
// message; nats.go reports it only to the connection's asynchronous error
// handler and as its last error, never to the publisher.
type Error struct {
	// Op is "publish" or "subscribe".
	Op string
	// Subject is the subject refused; empty when the report named none.
	Subject string
	// Err is the error nats.go reported; it matches
	// nats.ErrPermissionViolation.
	Err error
}

func (e *Error) Error() string {
	return fmt.Sprintf("permission denied: %s to %q", e.Op, e.Subject)
}

// Is reports whether target is [ErrDenied].
func (e *Error) Is(target error) bool { return target == ErrDenied }

// Unwrap returns the nats.go error.
func (e *Error) Unwrap() error { return e.Err }

var violationRe = regexp.MustCompile(`(?i)permissions violation for (publish|subscription) to "([^"]+)"`)

// Parse returns the permissions violation err reports, if it is one
// (errors.Is(err, nats.ErrPermissionViolation)).
func Parse(err error) (*Error, bool) {
	if err == nil || !errors.Is(err, nats.ErrPermissionViolation) {
		return nil, false
	}
	pe := &Error{Op: "publish", Err: err}
	if m := violationRe.FindStringSubmatch(err.Error()); m != nil {
		if strings.EqualFold(m[1], "subscription") {
			pe.Op = "subscribe"
		}
		pe.Subject = m[2]
	}
	return pe, true
}
