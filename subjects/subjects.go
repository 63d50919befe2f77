package subjects

import (
	"errors"
	"fmt"
	"strings"
)

// DefaultPrefix is the subject prefix used when none is configured.
const DefaultPrefix = "mesh"

// MaxTokenLen is the longest agent id or topic a subject may carry (a
// prefix is at most 32 characters, see [New]).
const MaxTokenLen = 64

// Priorities lists the priority tokens, highest first. agentkit's Priority
// values spell the same strings.
var Priorities = []string{"critical", "high", "normal", "low", "batch"}

// Severities lists the alert severity tokens.
var Severities = []string{"info", "warning", "critical"}

// Kind says which family a parsed subject belongs to.
type Kind string

// The subject kinds.
const (
	KindDirect    Kind = "agent"
	KindTopic     Kind = "topic"
	KindBroadcast Kind = "broadcast"
	KindHeartbeat Kind = "hb"
	KindAlert     Kind = "alert"
	KindDLQ       Kind = "dlq"
)

// ErrInvalidToken is matched (errors.Is) by every [*InvalidTokenError].
var ErrInvalidToken = errors.New("subjects: invalid token")

// ErrInvalidSubject is returned by [Scheme.Parse] for subjects outside the scheme.
var ErrInvalidSubject = errors.New("subjects: invalid subject")

// InvalidTokenError says which token was rejected and why.
type InvalidTokenError struct {
	Field  string // what the token is: "agent id", "topic", "priority", ...
	Value  string // the rejected value
	Reason string // why it was rejected
}

func (e *InvalidTokenError) Error() string {
	return fmt.Sprintf("subjects: invalid %s %q: %s", e.Field, e.Value, e.Reason)
}

// Is reports whether target is [ErrInvalidToken].
func (e *InvalidTokenError) Is(target error) bool { return target == ErrInvalidToken }

// ValidateToken checks that v is a usable subject token ([A-Za-z0-9_-]{1,64});
// field names what v is in the error.
func ValidateToken(field, v string) error {
	if v == "" {
		return &InvalidTokenError{Field: field, Value: v, Reason: "empty"}
	}
	if len(v) > MaxTokenLen {
		return &InvalidTokenError{Field: field, Value: v, Reason: fmt.Sprintf("longer than %d characters", MaxTokenLen)}
	}
	for i, c := range v {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-') {
			return &InvalidTokenError{Field: field, Value: v, Reason: fmt.Sprintf("character %q at byte %d is not in [A-Za-z0-9_-]", c, i)}
		}
	}
	return nil
}

// ValidatePriority checks that p is one of [Priorities].
func ValidatePriority(p string) error { return oneOf("priority", p, Priorities) }

// ValidateSeverity checks that s is one of [Severities].
func ValidateSeverity(s string) error { return oneOf("severity", s, Severities) }

func oneOf(field, v string, allowed []string) error {
	for _, a := range allowed {
		if v == a {
			return nil
		}
	}
	return &InvalidTokenError{Field: field, Value: v, Reason: "must be one of " + strings.Join(allowed, ", ")}
}

// Scheme builds and parses the names of one mesh. The zero value is not
// usable; call [New] or use [Default].
type Scheme struct {
	prefix string
	stream string
}

// Default is the scheme with [DefaultPrefix].
var Default = mustNew(DefaultPrefix)

func mustNew(prefix string) Scheme {
	s, err := New(prefix)
	if err != nil {
		panic(err) // only reached with the constant DefaultPrefix
	}
	return s
}

// New returns the scheme for prefix: 1 to 32 characters from [a-z0-9_],
// starting with a letter. Several meshes can share one NATS account by using
// different prefixes: the stream, bucket and subject names all derive from
// it, and the stream name is the prefix in upper case, so no two prefixes
// share a stream.
func New(prefix string) (Scheme, error) {
	if err := validatePrefix(prefix); err != nil {
		return Scheme{}, err
	}
	return Scheme{prefix: prefix, stream: strings.ToUpper(prefix)}, nil
}

