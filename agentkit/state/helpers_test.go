package state_test

import (
	"context"
	"encoding/json"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/agentmesh-io/agentmesh/internal/natstest"
)

// mesh is one embedded JetStream server of a test.
type mesh struct {
	t *testing.T
	s *server.Server
}

func newMesh(t *testing.T) *mesh {
	t.Helper()
	return &mesh{t: t, s: natstest.RunServer(t)}
}

// conn opens a new connection to m's server, closed at the test's end.
func (m *mesh) conn() *nats.Conn { return natstest.Connect(m.t, m.s) }

// ctx returns a context that ends with the test, or after 30s.
func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

var eventually = natstest.Eventually

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("marshal %T: %v", v, err)
	}
	return b
}

// checkKeys fails unless the JSON object b has exactly the given keys.
func checkKeys(t *testing.T, b []byte, want ...string) {
	t.Helper()
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(b, &obj); err != nil {
		t.Fatalf("not a JSON object: %s: %v", b, err)
	}
	got := slices.Sorted(maps.Keys(obj))
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("keys of %s\n got %v\nwant %v", b, got, want)
	}
}

// subObject returns the member key of the JSON object b (the first element
// if it is an array).
func subObject(t *testing.T, b []byte, key string) []byte {
	t.Helper()
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(b, &obj); err != nil {
		t.Fatalf("not a JSON object: %s: %v", b, err)
	}
	v, ok := obj[key]
	if !ok {
		t.Fatalf("no %q in %s", key, b)
	}
	var arr []json.RawMessage
	if json.Unmarshal(v, &arr) == nil {
		if len(arr) == 0 {
			t.Fatalf("%q is empty in %s", key, b)
		}
		return arr[0]
	}
	return v
}
