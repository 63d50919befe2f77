package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// version and --version print the build information, even with an
// invalid configuration.
func TestVersion(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	os.WriteFile(bad, []byte("mesh:\n  prefix: Team-A\n"), 0o600)
	t.Setenv("AGENTMESH_CONFIG", bad)
	for _, args := range [][]string{{"version"}, {"--version"}} {
		code, out, errOut := cli(t, args...)
		if code != exitOK || !strings.HasPrefix(out, "agentmesh ") || !strings.Contains(out, " go1.") {
			t.Errorf("%v: exit %d, stdout %q, stderr %q", args, code, out, errOut)
		}
	}
}
