// Package config is the typed configuration shared by the agentmesh
// binaries (cmd/agentmesh and cmd/ackmonitor): a YAML file, then
// AGENTMESH_* environment overrides, then (in cmd) command-line flags, on
// top of defaults for everything.
//
// # Precedence
//
//	Default()  ←  YAML file (Load)  ←  AGENTMESH_* environment  ←  flags (cmd)
//
// Every leaf field has an environment variable named after its YAML path:
// upper case, dots and nesting turned into underscores, prefixed with
// AGENTMESH_. For example monitor.alerts.ack_rate_warning is
// AGENTMESH_MONITOR_ALERTS_ACK_RATE_WARNING and
// agent.policies.high.backoff is AGENTMESH_AGENT_POLICIES_HIGH_BACKOFF.
// Lists are comma separated; durations use Go syntax ("5s", "1m30s").
// [EnvVars] lists them all.
//
// # Validation
//
// [Config.Validate] checks every field and returns the problems joined;
// each is a [*FieldError] naming the field's path and the bad value, e.g.
//
//	config: mesh.prefix "Team-A": must be [a-z][a-z0-9_]*: lower case keeps stream names distinct
//
// Match them with errors.As, or errors.Is(err, [ErrInvalid]).
//
// # Wiring
//
// [Config.AgentOptions] turns the mesh and agent sections into
// agentkit options; [NATS.Connect] dials with the credentials and TLS
// settings of the nats section. Libraries never dial; the binaries do,
// through this helper. The monitor's ledger and service are wired beside
// the binaries (cmd/internal/monitorsvc), so an agent that reads its
// settings from here links no database driver.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// EnvPrefix prefixes every environment override.
const EnvPrefix = "AGENTMESH_"

// Config is the whole configuration. The zero value is not valid; start
// from [Default] or [Load].
type Config struct {
	// NATS says how to reach the NATS servers.
	NATS NATS `yaml:"nats"`
	// Mesh names the mesh: subject prefix and stream replicas.
	Mesh Mesh `yaml:"mesh"`
	// Agent is the delivery policy and runtime tuning of agents the
	// binaries run (the demo agents; agents built on agentkit may load it too).
	Agent Agent `yaml:"agent"`
	// Monitor configures the ack monitor.
	Monitor Monitor `yaml:"monitor"`
	// Dev configures the embedded development stack (agentmesh up).
	Dev Dev `yaml:"dev"`
}

// NATS is how to connect to the NATS servers.
type NATS struct {
	// URLs are the servers to connect to; the client picks among them and
	// reconnects to the others. Default: ["nats://127.0.0.1:4222"].
	URLs []string `yaml:"urls"`
	// Creds is a credentials file (JWT + nkey seed), or a file holding only
	// an nkey seed, used as NKeySeed. Default: none.
	Creds string `yaml:"creds"`
	// NKeySeed is a file holding an nkey seed. A seed file of agentmesh
	// auth (auth.Bundle.WriteDir) also sets its user's inbox prefix.
	// Default: none.
	NKeySeed string `yaml:"nkey_seed"`
	// User and Password authenticate with a user name and password.
	// Default: none.
	User     string `yaml:"user"`
	Password string `yaml:"password"`
	// TLS configures TLS; with CA set the server's certificate is
	// verified against it, with Cert and Key the client presents a
	// certificate. Default: no TLS unless the URL says tls://.
	TLS TLS `yaml:"tls"`
	// Name is the connection name shown by the server's monitoring.
	// Default: "agentmesh".
	Name string `yaml:"name"`
	// ConnectTimeout bounds each connection attempt. Default: 5s.
	ConnectTimeout time.Duration `yaml:"connect_timeout"`
	// ReconnectWait is the pause between reconnection attempts. Default: 250ms.
	ReconnectWait time.Duration `yaml:"reconnect_wait"`
	// MaxReconnects is how many times to try to reconnect; -1 is forever.
	// Default: -1.
	MaxReconnects int `yaml:"max_reconnects"`
}

// TLS holds file paths of TLS material.
type TLS struct {
	// CA is a PEM file of the certificate authorities to trust.
	CA string `yaml:"ca"`
	// Cert and Key are the client's certificate and key (PEM); both or neither.
	Cert string `yaml:"cert"`
	Key  string `yaml:"key"`
}

// Mesh names one mesh.
type Mesh struct {
	// Prefix is the subject prefix ([subjects.New]); the stream is its upper
	// case. Default: "mesh".
	Prefix string `yaml:"prefix"`
	// Replicas is the replica count of streams the binaries create: 1 on
	// a single server, 3 on a cluster. Default: 1.
	Replicas int `yaml:"replicas"`
}

