package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/compose-spec/compose-go/v2/loader"
	"github.com/compose-spec/compose-go/v2/types"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/prometheus/promql/parser"
	"gopkg.in/yaml.v3"

	"github.com/agentmesh-io/agentmesh/config"
	"github.com/agentmesh-io/agentmesh/internal/natstest"
)

// root is the repository root, relative to this package.
const root = ".."

func loadCompose(t *testing.T) *types.Project {
	t.Helper()
	abs, err := filepath.Abs(root)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p, err := loader.LoadWithContext(ctx, types.ConfigDetails{
		WorkingDir:  abs,
		ConfigFiles: []types.ConfigFile{{Filename: filepath.Join(abs, "docker-compose.yml")}},
		Environment: types.Mapping{},
	}, func(o *loader.Options) { o.SetProjectName("agentmesh", true) })
	if err != nil {
		t.Fatalf("docker-compose.yml does not load: %v", err)
	}
	return p
}

// TestCompose_LoadsAndReferencesExist checks what Docker would check
// first: the compose file loads, every service is there, every bind
// mount, build context and Dockerfile it names exists, named volumes are
// declared, host ports are distinct, and the environment variables it sets
// are ones the binaries read.
func TestCompose_LoadsAndReferencesExist(t *testing.T) {
	t.Parallel()
	p := loadCompose(t)
	want := []string{"nats-1", "nats-2", "nats-3", "postgres", "ackmonitor", "demo", "prometheus", "grafana"}
	got := p.ServiceNames()
	for _, s := range want {
		if !slices.Contains(got, s) {
			t.Errorf("service %s missing (have %v)", s, got)
		}
	}
	published := map[string]string{}
	for name, svc := range p.Services {
		if svc.Build != nil {
			if fi, err := os.Stat(svc.Build.Context); err != nil || !fi.IsDir() {
				t.Errorf("%s: build context %s: %v", name, svc.Build.Context, err)
			}
			df := svc.Build.Dockerfile
			if !filepath.IsAbs(df) {
				df = filepath.Join(svc.Build.Context, df)
			}
			if _, err := os.Stat(df); err != nil {
				t.Errorf("%s: Dockerfile: %v", name, err)
			}
		}
		for _, v := range svc.Volumes {
			switch v.Type {
			case types.VolumeTypeBind:
				if _, err := os.Stat(v.Source); err != nil {
					t.Errorf("%s: bind mount source %s: %v", name, v.Source, err)
				}
			case types.VolumeTypeVolume:
				if _, ok := p.Volumes[v.Source]; !ok {
					t.Errorf("%s: named volume %s not declared", name, v.Source)
				}
			}
		}
		for _, port := range svc.Ports {
			if other, dup := published[port.Published]; dup {
				t.Errorf("host port %s published by %s and %s", port.Published, other, name)
			}
			published[port.Published] = name
		}
		for dep := range svc.DependsOn {
			if !slices.Contains(got, dep) {
				t.Errorf("%s depends on unknown service %s", name, dep)
			}
		}
	}

	// The Dockerfile builds packages that exist.
	df, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	for _, pkg := range regexp.MustCompile(`\./cmd/[a-z]+`).FindAllString(string(df), -1) {
		if _, err := os.Stat(filepath.Join(root, pkg, "main.go")); err != nil {
			t.Errorf("Dockerfile builds %s: %v", pkg, err)
		}
	}

	// Environment variables: both binaries read the shared configuration,
	// so every AGENTMESH_* variable must be one of config.EnvVars.
	known := map[string]bool{}
	for _, v := range config.EnvVars() {
		known[v.Name] = true
	}
	for name, svc := range p.Services {
		for k := range svc.Environment {
			if strings.HasPrefix(k, "AGENTMESH_") && !known[k] {
				t.Errorf("%s: %s is not an agentmesh setting", name, k)
			}
		}
	}

	// Prometheus scrapes the port the monitor listens on.
	mon := p.Services["ackmonitor"]
	addr := mon.Environment["AGENTMESH_MONITOR_HTTP_ADDR"]
	if addr == nil {
		t.Fatal("ackmonitor: AGENTMESH_MONITOR_HTTP_ADDR not set")
	}
	prom, err := os.ReadFile(filepath.Join(root, "deploy", "prometheus", "prometheus.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var pc struct {
		ScrapeConfigs []struct {
			StaticConfigs []struct {
				Targets []string `yaml:"targets"`
			} `yaml:"static_configs"`
		} `yaml:"scrape_configs"`
	}
	if err := yaml.Unmarshal(prom, &pc); err != nil {
		t.Fatalf("prometheus.yml: %v", err)
	}
	if len(pc.ScrapeConfigs) == 0 || len(pc.ScrapeConfigs[0].StaticConfigs) == 0 ||
		!slices.Contains(pc.ScrapeConfigs[0].StaticConfigs[0].Targets, "ackmonitor"+*addr) {
		t.Errorf("prometheus.yml does not scrape ackmonitor%s: %+v", *addr, pc)
	}
}

// TestNATSConfigs_FormCluster parses deploy/nats/nats-{1,2,3}.conf with the
// server's own parser, checks what they declare, then starts them as
// embedded servers with their ports remapped to free local ones (routes
// nats-i:6222 → 127.0.0.1:<port i>) and waits for a meta leader and an R3
// stream.
func TestNATSConfigs_FormCluster(t *testing.T) {
	t.Parallel()
	const n = 3
	var parsed []*server.Options
	for i := 1; i <= n; i++ {
		path := filepath.Join(root, "deploy", "nats", fmt.Sprintf("nats-%d.conf", i))
		o, err := server.ProcessConfigFile(path)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		switch {
		case o.ServerName != fmt.Sprintf("nats-%d", i):
			t.Errorf("%s: server_name %q", path, o.ServerName)
		case !o.JetStream:
			t.Errorf("%s: JetStream off", path)
		case o.SyncInterval != time.Second || o.SyncAlways:
			t.Errorf("%s: sync_interval %v (always=%v), the comment says 1s", path, o.SyncInterval, o.SyncAlways)
		case o.Cluster.Name != "agentmesh" || o.Cluster.Port != 6222:
			t.Errorf("%s: cluster %q port %d", path, o.Cluster.Name, o.Cluster.Port)
		case len(o.Routes) != n:
			t.Errorf("%s: %d routes, want one per node", path, len(o.Routes))
		}
		for _, r := range o.Routes {
			var j int
			if _, err := fmt.Sscanf(r.Hostname(), "nats-%d", &j); err != nil || j < 1 || j > n || r.Port() != "6222" {
				t.Errorf("%s: route %s is not nats-<1..3>:6222", path, r)
			}
		}
		parsed = append(parsed, o)
	}
	if t.Failed() {
		return
	}
	c := natstest.StartCluster(t, n, func(ports []int) []*server.Options {
		// Remap to this machine.
		all := make([]*server.Options, n)
		for i, p := range parsed {
			o := p.Clone()
			o.Host, o.Port, o.HTTPPort = "127.0.0.1", -1, 0
			o.Cluster.Host, o.Cluster.Port = "127.0.0.1", ports[i]
			o.Routes = natstest.RoutesTo(ports)
			o.StoreDir = t.TempDir()
			o.NoLog, o.NoSigs = true, true
			all[i] = o
		}
		return all
	})
	js, _ := jetstream.New(c.Connect(t))
	natstest.WaitFor(t, 20*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "R3", Subjects: []string{"r3.>"}, Replicas: 3})
		return err
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.Publish(ctx, "r3.x", []byte("hello")); err != nil {
		t.Fatal(err)
	}
	c.WaitStreamCurrent(t, js, "R3", 20*time.Second)
}

