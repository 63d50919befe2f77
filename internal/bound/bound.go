// Package bound bounds text a peer controls (subject tokens, headers,
// envelope fields) before it is quoted in a validation error, a TERM reason
// or a log record: a value that would make the server close the connection
// (a control line over 4 KiB) or a dead-letter copy over the header limit
// must never get that far. The wire format, the runtime and the ack monitor
// share it.
package bound

import (
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// MaxQuotedBytes bounds a peer's value quoted in a reason or a log record.
const MaxQuotedBytes = 64

// TruncatedMark ends a value Clip shortened, so a reader can tell.
const TruncatedMark = "…(truncated)"

// Clip returns s cut to at most n bytes, at a rune boundary, ending in
// TruncatedMark when it was cut. Invalid UTF-8 is replaced, so the result
// is always valid UTF-8.
func Clip(s string, n int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if len(s) <= n {
		return s
	}
	cut := max(n-len(TruncatedMark), 0)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + TruncatedMark
}

// Quote returns s as a Go-quoted string for a reason or a log record,
// shortened to MaxQuotedBytes of its content with its full length noted.
func Quote(s string) string {
	if len(s) <= MaxQuotedBytes {
		return strconv.Quote(s)
	}
	return strconv.Quote(Clip(s, MaxQuotedBytes)) + " (" + strconv.Itoa(len(s)) + " bytes)"
}

// HasControl reports whether s holds a control character (C0, DEL or C1),
// which would end or forge a header line if s were a header value.
func HasControl(s string) bool {
	for _, r := range s {
		if unicode.IsControl(r) {
			return true
		}
	}
	return false
}