func validatePrefix(p string) error {
	if p == "" || len(p) > 32 {
		return &InvalidTokenError{Field: "prefix", Value: p, Reason: "must be 1 to 32 characters"}
	}
	for i, c := range p {
		if !('a' <= c && c <= 'z' || i > 0 && ('0' <= c && c <= '9' || c == '_')) {
			return &InvalidTokenError{Field: "prefix", Value: p, Reason: "must be [a-z][a-z0-9_]*: lower case keeps stream names distinct"}
		}
	}
	return nil
}

// Prefix returns the subject prefix.
func (s Scheme) Prefix() string { return s.prefix }

// Direct returns the subject of a direct message from sender to receiver.
func (s Scheme) Direct(receiver, priority, sender string) (string, error) {
	if err := firstErr(ValidateToken("receiver id", receiver), ValidatePriority(priority), ValidateToken("sender id", sender)); err != nil {
		return "", err
	}
	return s.prefix + ".agent." + receiver + "." + priority + "." + sender, nil
}

// Topic returns the subject of a message published by sender on topic.
func (s Scheme) Topic(topic, priority, sender string) (string, error) {
	if err := firstErr(ValidateToken("topic", topic), ValidatePriority(priority), ValidateToken("sender id", sender)); err != nil {
		return "", err
	}
	return s.prefix + ".topic." + topic + "." + priority + "." + sender, nil
}

// Broadcast returns the subject of a broadcast from sender.
func (s Scheme) Broadcast(priority, sender string) (string, error) {
	if err := firstErr(ValidatePriority(priority), ValidateToken("sender id", sender)); err != nil {
		return "", err
	}
	return s.prefix + ".broadcast." + priority + "." + sender, nil
}

// Heartbeat returns the subject agent publishes its heartbeats on.
func (s Scheme) Heartbeat(agent string) (string, error) {
	if err := ValidateToken("agent id", agent); err != nil {
		return "", err
	}
	return s.prefix + ".hb." + agent, nil
}

// Probe returns the core NATS subject instance of agent answers liveness
// probes on, from its own connection: a request there that finds no
// subscriber means that connection is gone.
func (s Scheme) Probe(agent, instance string) (string, error) {
	if err := firstErr(ValidateToken("agent id", agent), ValidateToken("instance", instance)); err != nil {
		return "", err
	}
	return s.prefix + ".probe." + agent + "." + instance, nil
}

// ProbeFilter matches the probe subjects of every instance of agent.
func (s Scheme) ProbeFilter(agent string) (string, error) {
	if err := ValidateToken("agent id", agent); err != nil {
		return "", err
	}
	return s.prefix + ".probe." + agent + ".*", nil
}

// Alert returns the subject of an alert of severity about agent.
func (s Scheme) Alert(severity, agent string) (string, error) {
	if err := firstErr(ValidateSeverity(severity), ValidateToken("agent id", agent)); err != nil {
		return "", err
	}
	return s.prefix + ".alert." + severity + "." + agent, nil
}

// DLQ returns the dead-letter subject of a message from sender to receiver.
func (s Scheme) DLQ(receiver, priority, sender string) (string, error) {
	if err := firstErr(ValidateToken("receiver id", receiver), ValidatePriority(priority), ValidateToken("sender id", sender)); err != nil {
		return "", err
	}
	return s.prefix + ".dlq." + receiver + "." + priority + "." + sender, nil
}

// DirectFilter returns the filter matching every direct message to receiver at priority.
func (s Scheme) DirectFilter(receiver, priority string) (string, error) {
	if err := firstErr(ValidateToken("receiver id", receiver), ValidatePriority(priority)); err != nil {
		return "", err
	}
	return s.prefix + ".agent." + receiver + "." + priority + ".*", nil
}

// TopicFilter returns the filter matching every message on topic at priority.
func (s Scheme) TopicFilter(topic, priority string) (string, error) {
	if err := firstErr(ValidateToken("topic", topic), ValidatePriority(priority)); err != nil {
		return "", err
	}
	return s.prefix + ".topic." + topic + "." + priority + ".*", nil
}

// BroadcastFilter returns the filter matching every broadcast at priority.
func (s Scheme) BroadcastFilter(priority string) (string, error) {
	if err := ValidatePriority(priority); err != nil {
		return "", err
	}
	return s.prefix + ".broadcast." + priority + ".*", nil
}