// monitorMetrics returns the metric names the ack monitor registers, read
// from its source, with the series names histograms add.
func monitorMetrics(t *testing.T) map[string]bool {
	t.Helper()
	src, err := os.ReadFile(filepath.Join(root, "ackmonitor", "metrics.go"))
	if err != nil {
		t.Fatalf("the ack monitor's metrics: %v", err)
	}
	names := map[string]bool{}
	for _, m := range regexp.MustCompile(`Name:\s*"([a-z_:]+)"`).FindAllStringSubmatch(string(src), -1) {
		for _, suffix := range []string{"", "_bucket", "_sum", "_count"} {
			names[m[1]+suffix] = true
		}
	}
	if len(names) == 0 {
		t.Fatal("no metric names found in ackmonitor/metrics.go")
	}
	return names
}

// TestGrafanaDashboard_QueriesParse checks the provisioned dashboard: it is
// JSON, every query parses as PromQL (Prometheus' own parser), names only
// metrics the ack monitor exports, and uses the provisioned datasource.
func TestGrafanaDashboard_QueriesParse(t *testing.T) {
	t.Parallel()
	exported := monitorMetrics(t)
	data, err := os.ReadFile(filepath.Join(root, "deploy", "grafana", "dashboards", "agentmesh.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		UID    string `json:"uid"`
		Panels []struct {
			Title      string `json:"title"`
			Datasource struct {
				UID string `json:"uid"`
			} `json:"datasource"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatalf("dashboard JSON: %v", err)
	}
	ds, err := os.ReadFile(filepath.Join(root, "deploy", "grafana", "provisioning", "datasources", "prometheus.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var dsc struct {
		Datasources []struct {
			UID string `yaml:"uid"`
		} `yaml:"datasources"`
	}
	if err := yaml.Unmarshal(ds, &dsc); err != nil || len(dsc.Datasources) != 1 {
		t.Fatalf("datasource provisioning: %v %+v", err, dsc)
	}
	if len(dash.Panels) == 0 {
		t.Fatal("dashboard has no panels")
	}
	promql := parser.NewParser(parser.Options{})
	queries := 0
	for _, p := range dash.Panels {
		if p.Datasource.UID != dsc.Datasources[0].UID {
			t.Errorf("panel %q uses datasource %q, provisioned is %q", p.Title, p.Datasource.UID, dsc.Datasources[0].UID)
		}
		for _, q := range p.Targets {
			queries++
			expr, err := promql.ParseExpr(q.Expr)
			if err != nil {
				t.Errorf("panel %q: %q: %v", p.Title, q.Expr, err)
				continue
			}
			parser.Inspect(expr, func(node parser.Node, _ []parser.Node) error {
				if vs, ok := node.(*parser.VectorSelector); ok && !exported[vs.Name] {
					t.Errorf("panel %q: metric %q is not exported by the ack monitor", p.Title, vs.Name)
				}
				return nil
			})
		}
	}
	if queries == 0 {
		t.Fatal("dashboard has no queries")
	}
}
