package agentkit_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/agentmesh-io/agentmesh/agentkit"
)

// benchEnvelope returns a direct request with a 512-byte payload, the size
// of a typical task assignment.
func benchEnvelope(b *testing.B) *agentkit.Envelope {
	b.Helper()
	payload := `{"data":"` + strings.Repeat("x", 512-len(`{"data":""}`)) + `"}`
	if len(payload) != 512 {
		b.Fatalf("payload is %d bytes, want 512", len(payload))
	}
	e := agentkit.NewEnvelope(agentkit.TypeRequest, "orchestrator_1", "execute_operation")
	e.ReceiverID = "executor_1"
	e.Priority = agentkit.PriorityHigh
	e.Correlation = agentkit.NewMessageID()
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
		if _, err := agentkit.Decode(data); err != nil {
			b.Fatal(err)
		}
	}
}