// SentBy returns the filters matching every message from sender: direct,
// topic and broadcast subjects all end in the sender's id, which is what
// an agent's publish permissions rest on.
func (s Scheme) SentBy(sender string) ([]string, error) {
	if err := ValidateToken("sender id", sender); err != nil {
		return nil, err
	}
	return []string{s.prefix + ".agent.*.*." + sender, s.prefix + ".topic.*.*." + sender, s.prefix + ".broadcast.*." + sender}, nil
}

// HeartbeatFilter matches every agent's heartbeats.
func (s Scheme) HeartbeatFilter() string { return s.prefix + ".hb.*" }

// AlertFilter matches every alert.
func (s Scheme) AlertFilter() string { return s.prefix + ".alert.>" }

// StreamSubjects returns the subjects of the message stream
// ([Scheme.Stream]): exactly the direct, topic and broadcast shapes with
// the five priority tokens, so the server refuses a malformed subject at
// publish (no stream matches) instead of storing what no consumer reads.
func (s Scheme) StreamSubjects() []string {
	out := make([]string, 0, 3*len(Priorities))
	for _, p := range Priorities {
		out = append(out, s.prefix+".agent.*."+p+".*", s.prefix+".topic.*."+p+".*", s.prefix+".broadcast."+p+".*")
	}
	return out
}

// WideStreamSubjects returns the subjects the message stream had before
// [Scheme.StreamSubjects] was exact: a stream still bound to them stores
// malformed subjects, and "agentmesh migrate" narrows it.
func (s Scheme) WideStreamSubjects() []string {
	return []string{s.prefix + ".agent.>", s.prefix + ".topic.>", s.prefix + ".broadcast.>"}
}

// DLQSubjects returns the subjects of the dead-letter stream ([Scheme.DLQStream]).
func (s Scheme) DLQSubjects() []string { return []string{s.prefix + ".dlq.>"} }

// Stream returns the name of the message stream: "MESH" for the default prefix.
func (s Scheme) Stream() string { return s.stream }

// EventsStream returns the name of the stream capturing the message
// stream's consumer advisories: "MESH_EVENTS" for the default prefix.
func (s Scheme) EventsStream() string { return s.stream + "_EVENTS" }

// DLQStream returns the name of the dead-letter stream: "MESH_DLQ" for the default prefix.
func (s Scheme) DLQStream() string { return s.stream + "_DLQ" }

// EventsSubjects returns the subjects the events stream captures: the
// NAK, TERM and MAX_DELIVERIES advisories and the ack metric of the message
// stream's consumers — only those, so neither the monitor's own consumers
// on the events stream nor other consumer advisories (created, pinned, ...)
// feed into it — and the monitor's wake-up ([Scheme.MonitorWake]).
func (s Scheme) EventsSubjects() []string { return append(s.EventFilters(), s.MonitorWake()) }

// EventFilters returns the filters of the message stream's consumer
// events the ack monitor records: the NAK, TERM and MAX_DELIVERIES
// advisories and the ack metric.
func (s Scheme) EventFilters() []string {
	return []string{
		NakPrefix + "." + s.stream + ".*",
		TerminatedPrefix + "." + s.stream + ".*",
		MaxDeliveriesPrefix + "." + s.stream + ".*",
		AckMetricPrefix + "." + s.stream + ".*",
	}
}

// MonitorWake is the subject an ack monitor instance publishes to when no
// instance holds the events consumer's pin: the server pins whichever
// instance it delivers the wake-up to.
func (s Scheme) MonitorWake() string { return s.prefix + ".monitor.wake" }

// Consumer returns the durable consumer name of agent at priority:
// "<agent>_<priority>".
func (s Scheme) Consumer(agent, priority string) (string, error) {
	if err := firstErr(ValidateToken("agent id", agent), ValidatePriority(priority)); err != nil {
		return "", err
	}
	return agent + "_" + priority, nil
}

// ParseConsumer splits a consumer name built by [Scheme.Consumer]; it
// rejects fan-out and group consumers (see [Scheme.ParseConsumerName]).
func (s Scheme) ParseConsumer(name string) (agent, priority string, err error) {
	c, err := s.ParseConsumerName(name)
	if err == nil && (c.Priority == "" || c.Group != "") {
		err = fmt.Errorf("%w: consumer %q is no agent's direct consumer", ErrInvalidSubject, name)
	}
	if err != nil {
		return "", "", err
	}
	return c.Agent, c.Priority, nil
}

