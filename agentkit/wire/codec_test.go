package wire

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	jsonv2 "github.com/go-json-experiment/json"
)

// SchemaExamples returns the schema's valid and invalid example envelopes
// (../../schema/testdata), the seeds of the envelope fuzz tests. It fails tb
// when there are fewer than 16: the seeds must not silently go missing.
func SchemaExamples(tb testing.TB) [][]byte {
	tb.Helper()
	var out [][]byte
	for _, dir := range []string{"valid", "invalid"} {
		paths, err := filepath.Glob(filepath.Join("..", "..", "schema", "testdata", dir, "*.json"))
		if err != nil {
			tb.Fatal(err)
		}
		for _, p := range paths {
			b, err := os.ReadFile(p)
			if err != nil {
				tb.Fatal(err)
			}
			out = append(out, b)
		}
	}
	if len(out) < 16 {
		tb.Fatalf("found %d example envelopes under ../../schema/testdata, want at least 16", len(out))
	}
	return out
}

// FuzzCodecMatchesJSONv2 checks the envelope's own encoder against JSON
// v2's default struct encoding of the same fields (envelopeFields): for
// whatever JSON v2 decodes into an Envelope, both encoders succeed or both
// fail, with identical bytes. Seeded with the schema's valid and invalid
// examples plus the shapes the omitempty and omitzero rules care about.
func FuzzCodecMatchesJSONv2(f *testing.F) {
	for _, b := range SchemaExamples(f) {
		f.Add(b)
	}
	for _, s := range []string{
		`{}`, `{"acl":"1","message_id":"a\"b\u2028<>&"}`, `{"payload":null}`, `{"payload":{ }}`,
		`{"payload":[1, 2]}`, `{"payload":" "}`, `{"context":""}`, `{"context":[ ]}`, `{"priority":"medium"}`,
		`{"message_type":"ack","priority":"low","timestamp":"2025-08-21T10:30:00.5+02:00"}`,
		`{"timestamp":"9999-12-31T23:59:59.999999999-23:59"}`, `{"ttl_ms":-5}`, `{"requires_ack":true}`,
		`{"metadata":{}}`, `{"metadata":{"b":"1","a":"2"}}`, `{"trace":{}}`, `{"trace":{"span_id":"s"}}`,
		`{"error":{}}`, `{"error":{"code":"BUSY","retryable":true}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var e Envelope
		if jsonv2.Unmarshal(data, &e) != nil {
			return
		}
		got, gotErr := e.AppendJSON(nil)
		want, wantErr := jsonv2.Marshal((*envelopeFields)(&e), jsonv2.Deterministic(true))
		if (gotErr == nil) != (wantErr == nil) {
			t.Fatalf("input %q: codec error %v, JSON v2 error %v", data, gotErr, wantErr)
		}
		if gotErr == nil && !bytes.Equal(got, want) {
			t.Fatalf("input %q encodes differently\ncodec:   %s\nJSON v2: %s", data, got, want)
		}
	})
}

// BenchmarkCodec compares the envelope's own encoder with JSON v2's default
// struct encoding of the same fields, on a request with a 512-byte payload.
func BenchmarkCodec(b *testing.B) {
	e := NewEnvelope(TypeRequest, "orchestrator_1", "execute_operation")
	e.ReceiverID, e.Priority, e.Correlation, e.TaskID = "executor_1", PriorityHigh, NewMessageID(), "t2"
	e.Payload = []byte(`{"data":"` + strings.Repeat("x", 512-11) + `"}`)
	data, err := e.Encode()
	if err != nil {
		b.Fatal(err)
	}
	run := func(name string, f func() error) {
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(len(data)))
			b.ReportAllocs()
			for b.Loop() {
				if err := f(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	run("encode/jsonv2", func() error {
		_, err := jsonv2.Marshal((*envelopeFields)(e), jsonv2.Deterministic(true))
		return err
	})
	run("encode/codec", func() error { _, err := e.AppendJSON(nil); return err })
}
