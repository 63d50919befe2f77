package config_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/config"
	"github.com/agentmesh-io/agentmesh/internal/natstest"
)

const examplePath = "../deploy/agentmesh.example.yaml"

func noEnv(string) (string, bool) { return "", false }

func envOf(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestDefault_Valid(t *testing.T) {
	t.Parallel()
	if err := config.Default().Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestDefault_PoliciesAreAgentkits(t *testing.T) {
	t.Parallel()
	c := config.Default()
	for p, want := range agentkit.DefaultPolicies() {
		if got := c.Agent.Policy(p); !reflect.DeepEqual(got, want) {
			t.Errorf("%s: got %+v, want %+v", p, got, want)
		}
	}
}

// TestExampleFile_EqualsDefaults keeps deploy/agentmesh.example.yaml from
// drifting: it documents every default, so loading it changes nothing.
func TestExampleFile_EqualsDefaults(t *testing.T) {
	t.Parallel()
	got, err := config.LoadWith(examplePath, noEnv)
	if err != nil {
		t.Fatal(err)
	}
	if want := config.Default(); !reflect.DeepEqual(got, want) {
		t.Fatalf("example file differs from the defaults:\n got %+v\nwant %+v", got, want)
	}
	// And it mentions every setting.
	data, err := os.ReadFile(examplePath)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range config.EnvVars() {
		leaf := v.Field[strings.LastIndexByte(v.Field, '.')+1:]
		if !strings.Contains(string(data), leaf+":") {
			t.Errorf("example file does not show %s", v.Field)
		}
	}
}

// loadYAML loads a configuration file holding doc, without environment.
func loadYAML(t *testing.T, doc string) (*config.Config, error) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	return config.LoadWith(path, noEnv)
}

func TestLoad_FileOverlaysDefaults(t *testing.T) {
	t.Parallel()
	c, err := loadYAML(t, "mesh:\n  prefix: team_a\n  replicas: 3\nagent:\n  policies:\n    high: {backoff: [1s, 2s], max_deliver: 3}\n")
	if err != nil {
		t.Fatal(err)
	}
	if c.Mesh.Prefix != "team_a" || c.Mesh.Replicas != 3 {
		t.Errorf("mesh = %+v", c.Mesh)
	}
	hp := c.Agent.Policy(wire.PriorityHigh)
	if !reflect.DeepEqual(hp.BackOff, []time.Duration{time.Second, 2 * time.Second}) || hp.MaxDeliver != 3 || hp.ProcessingLimit != 5*time.Minute {
		t.Errorf("high policy = %+v", hp)
	}
	if c.NATS.URLs[0] != "nats://127.0.0.1:4222" {
		t.Errorf("untouched default changed: %v", c.NATS.URLs)
	}
}

// max_prefetch 0 is agentkit's fixed buffer: a file can choose it, and
// other policies keep the adaptive default.
func TestLoad_FixedPrefetch(t *testing.T) {
	t.Parallel()
	c, err := loadYAML(t, "agent:\n  policies:\n    low: {prefetch: 4, max_prefetch: 0}\n")
	if err != nil {
		t.Fatal(err)
	}
	if lp := c.Agent.Policy(wire.PriorityLow); lp.Prefetch != 4 || lp.MaxPrefetch != 0 {
		t.Errorf("low policy = %+v, want prefetch 4 and max_prefetch 0", lp)
	}
	if np := c.Agent.Policy(wire.PriorityNormal); np.MaxPrefetch != agentkit.DefaultPolicies()[wire.PriorityNormal].MaxPrefetch {
		t.Errorf("normal policy = %+v, want the default max_prefetch", np)
	}
}

func TestLoad_UnknownKey(t *testing.T) {
	t.Parallel()
	_, err := loadYAML(t, "mesh:\n  prefx: x\n")
	if !errors.Is(err, config.ErrInvalid) || !strings.Contains(err.Error(), "prefx") {
		t.Fatalf("err = %v, want an invalid-config error naming prefx", err)
	}
}

func TestLoad_MissingFile(t *testing.T) {
	t.Parallel()
	if _, err := config.LoadWith(filepath.Join(t.TempDir(), "nope.yaml"), noEnv); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("err = %v", err)
	}
}