// ConsumerName is a parsed consumer name: an agent's direct consumer has
// Agent and Priority, its fan-out consumer Agent and Class, and a group's
// direct consumer (shared by the agents the group hosts) Group and
// Priority.
type ConsumerName struct {
	Agent    string
	Group    string
	Priority string // direct: one of Priorities
	Class    string // fan-out: one of FanoutClasses
}

// ParseConsumerName splits a consumer name built by [Scheme.Consumer],
// [Scheme.FanoutConsumer] or [Scheme.GroupConsumer].
func (s Scheme) ParseConsumerName(name string) (ConsumerName, error) {
	i := strings.LastIndexByte(name, '_')
	if i <= 0 {
		return ConsumerName{}, fmt.Errorf("%w: consumer %q has no <agent>_<priority> form", ErrInvalidSubject, name)
	}
	owner, suffix := name[:i], name[i+1:]
	c := ConsumerName{Agent: owner}
	kind, check := "agent id", ValidatePriority(suffix)
	if class, ok := strings.CutPrefix(suffix, fanoutMark); ok {
		c.Class, check = class, ValidateFanoutClass(class)
	} else if p, ok := strings.CutPrefix(suffix, groupMark); ok {
		c = ConsumerName{Group: owner, Priority: p}
		kind, check = "group", ValidatePriority(p)
	} else {
		c.Priority = suffix
	}
	if err := firstErr(ValidateToken(kind, owner), check); err != nil {
		return ConsumerName{}, fmt.Errorf("%w: consumer %q: %w", ErrInvalidSubject, name, err)
	}
	return c, nil
}

// groupMark starts a group consumer's suffix; no priority or fan-out
// class contains it, so a group's consumer never bears an agent's name.
const groupMark = "group-"

// CatchUpKey is the consumer metadata key that marks an agent's own direct
// consumer as the catch-up of its group (see [Scheme.GroupConsumer]): the
// decimal stream sequence up to which it delivers the agent's messages;
// the group delivers those after it.
const CatchUpKey = "agentmesh_catch_up_until"

// GroupConsumer returns the durable direct consumer of group at priority:
// "<group>_group-<priority>". Its filters are the direct filters (see
// [Scheme.DirectFilter]) of the agents the group hosts.
func (s Scheme) GroupConsumer(group, priority string) (string, error) {
	if err := firstErr(ValidateToken("group", group), ValidatePriority(priority)); err != nil {
		return "", err
	}
	return group + "_" + groupMark + priority, nil
}

// FanoutClasses lists the fan-out consumer classes. Each agent reads the
// broadcasts and topic messages it handles on one consumer per class
// (see [FanoutClass]), so an urgent one overtakes a backlog of bulk ones.
var FanoutClasses = []string{"urgent", "bulk"}

// fanoutMark starts a fan-out consumer's suffix; no priority contains "-",
// so a fan-out name never equals a direct one.
const fanoutMark = "fanout-"

// FanoutClass returns the class of priority p: "urgent" for critical and
// high, "bulk" for the rest.
func FanoutClass(p string) string {
	if p == "critical" || p == "high" {
		return "urgent"
	}
	return "bulk"
}

// FanoutPriorities returns the priorities of class, highest first.
func FanoutPriorities(class string) []string {
	var out []string
	for _, p := range Priorities {
		if FanoutClass(p) == class {
			out = append(out, p)
		}
	}
	return out
}

// ValidateFanoutClass checks that c is one of [FanoutClasses].
func ValidateFanoutClass(c string) error { return oneOf("fan-out class", c, FanoutClasses) }

// FanoutConsumer returns the durable consumer name of agent's fan-out
// class: "<agent>_fanout-<class>".
func (s Scheme) FanoutConsumer(agent, class string) (string, error) {
	if err := firstErr(ValidateToken("agent id", agent), ValidateFanoutClass(class)); err != nil {
		return "", err
	}
	return agent + "_" + fanoutMark + class, nil
}

