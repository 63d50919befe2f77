package main

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/auth"
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
	if f := cons.CachedInfo().Config.FilterSubject; f != "mesh.agent.planner_1.normal.*" {
		t.Fatalf("planner_1_normal filters %q", f)
	}
	cons, err = js.Consumer(context.Background(), "MESH", "planner_1_fanout-bulk")
	if err != nil {
		t.Fatal(err)
	}
	if filters := cons.CachedInfo().Config.FilterSubjects; !slices.Contains(filters, "mesh.topic.findings.normal.*") || !slices.Contains(filters, "mesh.broadcast.batch.*") {
		t.Fatalf("planner_1_fanout-bulk filters %v", filters)
	}
	if code, _, _ := cli(t, "auth", "--out", dir, "bad.id"); code != exitUsage {
		t.Fatalf("bad id: exit %d, want %d", code, exitUsage)
	}
}

// TestAuth_GeneratedCredentialsConnect uses the seed files auth writes:
// the admin's as --creds to provision, an agent's as --creds and as
// nats.nkey_seed to send, on a server with the generated authorization.
func TestAuth_GeneratedCredentialsConnect(t *testing.T) {
	t.Setenv("NATS_URL", "")
	dir := t.TempDir()
	b, err := auth.Generate([]auth.AgentSpec{{ID: "orch_1"}, {ID: "planner_1"}}, auth.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.WriteDir(dir); err != nil {
		t.Fatal(err)
	}
	srv := natstest.RunServer(t, func(o *server.Options) {
		if err := o.ProcessConfigString(b.ServerConfig()); err != nil {
			t.Fatal(err)
		}
	})
	url := srv.ClientURL()
	// As README shows it: the admin key in the directory auth writes to.
	// auth connects before it rewrites the directory.
	regen := t.TempDir()
	admin, err := os.ReadFile(filepath.Join(dir, "admin.nk"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(regen, "admin.nk"), admin, 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := cli(t, "auth", "--out", regen, "--provision", "-s", url, "--creds", filepath.Join(regen, "admin.nk"), "orch_1", "planner_1")
	if code != exitOK || !strings.Contains(out, "provisioned stream MESH") {
		t.Fatalf("auth --provision --creds admin.nk: exit %d: %s %s", code, out, errOut)
	}
	orch := filepath.Join(dir, "orch_1.nk")
	for _, tt := range []struct{ name, env, flag string }{
		{"creds flag", "", "--creds=" + orch},
		{"nkey_seed env", orch, "--creds="},
	} {
		t.Setenv("AGENTMESH_NATS_NKEY_SEED", tt.env)
		code, out, errOut := cli(t, "send", "-s", url, tt.flag, "--from", "orch_1", "--to", "planner_1", "--action", "plan_workflow")
		if code != exitOK || !strings.Contains(out, "message_id=") {
			t.Fatalf("%s: send as orch_1: exit %d: %s %s", tt.name, code, out, errOut)
		}
	}
	opts, err := b.Admin().Credentials.Options()
	if err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(natstest.Connect(t, srv, opts...))
	st, err := js.Stream(context.Background(), "MESH")
	if err != nil {
		t.Fatal(err)
	}
	if n := st.CachedInfo().State.Msgs; n != 2 {
		t.Fatalf("stream MESH holds %d messages, want the 2 sent", n)
	}
}

// TestAuth_ProvisionFollowsConfig: the consumers auth --provision creates
// sample acks at monitor.sample_frequency and deliver by agent.policies, as
// agents configured from the same file make theirs.
func TestAuth_ProvisionFollowsConfig(t *testing.T) {
	t.Parallel()
	srv := natstest.RunServer(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "agentmesh.yaml")
	if err := os.WriteFile(cfg, []byte("monitor:\n  sample_frequency: 50\nagent:\n  policies:\n    normal:\n      max_deliver: 7\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := cli(t, "auth", "--config", cfg, "--out", dir, "--provision", "-s", srv.ClientURL(), "orch_1", "planner_1")
	if code != exitOK {
		t.Fatalf("exit %d: %s %s", code, out, errOut)
	}
	js, _ := jetstream.New(natstest.Connect(t, srv))
	for _, id := range []string{"orch_1", "planner_1"} {
		for _, p := range wire.Priorities {
			name := id + "_" + string(p)
			cons, err := js.Consumer(context.Background(), "MESH", name)
			if err != nil {
				t.Fatal(err)
			}
			cc := cons.CachedInfo().Config
			if cc.SampleFrequency != "50" {
				t.Errorf("%s samples %q, want the configured 50", name, cc.SampleFrequency)
			}
			want := agentkit.DefaultPolicies()[p].MaxDeliver
			if p == wire.PriorityNormal {
				want = 7
			}
			if cc.MaxDeliver != want {
				t.Errorf("%s delivers at most %d times, want %d", name, cc.MaxDeliver, want)
			}
		}
	}
}

// TestAuth_KeepsSeeds: running auth again keeps the seeds in --out, so the
// README's flow (auth --provision with the admin.nk of an earlier run, in
// the same directory, then send as an agent) works on a server that has
// not reloaded; --rotate replaces them and says to reload.
func TestAuth_KeepsSeeds(t *testing.T) {
	t.Setenv("NATS_URL", "")
	t.Setenv("NATS_CREDS", "")
	dir := t.TempDir()
	code, out, errOut := cli(t, "auth", "--out", dir, "orch_1", "planner_1")
	if code != exitOK || !strings.Contains(out, "new server authorization: include") {
		t.Fatalf("first auth: exit %d: %s %s", code, out, errOut)
	}
	conf, err := os.ReadFile(filepath.Join(dir, auth.ServerConfigFile))
	if err != nil {
		t.Fatal(err)
	}
	srv := natstest.RunServer(t, func(o *server.Options) {
		if err := o.ProcessConfigString(string(conf)); err != nil {
			t.Fatal(err)
		}
	})
	url := srv.ClientURL()
	code, out, errOut = cli(t, "auth", "--out", dir, "--provision", "-s", url, "--creds", filepath.Join(dir, "admin.nk"), "orch_1", "planner_1")
	if code != exitOK || !strings.Contains(out, "4 kept, 0 new") || !strings.Contains(out, "unchanged: nothing to reload") {
		t.Fatalf("auth --provision again: exit %d: %s %s", code, out, errOut)
	}
	code, out, errOut = cli(t, "send", "-s", url, "--creds", filepath.Join(dir, "orch_1.nk"), "--from", "orch_1", "--to", "planner_1", "--action", "plan")
	if code != exitOK {
		t.Fatalf("send as orch_1 after auth ran again: exit %d: %s %s", code, out, errOut)
	}
	// A new agent: the others keep their keys, the server must reload.
	code, out, errOut = cli(t, "auth", "--out", dir, "orch_1", "planner_1", "exec_1")
	if code != exitOK || !strings.Contains(out, "4 kept, 1 new") || !strings.Contains(out, "nats-server --signal reload") {
		t.Fatalf("auth with a new agent: exit %d: %s %s", code, out, errOut)
	}
	before, _ := os.ReadFile(filepath.Join(dir, "orch_1.nk"))
	code, out, errOut = cli(t, "auth", "--out", dir, "--rotate", "orch_1", "planner_1", "exec_1")
	after, _ := os.ReadFile(filepath.Join(dir, "orch_1.nk"))
	if code != exitOK || !strings.Contains(out, "0 kept, 5 new") || !strings.Contains(out, "nats-server --signal reload") || string(before) == string(after) {
		t.Fatalf("auth --rotate: exit %d: %s %s", code, out, errOut)
	}
}