// Agent is the delivery policy and runtime tuning of an agent.
type Agent struct {
	// Policies is the delivery policy of each priority. Default:
	// agentkit.DefaultPolicies, listed on the fields of [Policies].
	Policies Policies `yaml:"policies"`
	// Concurrency is how many handlers run at once. Default: 8.
	Concurrency int `yaml:"concurrency"`
	// RequestTimeout bounds Request and SendAndWait without a deadline.
	// Default: 30s.
	RequestTimeout time.Duration `yaml:"request_timeout"`
	// PublishTimeout bounds the retries of a publish. Default: 10s.
	PublishTimeout time.Duration `yaml:"publish_timeout"`
}

// Policies holds one delivery policy per priority; a field left out of the
// file keeps agentkit.DefaultPolicies' value for that priority.
type Policies struct {
	// Critical default: backoff 2s 4s 8s 16s 32s, 5 attempts, 1m processing limit.
	Critical Policy `yaml:"critical"`
	// High default: backoff 5s 10s 20s 40s, 4 attempts, 5m.
	High Policy `yaml:"high"`
	// Normal default: backoff 10s 20s 40s, 3 attempts, 10m.
	Normal Policy `yaml:"normal"`
	// Low default: backoff 30s 30s, 2 attempts, 10m.
	Low Policy `yaml:"low"`
	// Batch default: backoff 60s 60s, 2 attempts, 30m.
	Batch Policy `yaml:"batch"`
}

// Policy is agentkit.DeliveryPolicy in YAML form; see its documentation.
type Policy struct {
	// BackOff is the ack timeout of each attempt.
	BackOff []time.Duration `yaml:"backoff"`
	// MaxDeliver is the number of attempts, the first included; ≥ len(backoff).
	MaxDeliver int `yaml:"max_deliver"`
	// ProcessingLimit bounds how long a handler may run.
	ProcessingLimit time.Duration `yaml:"processing_limit"`
	// Prefetch is how many messages are buffered ahead of the handlers
	// until their pace is known.
	Prefetch int `yaml:"prefetch"`
	// MaxPrefetch caps the buffer the runtime sizes to the handlers' pace;
	// 0 keeps the buffer at Prefetch.
	MaxPrefetch int `yaml:"max_prefetch"`
	// MaxAckPending bounds unacknowledged messages of the consumer.
	MaxAckPending int `yaml:"max_ack_pending"`
}

// Monitor configures the ack monitor (cmd/ackmonitor) and how the CLI
// reaches it.
type Monitor struct {
	// DataDir is the directory of the SQLite ledger (file ackmonitor.db,
	// see [OpenSQLite]) when no PostgreSQL DSN is given; created if needed.
	// Default: "" (the binary picks: ackmonitor ./data, agentmesh up
	// <its data dir>/ackmonitor). agentmesh demo always keeps its ledger
	// with its own store and ignores this and PostgresDSN.
	DataDir string `yaml:"data_dir"`
	// PostgresDSN selects the PostgreSQL store. Default: "" (SQLite).
	PostgresDSN string `yaml:"postgres_dsn"`
	// HTTPAddr is the address the dashboard, /api/v1, /metrics and
	// /healthz listen on. Default: "127.0.0.1:8281".
	HTTPAddr string `yaml:"http_addr"`
	// URL is where the CLI (agentmesh stats) finds a running monitor.
	// Default: "http://127.0.0.1:8281".
	URL string `yaml:"url"`
	// Window is the sliding window alert rates are computed over.
	// Default: 5m.
	Window time.Duration `yaml:"window"`
	// MinSamples is the fewest messages in a window before an alert may
	// fire. Default: 20.
	MinSamples int `yaml:"min_samples"`
	// MeshMinSamples is the fewest messages to all agents in a window
	// before the mesh-wide alert may fire; negative turns it off.
	// Default: 10.
	MeshMinSamples int `yaml:"mesh_min_samples"`
	// Alerts are the alert thresholds, in percent, each above 0.
	Alerts Alerts `yaml:"alerts"`
	// DefaultDirector receives escalations for senders without a director.
	// Default: "director".
	DefaultDirector string `yaml:"default_director"`
	// SampleFrequency is the percentage of acks the server reports as ack
	// metrics (0..100), set on the consumers of agents configured from this
	// file ([Config.AgentOptions], agentkit.WithSampleFrequency); send, NAK,
	// TERM and MAX_DELIVERIES counts stay exact at any value.
	// Default: 100.
	SampleFrequency int `yaml:"sample_frequency"`
	// ID is the monitor's id: the sender of its escalations and the prefix
	// of its consumers. Default: "ackmonitor".
	ID string `yaml:"id"`
	// PinnedTTL is how long the standby of two monitor instances waits
	// before taking over from a silent active one. Default: 10s.
	PinnedTTL time.Duration `yaml:"pinned_ttl"`
	// EscalateTerminated also escalates terminated (rejected) messages, not
	// only exhausted ones. Default: false.
	EscalateTerminated bool `yaml:"escalate_terminated"`
	// UnavailableFor is how long an agent reads UNAVAILABLE in the agent
	// registry after one of its messages exhausted its deliveries; a
	// negative value leaves the registry alone (the monitor's own store
	// still records it). Default: 1m.
	UnavailableFor time.Duration `yaml:"unavailable_for"`
	// StalePendingAfter is how long after its send a ledger row without a
	// final status counts in ackmonitor_stale_pending_rows. Default: 0,
	// meaning the monitor's 2h.
	StalePendingAfter time.Duration `yaml:"stale_pending_after"`
	// FollowUpAttempts is how many times the monitor tries a message's
	// dead letter and escalation before it records them as given up (an
	// error that can never pass gives up at once). Default: 20.
	FollowUpAttempts int `yaml:"follow_up_attempts"`
	// LogLevel of the monitor binary: debug, info, warn or error.
	// Default: "info".
	LogLevel string `yaml:"log_level"`
}

