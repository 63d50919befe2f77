package auth_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/agentmesh-io/agentmesh/auth"
	"github.com/agentmesh-io/agentmesh/internal/natstest"
	"github.com/agentmesh-io/agentmesh/subjects"
)

func TestGenerate_invalid(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		give     []auth.AgentSpec
		opts     auth.Options
		wantName string // the message must name it
	}{
		{name: "no agents", wantName: "no agents"},
		{name: "dot in id", give: []auth.AgentSpec{{ID: "ok"}, {ID: "bad.agent"}}, wantName: "bad.agent"},
		{name: "wildcard id", give: []auth.AgentSpec{{ID: "a*"}}, wantName: "a*"},
		{name: "empty id", give: []auth.AgentSpec{{ID: ""}}, wantName: "agent 0"},
		{name: "duplicate", give: []auth.AgentSpec{{ID: "a"}, {ID: "a"}}, wantName: `"a"`},
		{name: "agent named like the monitor", give: []auth.AgentSpec{{ID: "ackmonitor"}}, wantName: "ackmonitor"},
		{name: "agent named like the admin", give: []auth.AgentSpec{{ID: "ops"}}, opts: auth.Options{AdminName: "ops"}, wantName: "ops"},
		{name: "bad topic", give: []auth.AgentSpec{{ID: "a", Topics: []string{"news>"}}}, wantName: `"a"`},
		{name: "bad account", give: []auth.AgentSpec{{ID: "a"}}, opts: auth.Options{Account: "M.X"}, wantName: "M.X"},
		{name: "monitor is admin", give: []auth.AgentSpec{{ID: "a"}}, opts: auth.Options{MonitorID: "x", AdminName: "x"}, wantName: `"x"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := auth.Generate(tt.give, tt.opts)
			if !errors.Is(err, auth.ErrInvalidSpec) {
				t.Fatalf("err = %v, want ErrInvalidSpec", err)
			}
			if !strings.Contains(err.Error(), tt.wantName) {
				t.Fatalf("err = %q does not name %q", err, tt.wantName)
			}
		})
	}
}

func TestGenerate_permissions(t *testing.T) {
	t.Parallel()
	b := generate(t, []auth.AgentSpec{{ID: "a"}, {ID: "a_high"}}, auth.Options{})
	u, _ := b.User("a")
	for _, s := range u.Permissions.Publish {
		// Exact consumer names: "a_*" would also match agent a_high's
		// consumers ("a_high_normal", ...).
		if strings.Contains(s, "a_*") || strings.HasSuffix(s, ".>") && strings.HasPrefix(s, "$JS.API") {
			t.Errorf("agent a may publish %q, a wildcard over other agents", s)
		}
		if strings.Contains(s, "a_high_") {
			t.Errorf("agent a may publish %q, a subject of agent a_high", s)
		}
	}
	if got := u.Permissions.Subscribe; len(got) != 1 || got[0] != "_INBOX_a.>" {
		t.Errorf("subscribe = %v, want only _INBOX_a.>", got)
	}
	if b.Admin().Permissions != nil {
		t.Error("the admin is restricted")
	}
	if got := len(b.Users); got != 4 {
		t.Errorf("%d users, want 2 agents + monitor + admin", got)
	}
}

func TestBundle_WriteDir(t *testing.T) {
	t.Parallel()
	b := generate(t, []auth.AgentSpec{{ID: "planner"}, {ID: "executor"}}, auth.Options{})
	dir := filepath.Join(t.TempDir(), "auth")
	if err := b.WriteDir(dir); err != nil {
		t.Fatal(err)
	}
	if err := b.WriteDir(dir); err != nil { // rewriting is fine
		t.Fatalf("second WriteDir: %v", err)
	}
	conf, err := os.ReadFile(filepath.Join(dir, auth.ServerConfigFile))
	if err != nil {
		t.Fatal(err)
	}
	if string(conf) != b.ServerConfig() {
		t.Fatal("server-auth.conf differs from ServerConfig()")
	}
	for _, u := range b.Users {
		if strings.Contains(string(conf), string(u.Credentials.Seed)) {
			t.Fatalf("the server config holds %s's seed", u.Name)
		}
		path := filepath.Join(dir, u.Name+auth.CredentialsExt)
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s mode %v, want 0600", path, fi.Mode().Perm())
		}
		c, err := auth.LoadCredentials(path)
		if err != nil {
			t.Fatalf("LoadCredentials(%s): %v", path, err)
		}
		if c.Name != u.Name || c.PublicKey != u.Credentials.PublicKey || string(c.Seed) != string(u.Credentials.Seed) {
			t.Errorf("LoadCredentials(%s) = %s/%s, want %s/%s", path, c.Name, c.PublicKey, u.Name, u.Credentials.PublicKey)
		}
	}

	// A nats-server reads the file (the deploy path: nats-server -c with
	// include), and both loaders of the seed file connect.
	s := natstest.RunServer(t, func(o *server.Options) {
		if err := o.ProcessConfigFile(writeServerConf(t, dir)); err != nil {
			t.Fatalf("ProcessConfigFile: %v", err)
		}
	})
	c, err := auth.LoadCredentials(filepath.Join(dir, "planner.nk"))
	if err != nil {
		t.Fatal(err)
	}
	opts, err := c.Options()
	if err != nil {
		t.Fatal(err)
	}
	nc := natstest.Connect(t, s, opts...)
	if _, err := nc.Request("$JS.API.CONSUMER.INFO.MESH.planner_normal", nil, 5*time.Second); err != nil {
		t.Fatalf("JS API call through the private inbox: %v", err) // answered (not found) through _INBOX_planner
	}
	seedOpt, err := nats.NkeyOptionFromSeed(filepath.Join(dir, "executor.nk"))
	if err != nil {
		t.Fatal(err)
	}
	natstest.Connect(t, s, seedOpt, nats.CustomInboxPrefix(auth.InboxPrefix("executor")))
	if _, err := nats.Connect(s.ClientURL(), nats.UserInfo("planner", "")); err == nil {
		t.Fatal("connected without credentials")
	}

	// SeedFileOptions sets the inbox the file records, and reads the seed
	// at each signature, keeping none: a connection after the file is
	// gone (or rotated) does not sign with the old seed.
	fileOpts, err := auth.SeedFileOptions(filepath.Join(dir, "planner.nk"))
	if err != nil {
		t.Fatal(err)
	}
	nc = natstest.Connect(t, s, fileOpts...)
	if _, err := nc.Request("$JS.API.CONSUMER.INFO.MESH.planner_normal", nil, 5*time.Second); err != nil {
		t.Fatalf("JS API call through the inbox SeedFileOptions set: %v", err)
	}
	if err := os.Remove(filepath.Join(dir, "planner.nk")); err != nil {
		t.Fatal(err)
	}
	if nc, err := nats.Connect(s.ClientURL(), fileOpts...); err == nil {
		nc.Close()
		t.Fatal("connected with the seed of a removed file: SeedFileOptions kept it")
	}
}

// writeServerConf writes a minimal nats-server.conf including the
// generated authorization, as deploy/ would.
func writeServerConf(t *testing.T, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "nats-server.conf")
	conf := "# the test server sets listen and jetstream itself\ninclude \"" + auth.ServerConfigFile + "\"\n"
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestGenerate_scheme(t *testing.T) {
	t.Parallel()
	s, err := subjects.New("lab")
	if err != nil {
		t.Fatal(err)
	}
	b := generate(t, []auth.AgentSpec{{ID: "x"}}, auth.Options{Scheme: s})
	conf := b.ServerConfig()
	for _, want := range []string{`"lab.agent.*.*.x"`, `"$JS.API.CONSUMER.MSG.NEXT.LAB.x_normal"`} {
		if !strings.Contains(conf, want) {
			t.Errorf("config lacks %s", want)
		}
	}
	if strings.Contains(conf, "mesh.") {
		t.Error("config mentions the default prefix")
	}
}

// TestBundle_KeepSeeds: a regenerated bundle keeps the seeds already in
// the directory, so its server config lists the same keys, and gives new
// users new ones.
func TestBundle_KeepSeeds(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	first, err := auth.Generate([]auth.AgentSpec{{ID: "orch_1"}}, auth.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := first.WriteDir(dir); err != nil {
		t.Fatal(err)
	}
	again, err := auth.Generate([]auth.AgentSpec{{ID: "orch_1"}}, auth.Options{})
	if err != nil {
		t.Fatal(err)
	}
	kept, err := again.KeepSeeds(dir)
	if err != nil || len(kept) != 3 {
		t.Fatalf("kept %v (%v), want orch_1, the monitor and the admin", kept, err)
	}
	if again.ServerConfig() != first.ServerConfig() {
		t.Fatal("the server config changed although every seed was kept")
	}
	more, err := auth.Generate([]auth.AgentSpec{{ID: "orch_1"}, {ID: "planner_1"}}, auth.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if kept, err = more.KeepSeeds(dir); err != nil || len(kept) != 3 {
		t.Fatalf("kept %v (%v)", kept, err)
	}
	o1, _ := more.User("orch_1")
	if want, _ := first.User("orch_1"); o1.Credentials.PublicKey != want.Credentials.PublicKey {
		t.Fatal("orch_1's key changed")
	}
	if p, _ := more.User("planner_1"); p.Credentials.PublicKey == "" {
		t.Fatal("planner_1 has no key")
	}
	// A seed file under another user's name is refused.
	orch, _ := os.ReadFile(filepath.Join(dir, "orch_1.nk"))
	if err := os.WriteFile(filepath.Join(dir, "planner_1.nk"), orch, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := more.KeepSeeds(dir); err == nil || !strings.Contains(err.Error(), `"orch_1", not "planner_1"`) {
		t.Fatalf("another user's seed: %v", err)
	}
}
