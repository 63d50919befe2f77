package ackmonitor

import (
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"time"

	"github.com/agentmesh-io/agentmesh/ackmonitor/store"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// ErrInvalidConfig is matched (errors.Is) by every error [Config.Validate] returns.
var ErrInvalidConfig = errors.New("ackmonitor: invalid config")

// Thresholds are the alerting thresholds of the specification.
type Thresholds struct {
	// AckWarning: an ack rate below it raises a warning. Default 0.95.
	AckWarning float64
	// AckCritical: an ack rate below it raises a critical alert. Default 0.90.
	AckCritical float64
	// TimeoutWarning: a timeout rate above it raises a warning. Default 0.05.
	TimeoutWarning float64
	// TimeoutCritical: a timeout rate above it raises a critical alert. Default 0.10.
	TimeoutCritical float64
	// InvalidWarning: a sender whose messages its receivers terminate as
	// invalid input at a rate above it (invalid / resolved messages from
	// the sender in the window, per receiving consumer) raises a warning
	// about the sender. Default 0.05, as timeouts: agents on agentkit
	// send no invalid envelope, so the rate counts only requests their
	// handlers reject as INVALID, until a sender is broken or hostile.
	InvalidWarning float64
	// InvalidCritical: an invalid rate above it raises a critical alert.
	// Default 0.10.
	InvalidCritical float64
	// MinSamples is the number of resolved messages an agent needs in the
	// window (as a receiver, or as the sender for the invalid rate) before
	// its rates can raise or resolve an alert, so that one message cannot
	// page anyone. Default 20.
	MinSamples int64
	// MeshMinSamples is the number of resolved messages to all agents
	// together the mesh-wide alerts (agent [MeshAgent]) need in the window.
	// Default 10; negative turns the mesh-wide alerts off.
	MeshMinSamples int64
}

// Config configures a [Monitor]. Zero values take the documented defaults.
type Config struct {
	// Store is the ledger (required). The monitor does not close it.
	Store store.Store
	// Scheme names the subjects and streams. Default: [subjects.Default].
	Scheme subjects.Scheme
	// MonitorID is the sender id of escalations and the durable consumer
	// prefix. Default "ackmonitor".
	MonitorID string
	// Logger receives the monitor's logs. Default: discard.
	Logger *slog.Logger
	// Replicas is the replica count of the streams the monitor creates. Default 1.
	Replicas int
	// EventsMaxAge is how long MESH_EVENTS keeps events. Default 7 days.
	EventsMaxAge time.Duration
	// DLQMaxAge is how long MESH_DLQ keeps dead letters. Default 30 days.
	DLQMaxAge time.Duration
	// PriorityGroup is the pinned-client group instances share. Default "monitor".
	PriorityGroup string
	// PinnedTTL is how long an instance stays pinned without pulling; a
	// standby takes over after it. Default 10s.
	PinnedTTL time.Duration
	// AckWait is how long a fetched message may stay unacked before the
	// server redelivers it (to this or the other instance). Default 30s.
	AckWait time.Duration
	// BatchSize is the most messages written to the store in one
	// transaction. Default 256.
	BatchSize int
	// FetchWait bounds how long a batch waits to fill up (the added
	// latency at low traffic); at most PinnedTTL/4. Default 250ms.
	FetchWait time.Duration
	// Window is the sliding window of rates and alerts. Default 5m.
	Window time.Duration
	// EvaluateInterval is how often alerts are evaluated. Default
	// [DefaultEvaluateInterval].
	EvaluateInterval time.Duration
	// Thresholds are the alerting thresholds.
	Thresholds Thresholds
	// DefaultDirector receives escalations for senders without a director
	// in the registry. Default "director".
	DefaultDirector string
	// Directors resolves a sender's director. Default: [RegistryDirectors]
	// over scheme.RegistryBucket() falling back to DefaultDirector.
	Directors DirectorResolver
	// EscalateTerminated also escalates terminated (NACKed) messages, which
	// are always dead-lettered. Messages terminated as invalid input
	// (status INVALID) are not escalated: they are their sender's failure,
	// not their receiver's. Default false.
	EscalateTerminated bool
	// FollowUpAttempts is how many tries a row's follow-up (its dead
	// letter, its escalation) gets before the monitor gives it up: the
	// row is no longer tried, and shows its reason on
	// /api/v1/messages?status=given_up and in
	// ackmonitor_follow_ups_given_up_total. A try that fails for a reason
	// no try can change (the DLQ stream refuses the copy as such) gives
	// up at once. Tries are spaced 1s apart, doubling to a minute, so the
	// default of 20 is about a quarter of an hour of failures, longer
	// than a DLQ stream without a leader lasts in a healthy cluster.
	FollowUpAttempts int
	// UnavailableFor is how long an agent reads UNAVAILABLE in the agent
	// registry after one of its messages exhausted its deliveries (the
	// agent is potentially unavailable), so discovery and fallback pass
	// it over. The mark in the monitor's own store lasts
	// until the agent's next ACK. Default 1m; negative: no registry mark.
	UnavailableFor time.Duration
	// RollupInterval is how often acknowledgment_metrics is brought up to
	// date. Default 10s.
	RollupInterval time.Duration
	// ReconcileInterval is how often the active instance looks for pending
	// rows its consumer has acked past (ack floor) without an event telling
	// the monitor: ack metrics not sampled (SampleFrequency below 100) or
	// lost. It records their ACKs, without ack time, at the second look.
	// Default 30s.
	ReconcileInterval time.Duration
	// StatusInterval is how often the instance checks whether it holds the
	// pin and refreshes lag gauges. Default PinnedTTL/5 (at least 100ms).
	StatusInterval time.Duration
	// StalePendingAfter is how long after its send a row without a final
	// status counts as stale (ackmonitor_stale_pending_rows, refreshed
	// every ReconcileInterval). Default 2h: about twice the longest a
	// message takes to reach its last outcome under agentkit's default
	// delivery policies (batch: 2 attempts of up to its 30m processing
	// limit and 60s ack wait), leaving a margin for a backlog.
	StalePendingAfter time.Duration
}

var groupRE = regexp.MustCompile(`^[a-zA-Z0-9/_=-]{1,16}$`)

func (c *Config) setDefaults() {
	if c.Scheme.Prefix() == "" {
		c.Scheme = subjects.Default
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	if c.MonitorID == "" {
		c.MonitorID = "ackmonitor"
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Replicas == 0 {
		c.Replicas = 1
	}
	def(&c.EventsMaxAge, 7*24*time.Hour)
	def(&c.DLQMaxAge, 30*24*time.Hour)
	if c.PriorityGroup == "" {
		c.PriorityGroup = "monitor"
	}
	def(&c.PinnedTTL, 10*time.Second)
	def(&c.AckWait, 30*time.Second)
	if c.BatchSize == 0 {
		c.BatchSize = 256
	}
	def(&c.FetchWait, 250*time.Millisecond)
	def(&c.Window, 5*time.Minute)
	def(&c.EvaluateInterval, DefaultEvaluateInterval)
	t := &c.Thresholds
	if t.AckWarning == 0 {
		t.AckWarning = 0.95
	}
	if t.AckCritical == 0 {
		t.AckCritical = 0.90
	}
	if t.TimeoutWarning == 0 {
		t.TimeoutWarning = 0.05
	}
	if t.TimeoutCritical == 0 {
		t.TimeoutCritical = 0.10
	}
	if t.InvalidWarning == 0 {
		t.InvalidWarning = 0.05
	}
	if t.InvalidCritical == 0 {
		t.InvalidCritical = 0.10
	}
	if t.MinSamples == 0 {
		t.MinSamples = 20
	}
	if t.MeshMinSamples == 0 {
		t.MeshMinSamples = 10
	}
	if c.DefaultDirector == "" {
		c.DefaultDirector = "director"
	}
	if c.FollowUpAttempts == 0 {
		c.FollowUpAttempts = 20
	}
	def(&c.UnavailableFor, time.Minute)
	def(&c.RollupInterval, 10*time.Second)
	def(&c.ReconcileInterval, 30*time.Second)
	def(&c.StatusInterval, max(c.PinnedTTL/5, 100*time.Millisecond))
	def(&c.StalePendingAfter, 2*time.Hour)
}

// Validate reports the first invalid field; errors match [ErrInvalidConfig].
func (c *Config) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, args...))
	}
	t := c.Thresholds
	switch {
	case c.Store == nil:
		return bad("Store is required")
	case c.Replicas < 1 || c.Replicas > 5:
		return bad("Replicas %d not in 1..5", c.Replicas)
	case !groupRE.MatchString(c.PriorityGroup):
		return bad("PriorityGroup %q must match %s", c.PriorityGroup, groupRE)
	case c.PinnedTTL < 100*time.Millisecond:
		return bad("PinnedTTL %v is below 100ms", c.PinnedTTL)
	case c.AckWait < time.Second:
		return bad("AckWait %v is below 1s", c.AckWait)
	case c.BatchSize < 1 || c.BatchSize > 10000:
		return bad("BatchSize %d not in 1..10000", c.BatchSize)
	case c.FetchWait < 10*time.Millisecond || c.FetchWait > c.PinnedTTL/4:
		return bad("FetchWait %v must be between 10ms and PinnedTTL/4 (%v)", c.FetchWait, c.PinnedTTL/4)
	case c.Window < time.Second || c.EvaluateInterval <= 0 || c.RollupInterval <= 0 || c.StatusInterval <= 0 ||
		c.ReconcileInterval <= 0:
		return bad("Window must be ≥ 1s and the intervals positive")
	case c.FollowUpAttempts < 1:
		return bad("FollowUpAttempts %d must be at least 1", c.FollowUpAttempts)
	case c.StalePendingAfter <= 0:
		return bad("StalePendingAfter %v must be positive", c.StalePendingAfter)
	case !(0 < t.AckCritical && t.AckCritical <= t.AckWarning && t.AckWarning <= 1):
		return bad("ack thresholds need 0 < critical %v ≤ warning %v ≤ 1", t.AckCritical, t.AckWarning)
	case !(0 <= t.TimeoutWarning && t.TimeoutWarning <= t.TimeoutCritical && t.TimeoutCritical <= 1):
		return bad("timeout thresholds need 0 ≤ warning %v ≤ critical %v ≤ 1", t.TimeoutWarning, t.TimeoutCritical)
	case !(0 <= t.InvalidWarning && t.InvalidWarning <= t.InvalidCritical && t.InvalidCritical <= 1):
		return bad("invalid thresholds need 0 ≤ warning %v ≤ critical %v ≤ 1", t.InvalidWarning, t.InvalidCritical)
	case t.MinSamples < 1:
		return bad("MinSamples %d must be at least 1", t.MinSamples)
	}
	for field, v := range map[string]string{"MonitorID": c.MonitorID, "DefaultDirector": c.DefaultDirector} {
		if err := subjects.ValidateToken(field, v); err != nil {
			return bad("%v", err)
		}
	}
	return nil
}

// DefaultEvaluateInterval is how often alerts are evaluated unless
// [Config.EvaluateInterval] says otherwise.
const DefaultEvaluateInterval = 5 * time.Second
