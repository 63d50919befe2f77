package agentkit

import (
	"log/slog"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

// Everything a peer controls (subject tokens, headers, envelope fields) is
// bounded before the runtime builds a subject, an object name, a log line
// or a TERM reason from it: a value that would make the server close the
// connection (a control line over 4 KiB) or a dead-letter copy over the
// header limit must never get that far.

// maxReasonBytes bounds a TERM reason, which the broker copies into its
// advisory and the ack monitor into the dead letter's headers.
const maxReasonBytes = 512

// sampledLog writes a burst of records, then at most one per interval,
// each saying how many it left out since the one before: a sender who
// floods an agent with bad input cannot flood its log. The outcomes
// themselves are all counted (Stats, metrics).
type sampledLog struct {
	every      rate.Sometimes
	suppressed atomic.Uint64
}

func newSampledLog() *sampledLog {
	return &sampledLog{every: rate.Sometimes{First: 10, Interval: time.Second}}
}

// record logs msg at warning level with args, unless the sample is spent.
func (l *sampledLog) record(logger *slog.Logger, msg string, args ...any) {
	logged := false
	l.every.Do(func() {
		logged = true
		logger.Warn(msg, append(args, "suppressed", l.suppressed.Swap(0))...)
	})
	if !logged {
		l.suppressed.Add(1)
	}
}
