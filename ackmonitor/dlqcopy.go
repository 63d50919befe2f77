package ackmonitor

import (
	"cmp"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/nats-io/nats.go"

	"github.com/agentmesh-io/agentmesh/dlq"
	"github.com/agentmesh-io/agentmesh/internal/bound"
)

// Bounds of a dead-letter copy. Its headers hold what peers wrote (the
// original's headers, the TERM reason, the subject), and a copy the
// server refuses is refused at every try: the server takes at most 64 KiB
// of headers, and headers and body within its max payload.
const (
	// maxHeaderValue bounds each Mesh-Dlq-* value and each name of
	// Mesh-Dlq-Omitted-Headers; agentkit's TERM reasons fit in it whole.
	maxHeaderValue = 1024
	// maxCopiedValue bounds each header value copied from the original.
	maxCopiedValue = 4096
	// maxHeaderBytes bounds the copy's encoded headers, below the
	// server's 64 KiB.
	maxHeaderBytes = 60 << 10
)

// validHeaderKey reports whether nats.go publishes a header named k (it
// refuses the whole message otherwise): printable ASCII without
// separators.
func validHeaderKey(k string) bool {
	if k == "" {
		return false
	}
	for i := 0; i < len(k); i++ {
		if c := k[i]; c < 33 || c > 126 || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return true
}

// hasPrefixFold reports whether s starts with prefix, ignoring ASCII case.
func hasPrefixFold(s, prefix string) bool {
	return len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix)
}

// headerBytes is the size of h as nats.go encodes it, or more.
func headerBytes(h nats.Header) int {
	n := len("NATS/1.0\r\n\r\n")
	for k, vs := range h {
		for _, v := range vs {
			n += len(k) + len(v) + len(": \r\n")
		}
	}
	return n
}

// deadLetterMsg returns the copy of an original (its headers and body;
// both nil when the original is gone) on subject with the headers ours
// set. What it takes from the original and ours is bounded, so the server
// can store the copy whatever a peer wrote:
//
//   - every value of ours is clipped to maxHeaderValue;
//   - the original's headers are copied, each value clipped to
//     maxCopiedValue, except JetStream's (Nats-*, e.g. an expected stream
//     or last sequence that holds for the original's stream, not for the
//     dead letters'), headers named like ours, and names nats.go refuses;
//   - the largest of them are left out while the headers would exceed
//     maxHeaderBytes or, with the body, maxPayload;
//   - the body is left out when even ours with it would exceed maxPayload.
//
// What is left out, for size or an invalid name, is named in
// Mesh-Dlq-Omitted-Headers and Mesh-Dlq-Body-Omitted.
func deadLetterMsg(subject string, origHeader nats.Header, body []byte, ours nats.Header, maxPayload int64) *nats.Msg {
	hdr := nats.Header{}
	for k, vs := range ours {
		for _, v := range vs {
			hdr[k] = append(hdr[k], bound.Clip(v, maxHeaderValue))
		}
	}
	// Room kept for the headers naming what is left out.
	reserve := len(dlq.HeaderOmittedHeaders) + len(dlq.HeaderBodyOmitted) + 2*(maxHeaderValue+len(": \r\n"))
	if int64(len(body)+headerBytes(hdr)+reserve) > maxPayload {
		hdr.Set(dlq.HeaderBodyOmitted, strconv.Itoa(len(body))+" bytes, above the server's max payload with the copy's headers")
		body = nil
	}
	budget := int(min(int64(maxHeaderBytes), maxPayload-int64(len(body)))) - reserve
	type copied struct {
		key  string
		size int
	}
	var omitted []string
	var keys []copied
	for k, vs := range origHeader {
		if hasPrefixFold(k, "Nats-") || hasPrefixFold(k, "Mesh-Dlq-") {
			continue
		}
		if !validHeaderKey(k) {
			omitted = append(omitted, strconv.QuoteToASCII(k))
			continue
		}
		size := 0
		for _, v := range vs {
			v = bound.Clip(v, maxCopiedValue)
			hdr[k] = append(hdr[k], v)
			size += len(k) + len(v) + len(": \r\n")
		}
		keys = append(keys, copied{k, size})
	}
	// Largest first, then by name, so the same original always loses the
	// same headers.
	slices.SortFunc(keys, func(a, b copied) int { return cmp.Or(cmp.Compare(b.size, a.size), strings.Compare(a.key, b.key)) })
	total := headerBytes(hdr)
	for _, c := range keys {
		if total <= budget {
			break
		}
		delete(hdr, c.key)
		total -= c.size
		omitted = append(omitted, c.key)
	}
	if len(omitted) > 0 {
		slices.Sort(omitted)
		hdr.Set(dlq.HeaderOmittedHeaders, bound.Clip(strings.Join(omitted, ", "), maxHeaderValue))
	}
	return &nats.Msg{Subject: subject, Header: hdr, Data: body}
}

// envelopeID returns v if an envelope field of agentkit's takes it (at
// most 256 characters, no control character), else "": the escalation
// envelope carries the original's correlation and workflow ids, which its
// sender wrote, and an envelope agentkit refuses could never be sent.
func envelopeID(v string) string {
	if utf8.RuneCountInString(v) > 256 || !utf8.ValidString(v) {
		return ""
	}
	for _, r := range v {
		if unicode.IsControl(r) {
			return ""
		}
	}
	return v
}