// Alerts are the thresholds, in percent, at which the monitor raises
// warning and critical alerts.
type Alerts struct {
	// AckRateWarning: warn when the ack rate falls below it. Default: 95.
	AckRateWarning float64 `yaml:"ack_rate_warning"`
	// AckRateCritical: critical below it. Default: 90.
	AckRateCritical float64 `yaml:"ack_rate_critical"`
	// TimeoutRateWarning: warn when the timeout rate exceeds it. Default: 5.
	TimeoutRateWarning float64 `yaml:"timeout_rate_warning"`
	// TimeoutRateCritical: critical above it. Default: 10.
	TimeoutRateCritical float64 `yaml:"timeout_rate_critical"`
	// InvalidRateWarning: warn about a sender when more of its messages
	// than this are terminated as invalid by their receivers. Default: 5.
	InvalidRateWarning float64 `yaml:"invalid_rate_warning"`
	// InvalidRateCritical: critical above it. Default: 10.
	InvalidRateCritical float64 `yaml:"invalid_rate_critical"`
}

// Dev configures the embedded development stack.
type Dev struct {
	// DataDir is the JetStream store (and monitor ledger) of agentmesh up;
	// it survives restarts. Default: "" meaning os.UserCacheDir()/agentmesh.
	DataDir string `yaml:"data_dir"`
	// Listen is the client address of the embedded server of agentmesh up.
	// Default: "127.0.0.1:4222".
	Listen string `yaml:"listen"`
}

// Default returns the configuration with every default set.
func Default() *Config {
	c := &Config{}
	c.setDefaults()
	return c
}

