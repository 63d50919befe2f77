package buildinfo_test

import (
	"strings"
	"testing"

	"github.com/agentmesh-io/agentmesh/cmd/internal/buildinfo"
)

func TestString(t *testing.T) {
	in := buildinfo.Info{Version: "v1.2.3", Revision: "0123456789abcdef", Time: "2026-01-02T03:04:05Z", Modified: true, GoVersion: "go1.25.0"}
	want := "x v1.2.3 (commit 0123456789ab, 2026-01-02T03:04:05Z, modified) go1.25.0"
	if got := in.String("x"); got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
	if got := buildinfo.Line("x"); !strings.HasPrefix(got, "x ") || !strings.Contains(got, "go1.") {
		t.Fatalf("Line = %q", got)
	}
}
