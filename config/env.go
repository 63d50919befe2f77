package config

import (
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"time"
)

// EnvVar is one environment override: the variable and the field it sets.
type EnvVar struct {
	// Name is the environment variable, e.g. AGENTMESH_MESH_PREFIX.
	Name string
	// Field is the YAML path of the field it sets, e.g. mesh.prefix.
	Field string
}

var durationType = reflect.TypeFor[time.Duration]()

// EnvVars lists every environment override, in field order.
func EnvVars() []EnvVar {
	var out []EnvVar
	walk(reflect.ValueOf(Default()).Elem(), "", func(path string, _ reflect.Value) {
		out = append(out, EnvVar{Name: envName(path), Field: path})
	})
	return out
}

// envName turns a YAML path into its environment variable.
func envName(path string) string {
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(path, ".", "_"))
}

// walk calls leaf for every leaf field of the struct v with its YAML path.
func walk(v reflect.Value, prefix string, leaf func(path string, f reflect.Value)) {
	t := v.Type()
	for i := range t.NumField() {
		sf := t.Field(i)
		name, _, _ := strings.Cut(sf.Tag.Get("yaml"), ",")
		if name == "" || name == "-" {
			continue
		}
		path := name
		if prefix != "" {
			path = prefix + "." + name
		}
		f := v.Field(i)
		if f.Kind() == reflect.Struct && f.Type() != durationType {
			walk(f, path, leaf)
			continue
		}
		leaf(path, f)
	}
}

// ApplyEnv overlays the AGENTMESH_* variables lookup finds on c. A value
// that does not parse is a [*FieldError] naming the variable.
func (c *Config) ApplyEnv(lookup func(string) (string, bool)) error {
	var err error
	walk(reflect.ValueOf(c).Elem(), "", func(path string, f reflect.Value) {
		if err != nil {
			return
		}
		name := envName(path)
		s, ok := lookup(name)
		if !ok {
			return
		}
		if perr := setFromString(f, s); perr != nil {
			err = &FieldError{Field: path, Value: s, Reason: fmt.Sprintf("from %s: %v", name, perr)}
		}
	})
	return err
}

// setFromString parses s into the leaf field f.
func setFromString(f reflect.Value, s string) error {
	s = strings.TrimSpace(s)
	switch {
	case f.Type() == durationType:
		d, err := time.ParseDuration(s)
		if err != nil {
			return err
		}
		f.SetInt(int64(d))
	case f.Kind() == reflect.String:
		f.SetString(s)
	case f.Kind() == reflect.Int:
		n, err := strconv.Atoi(s)
		if err != nil {
			return err
		}
		f.SetInt(int64(n))
	case f.Kind() == reflect.Float64:
		x, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return err
		}
		f.SetFloat(x)
	case f.Kind() == reflect.Bool:
		b, err := strconv.ParseBool(s)
		if err != nil {
			return err
		}
		f.SetBool(b)
	case f.Kind() == reflect.Slice:
		var parts []string
		for p := range strings.SplitSeq(s, ",") {
			if p = strings.TrimSpace(p); p != "" {
				parts = append(parts, p)
			}
		}
		out := reflect.MakeSlice(f.Type(), len(parts), len(parts))
		for i, p := range parts {
			if err := setFromString(out.Index(i), p); err != nil {
				return err
			}
		}
		f.Set(out)
	default:
		return fmt.Errorf("unsupported field type %s", f.Type())
	}
	return nil
}