type envCase struct {
	env   string
	give  string
	check func(c *config.Config) bool
}

// TestEnv_EveryOverride sets each environment variable and checks the field.
func TestEnv_EveryOverride(t *testing.T) {
	t.Parallel()
	tests := []envCase{
		{"AGENTMESH_NATS_URLS", "nats://a:1, nats://b:2", func(c *config.Config) bool {
			return reflect.DeepEqual(c.NATS.URLs, []string{"nats://a:1", "nats://b:2"})
		}},
		{"AGENTMESH_NATS_CREDS", "/x.creds", func(c *config.Config) bool { return c.NATS.Creds == "/x.creds" }},
		{"AGENTMESH_NATS_NKEY_SEED", "/seed", func(c *config.Config) bool { return c.NATS.NKeySeed == "/seed" }},
		{"AGENTMESH_NATS_USER", "bob", func(c *config.Config) bool { return c.NATS.User == "bob" }},
		{"AGENTMESH_NATS_PASSWORD", "pw", func(c *config.Config) bool { return c.NATS.Password == "pw" }},
		{"AGENTMESH_NATS_TLS_CA", "/ca.pem", func(c *config.Config) bool { return c.NATS.TLS.CA == "/ca.pem" }},
		{"AGENTMESH_NATS_TLS_CERT", "/c.pem", func(c *config.Config) bool { return c.NATS.TLS.Cert == "/c.pem" }},
		{"AGENTMESH_NATS_TLS_KEY", "/k.pem", func(c *config.Config) bool { return c.NATS.TLS.Key == "/k.pem" }},
		{"AGENTMESH_NATS_NAME", "n1", func(c *config.Config) bool { return c.NATS.Name == "n1" }},
		{"AGENTMESH_NATS_CONNECT_TIMEOUT", "2s", func(c *config.Config) bool { return c.NATS.ConnectTimeout == 2*time.Second }},
		{"AGENTMESH_NATS_RECONNECT_WAIT", "1s", func(c *config.Config) bool { return c.NATS.ReconnectWait == time.Second }},
		{"AGENTMESH_NATS_MAX_RECONNECTS", "7", func(c *config.Config) bool { return c.NATS.MaxReconnects == 7 }},
		{"AGENTMESH_MESH_PREFIX", "team_b", func(c *config.Config) bool { return c.Mesh.Prefix == "team_b" }},
		{"AGENTMESH_MESH_REPLICAS", "3", func(c *config.Config) bool { return c.Mesh.Replicas == 3 }},
		{"AGENTMESH_AGENT_CONCURRENCY", "2", func(c *config.Config) bool { return c.Agent.Concurrency == 2 }},
		{"AGENTMESH_AGENT_REQUEST_TIMEOUT", "3s", func(c *config.Config) bool { return c.Agent.RequestTimeout == 3*time.Second }},
		{"AGENTMESH_AGENT_PUBLISH_TIMEOUT", "4s", func(c *config.Config) bool { return c.Agent.PublishTimeout == 4*time.Second }},
		{"AGENTMESH_MONITOR_DATA_DIR", "/d", func(c *config.Config) bool { return c.Monitor.DataDir == "/d" }},
		{"AGENTMESH_MONITOR_POSTGRES_DSN", "postgres://u@h/db", func(c *config.Config) bool { return c.Monitor.PostgresDSN == "postgres://u@h/db" }},
		{"AGENTMESH_MONITOR_HTTP_ADDR", ":9000", func(c *config.Config) bool { return c.Monitor.HTTPAddr == ":9000" }},
		{"AGENTMESH_MONITOR_URL", "http://m:1", func(c *config.Config) bool { return c.Monitor.URL == "http://m:1" }},
		{"AGENTMESH_MONITOR_WINDOW", "1m", func(c *config.Config) bool { return c.Monitor.Window == time.Minute }},
		{"AGENTMESH_MONITOR_MIN_SAMPLES", "50", func(c *config.Config) bool { return c.Monitor.MinSamples == 50 }},
		{"AGENTMESH_MONITOR_MESH_MIN_SAMPLES", "-1", func(c *config.Config) bool { return c.Monitor.MeshMinSamples == -1 }},
		{"AGENTMESH_MONITOR_ALERTS_ACK_RATE_WARNING", "97.5", func(c *config.Config) bool { return c.Monitor.Alerts.AckRateWarning == 97.5 }},
		{"AGENTMESH_MONITOR_ALERTS_ACK_RATE_CRITICAL", "80", func(c *config.Config) bool { return c.Monitor.Alerts.AckRateCritical == 80 }},
		{"AGENTMESH_MONITOR_ALERTS_TIMEOUT_RATE_WARNING", "2", func(c *config.Config) bool { return c.Monitor.Alerts.TimeoutRateWarning == 2 }},
		{"AGENTMESH_MONITOR_ALERTS_TIMEOUT_RATE_CRITICAL", "20", func(c *config.Config) bool { return c.Monitor.Alerts.TimeoutRateCritical == 20 }},
		{"AGENTMESH_MONITOR_ALERTS_INVALID_RATE_WARNING", "3", func(c *config.Config) bool { return c.Monitor.Alerts.InvalidRateWarning == 3 }},
		{"AGENTMESH_MONITOR_ALERTS_INVALID_RATE_CRITICAL", "30", func(c *config.Config) bool { return c.Monitor.Alerts.InvalidRateCritical == 30 }},
		{"AGENTMESH_MONITOR_FOLLOW_UP_ATTEMPTS", "7", func(c *config.Config) bool { return c.Monitor.FollowUpAttempts == 7 }},
		{"AGENTMESH_MONITOR_DEFAULT_DIRECTOR", "boss", func(c *config.Config) bool { return c.Monitor.DefaultDirector == "boss" }},
		{"AGENTMESH_MONITOR_SAMPLE_FREQUENCY", "10", func(c *config.Config) bool { return c.Monitor.SampleFrequency == 10 }},
		{"AGENTMESH_MONITOR_ID", "mon2", func(c *config.Config) bool { return c.Monitor.ID == "mon2" }},
		{"AGENTMESH_MONITOR_PINNED_TTL", "3s", func(c *config.Config) bool { return c.Monitor.PinnedTTL == 3*time.Second }},
		{"AGENTMESH_MONITOR_ESCALATE_TERMINATED", "true", func(c *config.Config) bool { return c.Monitor.EscalateTerminated }},
		{"AGENTMESH_MONITOR_UNAVAILABLE_FOR", "-1s", func(c *config.Config) bool { return c.Monitor.UnavailableFor == -time.Second }},
		{"AGENTMESH_MONITOR_STALE_PENDING_AFTER", "30m", func(c *config.Config) bool { return c.Monitor.StalePendingAfter == 30*time.Minute }},
		{"AGENTMESH_MONITOR_LOG_LEVEL", "debug", func(c *config.Config) bool { return c.Monitor.LogLevel == "debug" }},
		{"AGENTMESH_DEV_DATA_DIR", "/tmp/x", func(c *config.Config) bool { return c.Dev.DataDir == "/tmp/x" }},
		{"AGENTMESH_DEV_LISTEN", "0.0.0.0:4333", func(c *config.Config) bool { return c.Dev.Listen == "0.0.0.0:4333" }},
	}
	// Every field of every priority's policy.
	for _, p := range wire.Priorities {
		up := "AGENTMESH_AGENT_POLICIES_" + strings.ToUpper(string(p))
		tests = append(tests,
			envCase{up + "_BACKOFF", "1s,2s", func(c *config.Config) bool {
				return reflect.DeepEqual(c.Agent.Policy(p).BackOff, []time.Duration{time.Second, 2 * time.Second})
			}},
			envCase{up + "_MAX_DELIVER", "9", func(c *config.Config) bool { return c.Agent.Policy(p).MaxDeliver == 9 }},
			envCase{up + "_PROCESSING_LIMIT", "42s", func(c *config.Config) bool { return c.Agent.Policy(p).ProcessingLimit == 42*time.Second }},
			envCase{up + "_PREFETCH", "3", func(c *config.Config) bool { return c.Agent.Policy(p).Prefetch == 3 }},
			envCase{up + "_MAX_PREFETCH", "7", func(c *config.Config) bool { return c.Agent.Policy(p).MaxPrefetch == 7 }},
			envCase{up + "_MAX_ACK_PENDING", "5", func(c *config.Config) bool { return c.Agent.Policy(p).MaxAckPending == 5 }},
		)
	}
	covered := map[string]bool{}
	for _, tt := range tests {
		covered[tt.env] = true
		t.Run(tt.env, func(t *testing.T) {
			t.Parallel()
			c := config.Default()
			if err := c.ApplyEnv(envOf(map[string]string{tt.env: tt.give})); err != nil {
				t.Fatal(err)
			}
			if !tt.check(c) {
				t.Errorf("%s=%q not applied", tt.env, tt.give)
			}
		})
	}
	for _, v := range config.EnvVars() {
		if !covered[v.Name] {
			t.Errorf("no test for %s (%s)", v.Name, v.Field)
		}
	}
}

