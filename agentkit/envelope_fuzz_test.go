package agentkit_test

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/agentmesh-io/agentmesh/agentkit"
)

// FuzzDecode checks that Decode never panics and that whatever it accepts
// encodes, and decodes back to the same envelope: the re-encoded bytes are
// identical. It is seeded with the schema's example envelopes.
func FuzzDecode(f *testing.F) {
	var seeds int
	for _, dir := range []string{"valid", "invalid"} {
		paths, err := filepath.Glob(filepath.Join("..", "schema", "testdata", dir, "*.json"))
		if err != nil {
			f.Fatal(err)
		}
		for _, p := range paths {
			b, err := os.ReadFile(p)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(b)
			seeds++
		}
	}
	if seeds < 16 {
		f.Fatalf("found %d seed envelopes under ../schema/testdata, want at least 16", seeds)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		e, err := agentkit.Decode(data)
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
		again, err := agentkit.Decode(first)
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