// FanoutFilters returns the filters of a fan-out consumer of class: the
// broadcasts and the messages on each of topics at the class's priorities.
func (s Scheme) FanoutFilters(class string, topics []string) ([]string, error) {
	if err := ValidateFanoutClass(class); err != nil {
		return nil, err
	}
	prios := FanoutPriorities(class)
	out := make([]string, 0, len(prios)*(1+len(topics)))
	for _, p := range prios {
		out = append(out, s.prefix+".broadcast."+p+".*")
	}
	for _, t := range topics {
		if err := ValidateToken("topic", t); err != nil {
			return nil, err
		}
		for _, p := range prios {
			out = append(out, s.prefix+".topic."+t+"."+p+".*")
		}
	}
	return out, nil
}

// RegistryBucket is the KV bucket of the agent registry: "mesh_registry".
func (s Scheme) RegistryBucket() string { return s.prefix + "_registry" }

// StateBucket is the KV bucket of shared state: "mesh_state".
func (s Scheme) StateBucket() string { return s.prefix + "_state" }

// SessionsBucket is the KV bucket of sessions: "mesh_sessions".
func (s Scheme) SessionsBucket() string { return s.prefix + "_sessions" }

// PayloadsBucket is the object store of large payloads: "mesh_payloads".
func (s Scheme) PayloadsBucket() string { return s.prefix + "_payloads" }

// Subject is a parsed mesh subject. Fields that the kind does not carry are empty.
type Subject struct {
	Kind     Kind
	Receiver string // direct and DLQ
	Topic    string // topic
	Priority string // direct, topic, broadcast, DLQ
	Sender   string // direct, topic, broadcast, DLQ
	Agent    string // heartbeat and alert
	Severity string // alert
}

// Parse splits a subject of this scheme into its parts, validating every token.
func (s Scheme) Parse(subject string) (Subject, error) {
	rest, ok := strings.CutPrefix(subject, s.prefix+".")
	if !ok {
		return Subject{}, fmt.Errorf("%w: %q does not start with %q", ErrInvalidSubject, subject, s.prefix+".")
	}
	var buf [5]string // the longest subjects have 4 tokens after the prefix
	t := splitTokens(rest, buf[:0])
	var out Subject
	var err error
	switch Kind(t[0]) {
	case KindDirect, KindDLQ:
		if len(t) != 4 {
			break
		}
		out = Subject{Kind: Kind(t[0]), Receiver: t[1], Priority: t[2], Sender: t[3]}
		err = firstErr(ValidateToken("receiver id", t[1]), ValidatePriority(t[2]), ValidateToken("sender id", t[3]))
	case KindTopic:
		if len(t) != 4 {
			break
		}
		out = Subject{Kind: KindTopic, Topic: t[1], Priority: t[2], Sender: t[3]}
		err = firstErr(ValidateToken("topic", t[1]), ValidatePriority(t[2]), ValidateToken("sender id", t[3]))
	case KindBroadcast:
		if len(t) != 3 {
			break
		}
		out = Subject{Kind: KindBroadcast, Priority: t[1], Sender: t[2]}
		err = firstErr(ValidatePriority(t[1]), ValidateToken("sender id", t[2]))
	case KindHeartbeat:
		if len(t) != 2 {
			break
		}
		out = Subject{Kind: KindHeartbeat, Agent: t[1]}
		err = ValidateToken("agent id", t[1])
	case KindAlert:
		if len(t) != 3 {
			break
		}
		out = Subject{Kind: KindAlert, Severity: t[1], Agent: t[2]}
		err = firstErr(ValidateSeverity(t[1]), ValidateToken("agent id", t[2]))
	}
	if out.Kind == "" {
		return Subject{}, fmt.Errorf("%w: %q is not a mesh subject", ErrInvalidSubject, subject)
	}
	if err != nil {
		return Subject{}, fmt.Errorf("%w: %q: %w", ErrInvalidSubject, subject, err)
	}
	return out, nil
}

// splitTokens splits s at dots into buf without allocating; it stops after
// cap(buf) tokens, the rest landing in the last one (which then fails its
// token check).
func splitTokens(s string, buf []string) []string {
	for len(buf) < cap(buf)-1 {
		tok, rest, ok := strings.Cut(s, ".")
		buf = append(buf, tok)
		if !ok {
			return buf
		}
		s = rest
	}
	return append(buf, s)
}

func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