func TestEnv_BadValueNamesField(t *testing.T) {
	t.Parallel()
	_, err := config.LoadWith("", envOf(map[string]string{"AGENTMESH_MESH_REPLICAS": "three"}))
	var fe *config.FieldError
	if !errors.As(err, &fe) || fe.Field != "mesh.replicas" || !strings.Contains(err.Error(), "AGENTMESH_MESH_REPLICAS") {
		t.Fatalf("err = %v", err)
	}
}

func TestValidate_BadValues(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		give      func(c *config.Config)
		wantField string
		wantText  string
	}{
		{"prefix upper case", func(c *config.Config) { c.Mesh.Prefix = "Team-A" }, "mesh.prefix", `config: mesh.prefix "Team-A": must be [a-z][a-z0-9_]*`},
		{"replicas", func(c *config.Config) { c.Mesh.Replicas = 4 + 2 }, "mesh.replicas", "config: mesh.replicas 6: must be 1 to 5"},
		{"url scheme", func(c *config.Config) { c.NATS.URLs = []string{"http://x:1"} }, "nats.urls[0]", `"http://x:1"`},
		{"no urls", func(c *config.Config) { c.NATS.URLs = nil }, "nats.urls", "at least one"},
		{"two auths", func(c *config.Config) { c.NATS.Creds, c.NATS.User = "a", "b" }, "nats", "only one"},
		{"password without user", func(c *config.Config) { c.NATS.Password = "x" }, "nats.password", "needs nats.user"},
		{"cert without key", func(c *config.Config) { c.NATS.TLS.Cert = "c" }, "nats.tls.cert", "go together"},
		{"max deliver", func(c *config.Config) { c.Agent.Policies.High.MaxDeliver = 2 }, "agent.policies.high.max_deliver", "config: agent.policies.high.max_deliver 2: must be at least len(backoff) = 4"},
		{"backoff tiny", func(c *config.Config) { c.Agent.Policies.Low.BackOff = []time.Duration{time.Microsecond} }, "agent.policies.low.backoff[0]", "1µs"},
		{"backoff empty", func(c *config.Config) { c.Agent.Policies.Batch.BackOff = nil }, "agent.policies.batch.backoff", "at least one"},
		{"max prefetch", func(c *config.Config) { c.Agent.Policies.Normal.MaxPrefetch = -1 }, "agent.policies.normal.max_prefetch", "must not be negative"},
		{"concurrency", func(c *config.Config) { c.Agent.Concurrency = -1 }, "agent.concurrency", "-1"},
		{"http addr", func(c *config.Config) { c.Monitor.HTTPAddr = "nocolon" }, "monitor.http_addr", `"nocolon"`},
		{"monitor url", func(c *config.Config) { c.Monitor.URL = "ftp://x" }, "monitor.url", "http(s)"},
		{"ack thresholds swapped", func(c *config.Config) { c.Monitor.Alerts.AckRateCritical = 96 }, "monitor.alerts.ack_rate_critical", "96"},
		{"timeout thresholds swapped", func(c *config.Config) { c.Monitor.Alerts.TimeoutRateCritical = 4 }, "monitor.alerts.timeout_rate_critical", "4"},
		{"percentage", func(c *config.Config) { c.Monitor.Alerts.TimeoutRateCritical = 101 }, "monitor.alerts.timeout_rate_critical", "at most 100"},
		{"director", func(c *config.Config) { c.Monitor.DefaultDirector = "a.b" }, "monitor.default_director", `"a.b"`},
		{"sampling", func(c *config.Config) { c.Monitor.SampleFrequency = 101 }, "monitor.sample_frequency", "0 to 100"},
		{"zero ack warning", func(c *config.Config) { c.Monitor.Alerts.AckRateWarning = 0 }, "monitor.alerts.ack_rate_warning", "above 0"},
		{"zero ack critical", func(c *config.Config) { c.Monitor.Alerts.AckRateCritical = 0 }, "monitor.alerts.ack_rate_critical", "above 0"},
		{"zero timeout warning", func(c *config.Config) { c.Monitor.Alerts.TimeoutRateWarning = 0 }, "monitor.alerts.timeout_rate_warning", "above 0"},
		{"zero timeout critical", func(c *config.Config) { c.Monitor.Alerts.TimeoutRateCritical = 0 }, "monitor.alerts.timeout_rate_critical", "above 0"},
		{"negative sampling", func(c *config.Config) { c.Monitor.SampleFrequency = -1 }, "monitor.sample_frequency", "0 to 100"},
		{"window", func(c *config.Config) { c.Monitor.Window = -time.Second }, "monitor.window", "positive"},
		{"stale pending", func(c *config.Config) { c.Monitor.StalePendingAfter = -time.Second }, "monitor.stale_pending_after", "negative"},
		{"dev listen", func(c *config.Config) { c.Dev.Listen = "x" }, "dev.listen", `"x"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := config.Default()
			tt.give(c)
			err := c.Validate()
			if !errors.Is(err, config.ErrInvalid) {
				t.Fatalf("err = %v, want ErrInvalid", err)
			}
			var fe *config.FieldError
			if !errors.As(err, &fe) || fe.Field != tt.wantField {
				t.Fatalf("err = %v, want a FieldError for %s", err, tt.wantField)
			}
			if !strings.Contains(err.Error(), tt.wantText) {
				t.Errorf("err = %q, want it to contain %q", err, tt.wantText)
			}
		})
	}
}

func TestAgentOptions_Apply(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	c, err := config.LoadWith("", envOf(map[string]string{"AGENTMESH_MONITOR_SAMPLE_FREQUENCY": "0"}))
	if err != nil {
		t.Fatal(err)
	}
	c.NATS.URLs = []string{s.ClientURL()}
	c.Mesh.Prefix = "cfgtest"
	c.Agent.Policies.High.BackOff = []time.Duration{time.Second, 3 * time.Second}
	c.Agent.Policies.High.MaxDeliver = 2
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	nc, err := c.NATS.Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	opts, err := c.AgentOptions()
	if err != nil {
		t.Fatal(err)
	}
	a, err := agentkit.New(nc, "cfg_agent", opts...)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer a.Stop()
	info, err := a.ConsumerInfo(ctx, wire.PriorityHigh)
	if err != nil {
		t.Fatal(err)
	}
	if info.Stream != "CFGTEST" || info.Config.MaxDeliver != 2 || !reflect.DeepEqual(info.Config.BackOff, []time.Duration{time.Second, 3 * time.Second}) ||
		info.Config.SampleFrequency != "0" {
		t.Fatalf("consumer = stream %s, %+v", info.Stream, info.Config)
	}
}

func TestConnect_Errors(t *testing.T) {
	t.Parallel()
	c := config.Default()
	c.NATS.NKeySeed = filepath.Join(t.TempDir(), "missing.nk")
	if _, err := c.NATS.Connect(context.Background()); err == nil || !strings.Contains(err.Error(), "nats.nkey_seed") {
		t.Fatalf("err = %v", err)
	}
	c = config.Default()
	c.NATS.URLs = []string{"nats://127.0.0.1:1"}
	c.NATS.ConnectTimeout = 200 * time.Millisecond
	if _, err := c.NATS.Connect(context.Background()); err == nil {
		t.Fatal("connected to a closed port")
	}
}
