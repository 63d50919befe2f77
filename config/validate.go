package config

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// ErrInvalid is matched (errors.Is) by every [*FieldError].
var ErrInvalid = errors.New("config: invalid configuration")

// FieldError is one invalid setting: the field's YAML path, the bad value
// and why it is rejected.
type FieldError struct {
	// Field is the YAML path, e.g. "mesh.prefix".
	Field string
	// Value is the rejected value.
	Value any
	// Reason says what is wrong.
	Reason string
}

func (e *FieldError) Error() string {
	return fmt.Sprintf("config: %s %s: %s", e.Field, quote(e.Value), e.Reason)
}

// Is reports whether target is [ErrInvalid].
func (e *FieldError) Is(target error) bool { return target == ErrInvalid }

func quote(v any) string {
	switch x := v.(type) {
	case string:
		return fmt.Sprintf("%q", x)
	case []string:
		return fmt.Sprintf("%q", x)
	default:
		return fmt.Sprintf("%v", x)
	}
}

// Validate checks every field and returns every problem, each a
// [*FieldError], joined (errors.Join); nil when the configuration is usable.
func (c *Config) Validate() error {
	var errs []error
	bad := func(field string, v any, format string, args ...any) {
		errs = append(errs, &FieldError{Field: field, Value: v, Reason: fmt.Sprintf(format, args...)})
	}

	n := c.NATS
	if len(n.URLs) == 0 {
		bad("nats.urls", n.URLs, "at least one server URL is required")
	}
	for i, u := range n.URLs {
		pu, err := url.Parse(u)
		switch {
		case err != nil:
			bad(fmt.Sprintf("nats.urls[%d]", i), u, "%v", err)
		case pu.Scheme != "nats" && pu.Scheme != "tls" && pu.Scheme != "ws" && pu.Scheme != "wss":
			bad(fmt.Sprintf("nats.urls[%d]", i), u, "scheme must be nats, tls, ws or wss")
		case pu.Host == "":
			bad(fmt.Sprintf("nats.urls[%d]", i), u, "no host")
		}
	}
	auth := 0
	for _, s := range []string{n.Creds, n.NKeySeed, n.User} {
		if s != "" {
			auth++
		}
	}
	if auth > 1 {
		bad("nats", "creds/nkey_seed/user", "set only one of creds, nkey_seed and user")
	}
	if n.Password != "" && n.User == "" {
		bad("nats.password", "***", "a password needs nats.user")
	}
	if (n.TLS.Cert == "") != (n.TLS.Key == "") {
		bad("nats.tls.cert", n.TLS.Cert, "tls.cert and tls.key go together")
	}
	if n.ConnectTimeout <= 0 {
		bad("nats.connect_timeout", n.ConnectTimeout, "must be positive")
	}
	if n.ReconnectWait <= 0 {
		bad("nats.reconnect_wait", n.ReconnectWait, "must be positive")
	}
	if n.MaxReconnects < -1 {
		bad("nats.max_reconnects", n.MaxReconnects, "must be -1 (forever) or more")
	}

	if _, err := subjects.New(c.Mesh.Prefix); err != nil {
		var te *subjects.InvalidTokenError
		reason := err.Error()
		if errors.As(err, &te) {
			reason = te.Reason
		}
		bad("mesh.prefix", c.Mesh.Prefix, "%s", reason)
	}
	if r := c.Mesh.Replicas; r < 1 || r > 5 {
		bad("mesh.replicas", r, "must be 1 to 5")
	}

	for _, p := range wire.Priorities {
		field := "agent.policies." + string(p)
		pol := c.Agent.Policies.get(p)
		// The same rules as agentkit.WithPolicy, each naming its field.
		if len(pol.BackOff) == 0 {
			bad(field+".backoff", pol.BackOff, "at least one ack timeout is required")
		}
		for i, d := range pol.BackOff {
			if d < time.Millisecond {
				bad(fmt.Sprintf("%s.backoff[%d]", field, i), d, "must be at least 1ms")
			}
		}
		if pol.MaxDeliver < len(pol.BackOff) {
			bad(field+".max_deliver", pol.MaxDeliver, "must be at least len(backoff) = %d", len(pol.BackOff))
		}
		if pol.ProcessingLimit <= 0 {
			bad(field+".processing_limit", pol.ProcessingLimit, "must be positive")
		}
		if pol.Prefetch < 1 {
			bad(field+".prefetch", pol.Prefetch, "must be at least 1")
		}
		if pol.MaxPrefetch < 0 {
			bad(field+".max_prefetch", pol.MaxPrefetch, "must not be negative (0: a fixed buffer of prefetch)")
		}
		if pol.MaxAckPending < 1 {
			bad(field+".max_ack_pending", pol.MaxAckPending, "must be at least 1")
		}
	}
	if c.Agent.Concurrency < 1 {
		bad("agent.concurrency", c.Agent.Concurrency, "must be at least 1")
	}
	if c.Agent.RequestTimeout <= 0 {
		bad("agent.request_timeout", c.Agent.RequestTimeout, "must be positive")
	}
	if c.Agent.PublishTimeout <= 0 {
		bad("agent.publish_timeout", c.Agent.PublishTimeout, "must be positive")
	}

	m := c.Monitor
	if _, _, err := net.SplitHostPort(m.HTTPAddr); err != nil {
		bad("monitor.http_addr", m.HTTPAddr, "%v", err)
	}
	if u, err := url.Parse(m.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		bad("monitor.url", m.URL, "must be an http(s) URL")
	}
	if m.PostgresDSN != "" && !strings.HasPrefix(m.PostgresDSN, "postgres://") && !strings.HasPrefix(m.PostgresDSN, "postgresql://") && !strings.Contains(m.PostgresDSN, "=") {
		bad("monitor.postgres_dsn", "***", "must be a postgres:// URL or key=value DSN")
	}
	if m.Window <= 0 {
		bad("monitor.window", m.Window, "must be positive")
	}
	if m.MinSamples < 1 {
		bad("monitor.min_samples", m.MinSamples, "must be at least 1")
	}
	a := m.Alerts
	for _, t := range []struct {
		field string
		v     float64
	}{{"ack_rate_warning", a.AckRateWarning}, {"ack_rate_critical", a.AckRateCritical}, {"timeout_rate_warning", a.TimeoutRateWarning}, {"timeout_rate_critical", a.TimeoutRateCritical},
		{"invalid_rate_warning", a.InvalidRateWarning}, {"invalid_rate_critical", a.InvalidRateCritical}} {
		if t.v <= 0 || t.v > 100 {
			bad("monitor.alerts."+t.field, t.v, "must be a percentage above 0 and at most 100 (the ack monitor reads 0 as unset)")
		}
	}
	if a.AckRateCritical > a.AckRateWarning {
		bad("monitor.alerts.ack_rate_critical", a.AckRateCritical, "must not exceed ack_rate_warning %v (critical is the lower ack rate)", a.AckRateWarning)
	}
	if a.TimeoutRateCritical < a.TimeoutRateWarning {
		bad("monitor.alerts.timeout_rate_critical", a.TimeoutRateCritical, "must not be below timeout_rate_warning %v", a.TimeoutRateWarning)
	}
	if a.InvalidRateCritical < a.InvalidRateWarning {
		bad("monitor.alerts.invalid_rate_critical", a.InvalidRateCritical, "must not be below invalid_rate_warning %v", a.InvalidRateWarning)
	}
	if m.FollowUpAttempts < 1 {
		bad("monitor.follow_up_attempts", m.FollowUpAttempts, "must be at least 1")
	}
	if err := subjects.ValidateToken("agent id", m.DefaultDirector); err != nil {
		bad("monitor.default_director", m.DefaultDirector, "must be an agent id [A-Za-z0-9_-]{1,64}")
	}
	if m.SampleFrequency < 0 || m.SampleFrequency > 100 {
		bad("monitor.sample_frequency", m.SampleFrequency, "must be a percentage, 0 to 100")
	}
	if err := subjects.ValidateToken("monitor id", m.ID); err != nil {
		bad("monitor.id", m.ID, "must be an agent id [A-Za-z0-9_-]{1,64}")
	}
	if m.StalePendingAfter < 0 {
		bad("monitor.stale_pending_after", m.StalePendingAfter, "must not be negative")
	}
	if m.PinnedTTL < time.Second {
		bad("monitor.pinned_ttl", m.PinnedTTL, "must be at least 1s")
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(m.LogLevel)); err != nil {
		bad("monitor.log_level", m.LogLevel, "must be debug, info, warn or error")
	}
	if _, _, err := net.SplitHostPort(c.Dev.Listen); err != nil {
		bad("dev.listen", c.Dev.Listen, "%v", err)
	}
	return errors.Join(errs...)
}
