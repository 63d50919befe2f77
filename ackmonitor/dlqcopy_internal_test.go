package ackmonitor

import (
	"fmt"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/agentmesh-io/agentmesh/dlq"
	"github.com/agentmesh-io/agentmesh/internal/bound"
)

// A copy of headers that cannot all be copied keeps ours, drops what
// nats.go would refuse to send and the largest of the rest until the
// headers fit, and names what it dropped.
func TestDeadLetterMsg_Bounds(t *testing.T) {
	t.Parallel()
	orig := nats.Header{"Bad Key": {"v"}, "Nats-Expected-Last-Sequence": {"7"}, "Mesh-Dlq-Status": {"ACK"},
		"Mesh-Action": {"work"}}
	for i := range 40 { // 2,000 to 3,950 bytes each: 119 KB in all
		orig.Set(fmt.Sprintf("X-Big-%02d", i), strings.Repeat("v", 2000+50*i))
	}
	ours := nats.Header{"Mesh-Dlq-Status": {"NACK"}, "Mesh-Dlq-Reason": {strings.Repeat("r", 5000)}}
	msg := deadLetterMsg("mesh.dlq.w.normal.s", orig, []byte("body"), ours, 1<<20)
	if n := headerBytes(msg.Header); n > maxHeaderBytes {
		t.Fatalf("headers of %d bytes", n)
	}
	if got := msg.Header.Get("Mesh-Dlq-Status"); got != "NACK" || len(msg.Header.Values("Mesh-Dlq-Status")) != 1 {
		t.Errorf("status %v: the original's header named like ours must not stay", msg.Header.Values("Mesh-Dlq-Status"))
	}
	if r := msg.Header.Get("Mesh-Dlq-Reason"); len(r) > maxHeaderValue || !strings.HasSuffix(r, bound.TruncatedMark) {
		t.Errorf("reason of %d bytes", len(r))
	}
	if msg.Header.Get("Mesh-Action") != "work" || msg.Header.Get("Nats-Expected-Last-Sequence") != "" || string(msg.Data) != "body" {
		t.Errorf("copy %v %q", msg.Header, msg.Data)
	}
	omitted := msg.Header.Get(dlq.HeaderOmittedHeaders)
	if !strings.Contains(omitted, `"Bad Key"`) || !strings.Contains(omitted, "X-Big-39") || strings.Contains(omitted, "X-Big-00") {
		t.Errorf("omitted %q: want the invalid name and the largest headers, not the smallest", omitted)
	}
	for k := range msg.Header {
		if !validHeaderKey(k) {
			t.Errorf("header %q would make nats.go refuse the copy", k)
		}
	}
}

// A large header value is copied clipped, a large body whole while it fits
// the max payload with the headers, and not at all once it does not.
func TestDeadLetterMsg_LargeValueAndBody(t *testing.T) {
	t.Parallel()
	orig := nats.Header{"X-Huge": {strings.Repeat("h", 100000)}}
	ours := nats.Header{"Mesh-Dlq-Status": {"NACK"}}
	msg := deadLetterMsg("s", orig, make([]byte, 1000), ours, 1<<20)
	if h := msg.Header.Get("X-Huge"); len(h) != maxCopiedValue || !strings.HasSuffix(h, bound.TruncatedMark) {
		t.Errorf("a 100 KB header copied as %d bytes", len(h))
	}
	if len(msg.Data) != 1000 || msg.Header.Get(dlq.HeaderBodyOmitted) != "" {
		t.Errorf("body of %d bytes, omitted %q", len(msg.Data), msg.Header.Get(dlq.HeaderBodyOmitted))
	}
	// Room for ours, not for the original's header too: the header goes.
	msg = deadLetterMsg("s", orig, make([]byte, 1<<20-4000), ours, 1<<20)
	if len(msg.Data) != 1<<20-4000 || msg.Header.Get("X-Huge") != "" || msg.Header.Get(dlq.HeaderOmittedHeaders) != "X-Huge" {
		t.Errorf("body of %d bytes, headers %v", len(msg.Data), msg.Header)
	}
	msg = deadLetterMsg("s", orig, make([]byte, 1<<20-100), ours, 1<<20)
	if len(msg.Data) != 0 || !strings.HasPrefix(msg.Header.Get(dlq.HeaderBodyOmitted), "1048476 bytes") || msg.Header.Get("X-Huge") == "" {
		t.Errorf("body of %d bytes, headers %v", len(msg.Data), msg.Header)
	}
}
