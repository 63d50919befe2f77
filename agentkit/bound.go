package agentkit

import (
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode"
	"unicode/utf8"

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

// maxQuotedBytes bounds a peer's value quoted in a reason or a log record.
const maxQuotedBytes = 64

// truncatedMark ends a value clip shortened.
const truncatedMark = "…(truncated)"

// clip returns s cut to at most n bytes, at a rune boundary, ending in
// truncatedMark when it was cut. Invalid UTF-8 is replaced, so the result
// is always valid UTF-8.
func clip(s string, n int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if len(s) <= n {
		return s
	}
	cut := max(n-len(truncatedMark), 0)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + truncatedMark
}

// quote returns s as a Go-quoted string for a reason or a log record,
// shortened to maxQuotedBytes of its content with its full length noted.
func quote(s string) string {
	if len(s) <= maxQuotedBytes {
		return strconv.Quote(s)
	}
	return strconv.Quote(clip(s, maxQuotedBytes)) + " (" + strconv.Itoa(len(s)) + " bytes)"
}

// hasControl reports whether s holds a control character (C0, DEL or C1),
// which would end or forge a header line if s were a header value.
func hasControl(s string) bool {
	for _, r := range s {
		if unicode.IsControl(r) {
			return true
		}
	}
	return false
}

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
