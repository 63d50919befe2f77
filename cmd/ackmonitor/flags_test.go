package main

import (
	"bytes"
	"strings"
	"testing"
)

// Both binaries share one flag and environment convention: double-dash
// flags (single-dash still accepted), NATS_URL and NATS_CREDS over the
// AGENTMESH_* environment, flags over both.
func TestConfigure_Convention(t *testing.T) {
	t.Setenv("AGENTMESH_NATS_URLS", "nats://agentmesh-env:4222")
	t.Setenv("NATS_URL", "nats://a:4222, nats://b:4222")
	t.Setenv("NATS_CREDS", "/tmp/x.creds")
	cfg, err := configure(nil)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(cfg.NATS.URLs, ",") != "nats://a:4222,nats://b:4222" || cfg.NATS.Creds != "/tmp/x.creds" {
		t.Fatalf("NATS_URL/NATS_CREDS ignored: %v %q", cfg.NATS.URLs, cfg.NATS.Creds)
	}
	for _, args := range [][]string{
		{"--nats", "nats://c:1", "--http", "127.0.0.1:9", "--pinned-ttl", "3s", "--replicas=1"},
		{"-nats", "nats://c:1", "-http=127.0.0.1:9", "-pinned-ttl", "3s", "-replicas", "1"},
	} {
		cfg, err := configure(args)
		if err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		if cfg.NATS.URLs[0] != "nats://c:1" || cfg.Monitor.HTTPAddr != "127.0.0.1:9" || cfg.Monitor.PinnedTTL.String() != "3s" || cfg.Mesh.Replicas != 1 {
			t.Fatalf("%v: flags not applied: %+v %+v", args, cfg.NATS, cfg.Monitor)
		}
	}
}

// --help says what the monitor does and that failover needs PostgreSQL;
// --version prints the build information; both exit 0.
func TestConfigure_HelpAndVersion(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want []string
	}{
		{[]string{"--help"}, []string{"records every", "escalates", "--postgres", "PostgreSQL ledger", "--http", "NATS_URL"}},
		{[]string{"-help"}, []string{"records every"}},
		{[]string{"--version"}, []string{"ackmonitor ", " go1."}},
		{[]string{"-version"}, []string{"ackmonitor "}},
	} {
		var out, stderr bytes.Buffer
		_, err := configureTo(tt.args, &out)
		if code := exitCode(err, &stderr); code != 0 {
			t.Errorf("%v: exit %d: %s", tt.args, code, stderr.String())
		}
		for _, w := range tt.want {
			if !strings.Contains(out.String(), w) {
				t.Errorf("%v: output lacks %q:\n%s", tt.args, w, out.String())
			}
		}
	}
}
