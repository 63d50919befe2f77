package wire_test

import (
	"bytes"
	"testing"

	"github.com/agentmesh-io/agentmesh/agentkit/wire"
)

// FuzzDecode checks that Decode never panics and that whatever it accepts
// encodes, and decodes back to the same envelope: the re-encoded bytes are
// identical. It is seeded with the schema's example envelopes.
func FuzzDecode(f *testing.F) {
	for _, b := range wire.SchemaExamples(f) {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		e, err := wire.Decode(data)
		if err != nil {
			if e != nil {
				t.Fatalf("Decode returned %+v with error %v", e, err)
			}
			return
		}
		first, err := e.Encode()
		if err != nil {
			t.Fatalf("Decode accepted %q but Encode fails: %v", data, err)
		}
		again, err := wire.Decode(first)
		if err != nil {
			t.Fatalf("Decode(Encode(x)) fails: %v\ninput:   %q\nencoded: %s", err, data, first)
		}
		second, err := again.Encode()
		if err != nil {
			t.Fatalf("Encode(Decode(Encode(x))) fails: %v\nencoded: %s", err, first)
		}
		if !bytes.Equal(first, second) {
			t.Fatalf("round trip changed the envelope\ninput:  %q\nfirst:  %s\nsecond: %s", data, first, second)
		}
	})
}
