package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/internal/natstest"
)

func TestAuth_GenerateAndProvision(t *testing.T) {
	srv := natstest.RunServer(t)
	dir := t.TempDir()
	code, out, errOut := cli(t, "auth", "--out", dir, "--provision", "-s", srv.ClientURL(), "orch_1", "planner_1", "--topic", "planner_1=findings")
	if code != exitOK {
		t.Fatalf("exit %d: %s %s", code, out, errOut)
	}
	for _, f := range []string{"server-auth.conf", "orch_1.nk", "planner_1.nk", "ackmonitor.nk", "admin.nk"} {
		st, err := os.Stat(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasSuffix(f, ".nk") && st.Mode().Perm() != 0o600 {
			t.Fatalf("%s mode %v, want 0600", f, st.Mode().Perm())
		}
	}
	js, _ := jetstream.New(natstest.Connect(t, srv))
	cons, err := js.Consumer(context.Background(), "MESH", "planner_1_normal")
	if err != nil {
		t.Fatal(err)
	}
	filters := cons.CachedInfo().Config.FilterSubjects
	if len(filters) != 3 || filters[2] != "mesh.topic.findings.normal.*" {
		t.Fatalf("planner_1_normal filters %v", filters)
	}
	if code, _, _ := cli(t, "auth", "--out", dir, "bad.id"); code != exitUsage {
		t.Fatalf("bad id: exit %d, want %d", code, exitUsage)
	}
}
