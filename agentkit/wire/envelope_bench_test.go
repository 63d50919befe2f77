package wire_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/agentmesh-io/agentmesh/agentkit/wire"
)

// benchEnvelope returns a direct request with a 512-byte payload, the size
// of a typical task assignment.
func benchEnvelope(b *testing.B) *wire.Envelope {
	b.Helper()
	payload := `{"data":"` + strings.Repeat("x", 512-len(`{"data":""}`)) + `"}`
	if len(payload) != 512 {
		b.Fatalf("payload is %d bytes, want 512", len(payload))
	}
	e := wire.NewEnvelope(wire.TypeRequest, "orchestrator_1", "execute_operation")
	e.ReceiverID = "executor_1"
	e.Priority = wire.PriorityHigh
	e.Correlation = wire.NewMessageID()
	e.WorkflowID = "wf_abc"
	e.TaskID = "t2"
	e.RequiresAck = true
	e.Payload = json.RawMessage(payload)
	return e
}

func BenchmarkEncode(b *testing.B) {
	e := benchEnvelope(b)
	data, err := e.Encode()
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := e.Encode(); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecode(b *testing.B) {
	data, err := benchEnvelope(b).Encode()
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := wire.Decode(data); err != nil {
			b.Fatal(err)
		}
	}
}
