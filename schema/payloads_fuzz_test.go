package schema_test

import (
	"encoding/json"
	"errors"
	"math"
	"math/big"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// fuzzBases are, per definition in payloadDefs order, a full valid payload
// as JSON and the paths of its members, sorted so a fuzz input always
// names the same member.
type fuzzBase struct {
	doc   any
	paths [][]string
}

func fuzzBases(tb testing.TB) []fuzzBase {
	all := payloadValues()
	out := make([]fuzzBase, len(payloadDefs))
	for i, d := range payloadDefs {
		b, err := json.Marshal(all[d.def]["base"])
		if err != nil {
			tb.Fatal(err)
		}
		var doc any
		if err := json.Unmarshal(b, &doc); err != nil {
			tb.Fatal(err)
		}
		paths := memberPaths(doc, nil)
		slices.SortFunc(paths, func(a, b []string) int { return strings.Compare(strings.Join(a, "."), strings.Join(b, ".")) })
		out[i] = fuzzBase{doc, paths}
	}
	return out
}

// roundsIntoRange reports whether the number v is one whose value JSON
// Schema compares exactly while encoding/json rounds it to a float64:
// beyond 15 significant digits the two may disagree at a bound.
func roundsIntoRange(v string) bool {
	r, ok := new(big.Rat).SetString(strings.TrimSpace(v))
	if !ok {
		return false
	}
	f, exact := r.Float64()
	return !exact && !math.IsInf(f, 0)
}

// FuzzPayloadSchemasAgree puts an arbitrary JSON value in one member of a
// full payload and checks that the schema and Go (encoding/json and
// Validate) agree.
func FuzzPayloadSchemasAgree(f *testing.F) {
	for _, v := range memberValues {
		f.Add(uint8(0), uint8(0), v)
	}
	for i := range payloadDefs {
		f.Add(uint8(i), uint8(3), `"pending"`)
		f.Add(uint8(i), uint8(1), `1.0000000000000000000001`)
		f.Add(uint8(i), uint8(2), `{"outcome":"partial","type":"api","state":"BUSY"}`)
	}
	bases := fuzzBases(f)
	f.Fuzz(func(t *testing.T, sel, member uint8, v string) {
		if !json.Valid([]byte(v)) {
			return
		}
		d := payloadDefs[int(sel)%len(payloadDefs)]
		base := bases[int(sel)%len(payloadDefs)]
		path := base.paths[int(member)%len(base.paths)]
		data := replaceAt(t, base.doc, path, json.RawMessage(v))
		schemaErr := validateAt(t, protocolID+"#/$defs/"+d.def, data)
		goErr := d.check(data)
		if (schemaErr == nil) == (goErr == nil) {
			return
		}
		var te *json.UnmarshalTypeError
		switch {
		case schemaErr == nil && errors.As(goErr, &te) && strings.HasPrefix(te.Value, "number") && te.Type.Kind() != reflect.String:
			// A number Go cannot hold: written with a fraction or
			// exponent, or beyond a float64, or -0 for an unsigned field.
			return
		case roundsIntoRange(v):
			return
		}
		t.Errorf("%s %s = %s: %s", d.def, strings.Join(path, "."), v, diffMsg(data, schemaErr, goErr))
	})
}