// setDefaults fills every field that has a zero value with its default.
func (c *Config) setDefaults() {
	n := &c.NATS
	if len(n.URLs) == 0 {
		n.URLs = []string{"nats://127.0.0.1:4222"}
	}
	if n.Name == "" {
		n.Name = "agentmesh"
	}
	if n.ConnectTimeout == 0 {
		n.ConnectTimeout = 5 * time.Second
	}
	if n.ReconnectWait == 0 {
		n.ReconnectWait = 250 * time.Millisecond
	}
	if n.MaxReconnects == 0 {
		n.MaxReconnects = -1
	}
	if c.Mesh.Prefix == "" {
		c.Mesh.Prefix = subjects.DefaultPrefix
	}
	if c.Mesh.Replicas == 0 {
		c.Mesh.Replicas = 1
	}
	defs := agentkit.DefaultPolicies()
	for _, p := range wire.Priorities {
		pol := c.Agent.Policies.get(p)
		d := defs[p]
		if len(pol.BackOff) == 0 {
			pol.BackOff = d.BackOff
		}
		if pol.MaxDeliver == 0 {
			pol.MaxDeliver = d.MaxDeliver
		}
		if pol.ProcessingLimit == 0 {
			pol.ProcessingLimit = d.ProcessingLimit
		}
		if pol.Prefetch == 0 {
			pol.Prefetch = d.Prefetch
		}
		if pol.MaxPrefetch == 0 {
			pol.MaxPrefetch = d.MaxPrefetch
		}
		if pol.MaxAckPending == 0 {
			pol.MaxAckPending = d.MaxAckPending
		}
	}
	if c.Agent.Concurrency == 0 {
		c.Agent.Concurrency = 8
	}
	if c.Agent.RequestTimeout == 0 {
		c.Agent.RequestTimeout = 30 * time.Second
	}
	if c.Agent.PublishTimeout == 0 {
		c.Agent.PublishTimeout = 10 * time.Second
	}
	m := &c.Monitor
	if m.HTTPAddr == "" {
		m.HTTPAddr = "127.0.0.1:8281"
	}
	if m.URL == "" {
		m.URL = "http://127.0.0.1:8281"
	}
	if m.Window == 0 {
		m.Window = 5 * time.Minute
	}
	if m.MinSamples == 0 {
		m.MinSamples = 20
	}
	if m.MeshMinSamples == 0 {
		m.MeshMinSamples = 10
	}
	if m.ID == "" {
		m.ID = "ackmonitor"
	}
	if m.PinnedTTL == 0 {
		m.PinnedTTL = 10 * time.Second
	}
	if m.UnavailableFor == 0 {
		m.UnavailableFor = time.Minute
	}
	if m.LogLevel == "" {
		m.LogLevel = "info"
	}
	if m.Alerts.AckRateWarning == 0 {
		m.Alerts.AckRateWarning = 95
	}
	if m.Alerts.AckRateCritical == 0 {
		m.Alerts.AckRateCritical = 90
	}
	if m.Alerts.TimeoutRateWarning == 0 {
		m.Alerts.TimeoutRateWarning = 5
	}
	if m.Alerts.TimeoutRateCritical == 0 {
		m.Alerts.TimeoutRateCritical = 10
	}
	if m.Alerts.InvalidRateWarning == 0 {
		m.Alerts.InvalidRateWarning = 5
	}
	if m.Alerts.InvalidRateCritical == 0 {
		m.Alerts.InvalidRateCritical = 10
	}
	if m.FollowUpAttempts == 0 {
		m.FollowUpAttempts = 20
	}
	if m.DefaultDirector == "" {
		m.DefaultDirector = "director"
	}
	if m.SampleFrequency == 0 {
		m.SampleFrequency = 100
	}
	if c.Dev.Listen == "" {
		c.Dev.Listen = "127.0.0.1:4222"
	}
}

// get returns a pointer to the policy of p.
func (ps *Policies) get(p wire.Priority) *Policy {
	switch p {
	case wire.PriorityCritical:
		return &ps.Critical
	case wire.PriorityHigh:
		return &ps.High
	case wire.PriorityNormal:
		return &ps.Normal
	case wire.PriorityLow:
		return &ps.Low
	default:
		return &ps.Batch
	}
}

// Policy returns the delivery policy of priority p as agentkit's type.
func (a Agent) Policy(p wire.Priority) agentkit.DeliveryPolicy {
	pol := *a.Policies.get(p)
	return agentkit.DeliveryPolicy{
		BackOff:         append([]time.Duration(nil), pol.BackOff...),
		MaxDeliver:      pol.MaxDeliver,
		ProcessingLimit: pol.ProcessingLimit,
		Prefetch:        pol.Prefetch,
		MaxPrefetch:     pol.MaxPrefetch,
		MaxAckPending:   pol.MaxAckPending,
	}
}

// Load returns the defaults, overlaid with the YAML file at path (if path
// is not empty) and the AGENTMESH_* environment, validated.
func Load(path string) (*Config, error) {
	return LoadWith(path, os.LookupEnv)
}

// LoadWith is [Load] with the environment read through lookup (for tests
// and for binaries that filter the environment).
func LoadWith(path string, lookup func(string) (string, bool)) (*Config, error) {
	c, err := ReadWith(path, lookup)
	if err != nil {
		return nil, err
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return c, nil
}

// Read is [Load] without the validation, for binaries that apply flags on
// top: they call [Config.Validate] once the flags are applied, so a valid
// flag overrides an invalid file or environment value.
func Read(path string) (*Config, error) {
	return ReadWith(path, os.LookupEnv)
}

// ReadWith is [Read] with the environment read through lookup.
func ReadWith(path string, lookup func(string) (string, bool)) (*Config, error) {
	c := Default()
	if path != "" {
		f, err := os.Open(path)
		if err != nil {
			return nil, fmt.Errorf("config: %w", err)
		}
		defer f.Close()
		if err := c.Decode(f); err != nil {
			return nil, fmt.Errorf("config: %s: %w", filepath.Base(path), err)
		}
	}
	if err := c.ApplyEnv(lookup); err != nil {
		return nil, err
	}
	return c, nil
}

// Decode overlays the YAML document read from r on c. Unknown keys are
// errors, so a misspelt setting is not silently ignored. An empty document
// changes nothing.
func (c *Config) Decode(r io.Reader) error {
	data, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return nil
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(c); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return nil
}
