package schema_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"
)

// TestAjvStrict compiles every schema in Ajv's strict mode (ajv/check.mjs)
// and checks that Ajv gives the verdict this package's validator gives on
// the envelope examples, the envelope edge cases and the payload values.
// It needs Node.js; it skips without it, except in CI (CI=true), where it
// installs Ajv from ajv/package-lock.json.
func TestAjvStrict(t *testing.T) {
	t.Parallel()
	inCI := os.Getenv("CI") == "true"
	need := func(tool string) string {
		p, err := exec.LookPath(tool)
		if err != nil {
			if inCI {
				t.Fatalf("%s is required in CI: %v", tool, err)
			}
			t.Skipf("%s not installed", tool)
		}
		return p
	}
	node := need("node")
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	if _, err := os.Stat(filepath.Join("ajv", "node_modules", "ajv")); err != nil {
		npm := need("npm")
		cmd := exec.CommandContext(ctx, npm, "ci", "--prefix", "ajv", "--no-audit", "--no-fund")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("npm ci --prefix ajv: %v\n%s", err, out)
		}
	}

	// Each document goes to a file, with the verdict of this package's
	// validator, which Ajv must share.
	dir := t.TempDir()
	var args []string
	names := make(map[string]string) // file → case, for the failure message
	add := func(url, name string, data []byte, valid bool) {
		f := filepath.Join(dir, fmt.Sprintf("%04d.json", len(args)))
		if err := os.WriteFile(f, data, 0o600); err != nil {
			t.Fatal(err)
		}
		arg := url + "=" + f
		if !valid {
			arg = "!" + arg
		}
		args = append(args, arg)
		names[f] = name
	}
	for _, sub := range []string{"valid", "invalid"} {
		for name, data := range examples(t, sub, 8, func(string) bool { return true }) {
			add(schemaID, sub+"/"+name, data, validate(t, data) == nil)
		}
	}
	for name, e := range envelopeEdges() {
		data := edgeDoc(t, e)
		add(schemaID, "edge "+name, data, validate(t, data) == nil)
	}
	for def, vals := range payloadValues() {
		url := protocolID + "#/$defs/" + def
		for name, v := range vals {
			data, err := json.Marshal(v)
			if err != nil {
				t.Fatal(err)
			}
			add(url, def+"/"+name, data, validateAt(t, url, data) == nil)
		}
	}
	cmd := exec.CommandContext(ctx, node, append([]string{filepath.Join("ajv", "check.mjs")}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		for i, l := range lines {
			for f, n := range names {
				if strings.Contains(l, f) {
					lines[i] = n + ": " + l
				}
			}
		}
		sort.Strings(lines)
		t.Fatalf("ajv/check.mjs: %v\n%s", err, strings.Join(lines, "\n"))
	}
	if len(args) < 300 {
		t.Errorf("checked %d documents with Ajv, want at least 300", len(args))
	}
}
