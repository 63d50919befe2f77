// Package jsontest checks the JSON names of wire types in tests: other
// languages read these objects by name, so a renamed field is a broken
// contract even when Go round-trips it.
package jsontest

import (
	"encoding/json"
	"maps"
	"slices"
	"testing"
)

// Marshal returns v as JSON, failing the test if it cannot be encoded.
func Marshal(t testing.TB, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("marshal %T: %v", v, err)
	}
	return b
}

// Keys fails unless the JSON object b has exactly the given keys.
func Keys(t testing.TB, b []byte, want ...string) {
	t.Helper()
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(b, &obj); err != nil {
		t.Fatalf("not a JSON object: %s: %v", b, err)
	}
	got := slices.Sorted(maps.Keys(obj))
	want = slices.Sorted(slices.Values(want))
	if !slices.Equal(got, want) {
		t.Errorf("keys of %s\n got %v\nwant %v", b, got, want)
	}
}

// Member returns the member key of the JSON object b (the first element
// if it is an array).
func Member(t testing.TB, b []byte, key string) []byte {
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
