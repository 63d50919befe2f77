package ackmonitor

import (
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/prometheus/promql/parser"
	"gopkg.in/yaml.v3"
)

// The Prometheus rules in deploy/ parse with Prometheus' own PromQL parser,
// use only metrics the monitor exports, and mirror the default thresholds.
func TestPrometheusRules(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile("../deploy/prometheus/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Groups []struct {
			Name  string `yaml:"name"`
			Rules []struct {
				Alert       string            `yaml:"alert"`
				Record      string            `yaml:"record"`
				Expr        string            `yaml:"expr"`
				For         string            `yaml:"for"`
				Labels      map[string]string `yaml:"labels"`
				Annotations map[string]string `yaml:"annotations"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	dec := yaml.NewDecoder(strings.NewReader(string(data)))
	dec.KnownFields(true)
	if err := dec.Decode(&file); err != nil {
		t.Fatalf("alerts.yml: %v", err)
	}
	exported := exportedMetricNames(t)
	job := scrapeJob(t)
	upRules := map[string]string{} // rules on the monitor's scrape health
	cfg := Config{Store: nil}
	cfg.setDefaults()
	wantThreshold := map[string]float64{
		"AgentAckRateWarning": cfg.Thresholds.AckWarning, "AgentAckRateCritical": cfg.Thresholds.AckCritical,
		"AgentTimeoutRateWarning": cfg.Thresholds.TimeoutWarning, "AgentTimeoutRateCritical": cfg.Thresholds.TimeoutCritical,
		"SenderInvalidRateWarning": cfg.Thresholds.InvalidWarning, "SenderInvalidRateCritical": cfg.Thresholds.InvalidCritical,
	}
	// The mesh-wide rules: the same thresholds, the mesh's own samples.
	wantMesh := map[string]float64{
		"MeshAckRateWarning": cfg.Thresholds.AckWarning, "MeshAckRateCritical": cfg.Thresholds.AckCritical,
		"MeshTimeoutRateWarning": cfg.Thresholds.TimeoutWarning, "MeshTimeoutRateCritical": cfg.Thresholds.TimeoutCritical,
	}
	meshSamples := ">= " + strconv.FormatInt(cfg.Thresholds.MeshMinSamples, 10)
	seen := map[string]bool{}
	if len(file.Groups) == 0 {
		t.Fatal("no rule groups")
	}
	for _, g := range file.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" || seen[r.Alert] {
				t.Errorf("rule without a unique alert name: %+v", r)
			}
			seen[r.Alert] = true
			expr, err := parser.NewParser(parser.Options{}).ParseExpr(r.Expr)
			if err != nil {
				t.Errorf("%s: %v", r.Alert, err)
				continue
			}
			if vt := expr.Type(); vt != parser.ValueTypeVector {
				t.Errorf("%s: expression type %s, want vector", r.Alert, vt)
			}
			parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
				vs, ok := n.(*parser.VectorSelector)
				switch {
				case !ok:
				case vs.Name == "up": // Prometheus' own, of the monitor's scrape job
					if !strings.Contains(vs.String(), `job="`+job+`"`) {
						t.Errorf("%s: %s is not of the scrape job %q", r.Alert, vs, job)
					}
					upRules[r.Alert] = r.Expr
				case !exported[vs.Name]:
					t.Errorf("%s: metric %q is not exported by the monitor", r.Alert, vs.Name)
				}
				return nil
			})
			if r.For != "" {
				if _, err := time.ParseDuration(r.For); err != nil {
					t.Errorf("%s: for %q: %v", r.Alert, r.For, err)
				}
			}
			if s := r.Labels["severity"]; s != "warning" && s != "critical" {
				t.Errorf("%s: severity %q", r.Alert, s)
			}
			if r.Annotations["summary"] == "" {
				t.Errorf("%s: no summary", r.Alert)
			}
			if want, ok := wantMesh[r.Alert]; ok {
				if !strings.Contains(r.Expr, strconv.FormatFloat(want, 'f', -1, 64)) || !strings.Contains(r.Expr, meshSamples) ||
					strings.Contains(r.Expr, " by (") {
					t.Errorf("%s: expression is not mesh-wide, or does not use threshold %v and the default %s samples:\n%s",
						r.Alert, want, meshSamples, r.Expr)
				}
			}
			if want, ok := wantThreshold[r.Alert]; ok {
				if !strings.Contains(r.Expr, strconv.FormatFloat(want, 'f', -1, 64)) ||
					!strings.Contains(r.Expr, ">= 20") {
					t.Errorf("%s: expression does not use threshold %v and the default 20 samples:\n%s", r.Alert, want, r.Expr)
				}
			}
		}
	}
	// Something fires when the monitor is down or not scraped at all.
	if !strings.Contains(upRules["AckMonitorDown"], "== 0") || !strings.HasPrefix(upRules["AckMonitorAbsent"], "absent(up{") {
		t.Errorf("no rule for the monitor down (up == 0) or not scraped (absent(up)): %v", upRules)
	}
	for _, want := range []map[string]float64{wantThreshold, wantMesh} {
		for name := range want {
			if !seen[name] {
				t.Errorf("missing rule %s", name)
			}
		}
	}
}

// scrapeJob is the job name of the monitor in deploy's prometheus.yml.
func scrapeJob(t *testing.T) string {
	data, err := os.ReadFile("../deploy/prometheus/prometheus.yml")
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		ScrapeConfigs []struct {
			JobName string `yaml:"job_name"`
		} `yaml:"scrape_configs"`
	}
	if err := yaml.Unmarshal(data, &cfg); err != nil || len(cfg.ScrapeConfigs) != 1 {
		t.Fatalf("prometheus.yml: %v, %d scrape jobs, want 1", err, len(cfg.ScrapeConfigs))
	}
	return cfg.ScrapeConfigs[0].JobName
}

var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

// exportedMetricNames lists every series name the monitor's registry can
// expose, histograms expanded to _bucket, _sum and _count.
func exportedMetricNames(t *testing.T) map[string]bool {
	m := newMetrics()
	ch := make(chan *prometheus.Desc, 1000)
	m.reg.Describe(ch)
	close(ch)
	names := map[string]bool{}
	for d := range ch {
		mm := fqName.FindStringSubmatch(d.String())
		if mm == nil {
			t.Fatalf("descriptor %s has no name", d)
		}
		for _, suffix := range []string{"", "_bucket", "_sum", "_count"} {
			names[mm[1]+suffix] = true
		}
	}
	if !names["ackmonitor_outcomes_total"] {
		t.Fatalf("registry names %v", names)
	}
	return names
}
