package subjects_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/agentmesh-io/agentmesh/subjects"
)

// badTokens are rejected wherever an agent id, topic or prefix is expected.
var badTokens = []struct {
	name, give string
}{
	{"empty", ""},
	{"65 chars", strings.Repeat("a", subjects.MaxTokenLen+1)},
	{"dot", "planner.1"},
	{"star", "*"},
	{"gt", ">"},
	{"embedded wildcard", "plan*ner"},
	{"space", "planner 1"},
	{"tab", "planner\t1"},
	{"unicode", "planificación"},
	{"dollar", "$JS"},
}

// goodTokens are accepted everywhere a token is.
var goodTokens = []string{"a", "planner_1", "agent-analyzer", "A-Z_0-9", strings.Repeat("x", subjects.MaxTokenLen)}

// wantInvalidToken checks that err is an *InvalidTokenError for field and value.
func wantInvalidToken(t *testing.T, err error, field, value string) {
	t.Helper()
	if !errors.Is(err, subjects.ErrInvalidToken) {
		t.Fatalf("err = %v, want ErrInvalidToken", err)
	}
	var te *subjects.InvalidTokenError
	if !errors.As(err, &te) {
		t.Fatalf("err = %T, want *InvalidTokenError", err)
	}
	if te.Field != field || te.Value != value {
		t.Errorf("InvalidTokenError{Field: %q, Value: %q}, want {%q, %q}", te.Field, te.Value, field, value)
	}
	if te.Reason == "" || !strings.HasPrefix(te.Error(), "subjects: invalid "+field) {
		t.Errorf("Error() = %q, Reason = %q", te.Error(), te.Reason)
	}
}

func TestValidateToken(t *testing.T) {
	t.Parallel()
	for _, v := range goodTokens {
		if err := subjects.ValidateToken("agent id", v); err != nil {
			t.Errorf("ValidateToken(%q) = %v", v, err)
		}
	}
	for _, tc := range badTokens {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			wantInvalidToken(t, subjects.ValidateToken("agent id", tc.give), "agent id", tc.give)
		})
	}
}

func TestValidatePriorityAndSeverity(t *testing.T) {
	t.Parallel()
	for _, p := range subjects.Priorities {
		if err := subjects.ValidatePriority(p); err != nil {
			t.Errorf("ValidatePriority(%q) = %v", p, err)
		}
	}
	// "medium" is an envelope synonym; agentkit maps it to "normal" before
	// building a subject, so the subject scheme rejects it.
	for _, p := range []string{"", "medium", "HIGH", "urgent", "high.x"} {
		wantInvalidToken(t, subjects.ValidatePriority(p), "priority", p)
	}
	for _, s := range subjects.Severities {
		if err := subjects.ValidateSeverity(s); err != nil {
			t.Errorf("ValidateSeverity(%q) = %v", s, err)
		}
	}
	for _, s := range []string{"", "error", "Warning"} {
		wantInvalidToken(t, subjects.ValidateSeverity(s), "severity", s)
	}
}

// builder is one subject or name builder with its arguments.
type builder struct {
	name  string
	build func(s subjects.Scheme, args []string) (string, error)
	// fields names each argument as InvalidTokenError.Field reports it.
	fields []string
	give   []string
	want   string
}

var builders = []builder{
	{"Direct", func(s subjects.Scheme, a []string) (string, error) { return s.Direct(a[0], a[1], a[2]) },
		[]string{"receiver id", "priority", "sender id"}, []string{"planner_1", "high", "orch_1"}, "mesh.agent.planner_1.high.orch_1"},
	{"Topic", func(s subjects.Scheme, a []string) (string, error) { return s.Topic(a[0], a[1], a[2]) },
		[]string{"topic", "priority", "sender id"}, []string{"findings", "low", "agent-analyzer"}, "mesh.topic.findings.low.agent-analyzer"},
	{"Broadcast", func(s subjects.Scheme, a []string) (string, error) { return s.Broadcast(a[0], a[1]) },
		[]string{"priority", "sender id"}, []string{"critical", "supervisor"}, "mesh.broadcast.critical.supervisor"},
	{"Heartbeat", func(s subjects.Scheme, a []string) (string, error) { return s.Heartbeat(a[0]) },
		[]string{"agent id"}, []string{"executor_1"}, "mesh.hb.executor_1"},
	{"Probe", func(s subjects.Scheme, a []string) (string, error) { return s.Probe(a[0], a[1]) },
		[]string{"agent id", "instance"}, []string{"executor_1", "i-7"}, "mesh.probe.executor_1.i-7"},
	{"ProbeFilter", func(s subjects.Scheme, a []string) (string, error) { return s.ProbeFilter(a[0]) },
		[]string{"agent id"}, []string{"executor_1"}, "mesh.probe.executor_1.*"},
	{"Alert", func(s subjects.Scheme, a []string) (string, error) { return s.Alert(a[0], a[1]) },
		[]string{"severity", "agent id"}, []string{"warning", "executor_1"}, "mesh.alert.warning.executor_1"},
	{"DLQ", func(s subjects.Scheme, a []string) (string, error) { return s.DLQ(a[0], a[1], a[2]) },
		[]string{"receiver id", "priority", "sender id"}, []string{"executor_1", "batch", "orch_1"}, "mesh.dlq.executor_1.batch.orch_1"},
	{"DirectFilter", func(s subjects.Scheme, a []string) (string, error) { return s.DirectFilter(a[0], a[1]) },
		[]string{"receiver id", "priority"}, []string{"planner_1", "normal"}, "mesh.agent.planner_1.normal.*"},
	{"TopicFilter", func(s subjects.Scheme, a []string) (string, error) { return s.TopicFilter(a[0], a[1]) },
		[]string{"topic", "priority"}, []string{"findings", "high"}, "mesh.topic.findings.high.*"},
	{"BroadcastFilter", func(s subjects.Scheme, a []string) (string, error) { return s.BroadcastFilter(a[0]) },
		[]string{"priority"}, []string{"batch"}, "mesh.broadcast.batch.*"},
	{"Consumer", func(s subjects.Scheme, a []string) (string, error) { return s.Consumer(a[0], a[1]) },
		[]string{"agent id", "priority"}, []string{"planner_1", "critical"}, "planner_1_critical"},
}

// TestScheme_Builders builds every name with valid arguments, then replaces
// each argument in turn with every bad value and checks the error names it.
func TestScheme_Builders(t *testing.T) {
	t.Parallel()
	for _, b := range builders {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			got, err := b.build(subjects.Default, b.give)
			if err != nil || got != b.want {
				t.Fatalf("%s(%q) = %q, %v, want %q", b.name, b.give, got, err, b.want)
			}
			for i, field := range b.fields {
				bad := badTokens
				switch field {
				case "priority":
					bad = []struct{ name, give string }{{"empty", ""}, {"medium", "medium"}, {"upper", "HIGH"}, {"wildcard", "*"}}
				case "severity":
					bad = []struct{ name, give string }{{"empty", ""}, {"unknown", "error"}, {"wildcard", ">"}}
				}
				for _, tc := range bad {
					t.Run(field+"/"+tc.name, func(t *testing.T) {
						args := slices.Clone(b.give)
						args[i] = tc.give
						got, err := b.build(subjects.Default, args)
						if got != "" {
							t.Errorf("got %q with an error, want \"\"", got)
						}
						wantInvalidToken(t, err, field, tc.give)
					})
				}
				if field == "priority" || field == "severity" {
					continue
				}
				for _, v := range goodTokens {
					args := slices.Clone(b.give)
					args[i] = v
					if _, err := b.build(subjects.Default, args); err != nil {
						t.Errorf("%s with %s %q: %v", b.name, field, v, err)
					}
				}
			}
		})
	}
}

func TestScheme_Names(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		give subjects.Scheme
		want map[string]any
	}{
		{"default", subjects.Default, map[string]any{
			"Prefix":          "mesh",
			"Stream":          "MESH",
			"EventsStream":    "MESH_EVENTS",
			"DLQStream":       "MESH_DLQ",
			"RegistryBucket":  "mesh_registry",
			"StateBucket":     "mesh_state",
			"SessionsBucket":  "mesh_sessions",
			"PayloadsBucket":  "mesh_payloads",
			"HeartbeatFilter": "mesh.hb.*",
			"AlertFilter":     "mesh.alert.>",
			"StreamSubjects":  []string{"mesh.agent.*.critical.*", "mesh.topic.*.critical.*", "mesh.broadcast.critical.*", "mesh.agent.*.high.*", "mesh.topic.*.high.*", "mesh.broadcast.high.*", "mesh.agent.*.normal.*", "mesh.topic.*.normal.*", "mesh.broadcast.normal.*", "mesh.agent.*.low.*", "mesh.topic.*.low.*", "mesh.broadcast.low.*", "mesh.agent.*.batch.*", "mesh.topic.*.batch.*", "mesh.broadcast.batch.*"},
			"DLQSubjects":     []string{"mesh.dlq.>"},
			"EventsSubjects": []string{"$JS.EVENT.ADVISORY.CONSUMER.MSG_NAKED.MESH.*", "$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED.MESH.*",
				"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.MESH.*", "$JS.EVENT.METRIC.CONSUMER.ACK.MESH.*", "mesh.monitor.wake"},
		}},
		{"team_a", must(subjects.New("team_a")), map[string]any{
			"Prefix":          "team_a",
			"Stream":          "TEAM_A",
			"EventsStream":    "TEAM_A_EVENTS",
			"DLQStream":       "TEAM_A_DLQ",
			"RegistryBucket":  "team_a_registry",
			"StateBucket":     "team_a_state",
			"SessionsBucket":  "team_a_sessions",
			"PayloadsBucket":  "team_a_payloads",
			"HeartbeatFilter": "team_a.hb.*",
			"AlertFilter":     "team_a.alert.>",
			"StreamSubjects":  []string{"team_a.agent.*.critical.*", "team_a.topic.*.critical.*", "team_a.broadcast.critical.*", "team_a.agent.*.high.*", "team_a.topic.*.high.*", "team_a.broadcast.high.*", "team_a.agent.*.normal.*", "team_a.topic.*.normal.*", "team_a.broadcast.normal.*", "team_a.agent.*.low.*", "team_a.topic.*.low.*", "team_a.broadcast.low.*", "team_a.agent.*.batch.*", "team_a.topic.*.batch.*", "team_a.broadcast.batch.*"},
			"DLQSubjects":     []string{"team_a.dlq.>"},
			"EventsSubjects": []string{"$JS.EVENT.ADVISORY.CONSUMER.MSG_NAKED.TEAM_A.*", "$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED.TEAM_A.*",
				"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.TEAM_A.*", "$JS.EVENT.METRIC.CONSUMER.ACK.TEAM_A.*", "team_a.monitor.wake"},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := tc.give
			got := map[string]any{
				"Prefix":          s.Prefix(),
				"Stream":          s.Stream(),
				"EventsStream":    s.EventsStream(),
				"DLQStream":       s.DLQStream(),
				"RegistryBucket":  s.RegistryBucket(),
				"StateBucket":     s.StateBucket(),
				"SessionsBucket":  s.SessionsBucket(),
				"PayloadsBucket":  s.PayloadsBucket(),
				"HeartbeatFilter": s.HeartbeatFilter(),
				"AlertFilter":     s.AlertFilter(),
				"StreamSubjects":  s.StreamSubjects(),
				"DLQSubjects":     s.DLQSubjects(),
				"EventsSubjects":  s.EventsSubjects(),
			}
			for k, want := range tc.want {
				if g, ok := got[k].([]string); ok {
					if !slices.Equal(g, want.([]string)) {
						t.Errorf("%s() = %q, want %q", k, g, want)
					}
				} else if got[k] != want {
					t.Errorf("%s() = %q, want %q", k, got[k], want)
				}
			}
			d, err := s.Direct("planner_1", "high", "orch_1")
			if want := tc.want["Prefix"].(string) + ".agent.planner_1.high.orch_1"; err != nil || d != want {
				t.Errorf("Direct = %q, %v, want %q", d, err, want)
			}
		})
	}
}

func must(s subjects.Scheme, err error) subjects.Scheme {
	if err != nil {
		panic(err)
	}
	return s
}

func TestNew_InvalidPrefix(t *testing.T) {
	t.Parallel()
	for _, tc := range badTokens {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := subjects.New(tc.give)
			wantInvalidToken(t, err, "prefix", tc.give)
		})
	}
}

// Prefixes that differ only in case or in '-' versus '_' would share a
// stream name, so only one spelling is accepted.
func TestNew_PrefixesKeepStreamsDistinct(t *testing.T) {
	t.Parallel()
	for _, p := range []string{"team-a", "TEAM_A", "Team", "_team", "1team", strings.Repeat("a", 33)} {
		_, err := subjects.New(p)
		wantInvalidToken(t, err, "prefix", p)
	}
	if s := must(subjects.New("team_a")); s.Stream() != "TEAM_A" {
		t.Fatalf("stream = %q", s.Stream())
	}
}

func TestScheme_Parse(t *testing.T) {
	t.Parallel()
	team := must(subjects.New("team_a"))
	for _, tc := range []struct {
		name   string
		scheme subjects.Scheme
		give   string
		want   subjects.Subject
	}{
		{"direct", subjects.Default, "mesh.agent.planner_1.high.orch_1",
			subjects.Subject{Kind: subjects.KindDirect, Receiver: "planner_1", Priority: "high", Sender: "orch_1"}},
		{"topic", subjects.Default, "mesh.topic.findings.low.agent-analyzer",
			subjects.Subject{Kind: subjects.KindTopic, Topic: "findings", Priority: "low", Sender: "agent-analyzer"}},
		{"broadcast", subjects.Default, "mesh.broadcast.critical.supervisor",
			subjects.Subject{Kind: subjects.KindBroadcast, Priority: "critical", Sender: "supervisor"}},
		{"heartbeat", subjects.Default, "mesh.hb.executor_1",
			subjects.Subject{Kind: subjects.KindHeartbeat, Agent: "executor_1"}},
		{"alert", subjects.Default, "mesh.alert.warning.executor_1",
			subjects.Subject{Kind: subjects.KindAlert, Severity: "warning", Agent: "executor_1"}},
		{"dlq", subjects.Default, "mesh.dlq.executor_1.batch.orch_1",
			subjects.Subject{Kind: subjects.KindDLQ, Receiver: "executor_1", Priority: "batch", Sender: "orch_1"}},
		{"custom prefix", team, "team_a.agent.planner_1.normal.orch_1",
			subjects.Subject{Kind: subjects.KindDirect, Receiver: "planner_1", Priority: "normal", Sender: "orch_1"}},
		{"kind-named agent", subjects.Default, "mesh.agent.agent.high.topic",
			subjects.Subject{Kind: subjects.KindDirect, Receiver: "agent", Priority: "high", Sender: "topic"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := tc.scheme.Parse(tc.give)
			if err != nil || got != tc.want {
				t.Errorf("Parse(%q) = %+v, %v, want %+v", tc.give, got, err, tc.want)
			}
		})
	}
}

func TestScheme_Parse_Invalid(t *testing.T) {
	t.Parallel()
	team := must(subjects.New("team_a"))
	for _, tc := range []struct {
		name      string
		scheme    subjects.Scheme
		give      string
		wantToken bool // the cause is an *InvalidTokenError
	}{
		{"empty", subjects.Default, "", false},
		{"prefix only", subjects.Default, "mesh", false},
		{"prefix and dot", subjects.Default, "mesh.", false},
		{"wrong prefix", subjects.Default, "other.agent.planner_1.high.orch_1", false},
		{"prefix of prefix", subjects.Default, "meshy.agent.planner_1.high.orch_1", false},
		{"other scheme", team, "mesh.agent.planner_1.high.orch_1", false},
		{"unknown kind", subjects.Default, "mesh.queue.planner_1.high.orch_1", false},
		{"upper-case kind", subjects.Default, "mesh.AGENT.planner_1.high.orch_1", false},
		{"direct too short", subjects.Default, "mesh.agent.planner_1.high", false},
		{"direct too long", subjects.Default, "mesh.agent.planner_1.high.orch_1.x", false},
		{"topic too short", subjects.Default, "mesh.topic.findings.low", false},
		{"broadcast too short", subjects.Default, "mesh.broadcast.critical", false},
		{"broadcast too long", subjects.Default, "mesh.broadcast.critical.a.b", false},
		{"heartbeat too short", subjects.Default, "mesh.hb", false},
		{"heartbeat too long", subjects.Default, "mesh.hb.a.b", false},
		{"alert too short", subjects.Default, "mesh.alert.warning", false},
		{"dlq too long", subjects.Default, "mesh.dlq.a.high.b.c", false},
		{"bad priority", subjects.Default, "mesh.agent.planner_1.urgent.orch_1", true},
		{"medium priority", subjects.Default, "mesh.topic.findings.medium.orch_1", true},
		{"bad broadcast priority", subjects.Default, "mesh.broadcast.HIGH.orch_1", true},
		{"bad dlq priority", subjects.Default, "mesh.dlq.a.x.b", true},
		{"bad severity", subjects.Default, "mesh.alert.error.executor_1", true},
		{"empty receiver", subjects.Default, "mesh.agent..high.orch_1", true},
		{"empty sender", subjects.Default, "mesh.agent.planner_1.high.", true},
		{"wildcard sender", subjects.Default, "mesh.agent.planner_1.high.*", true},
		{"filter", subjects.Default, "mesh.alert.>", false},
		{"full wildcard receiver", subjects.Default, "mesh.agent.>.high.orch_1", true},
		{"65-char sender", subjects.Default, "mesh.broadcast.high." + strings.Repeat("s", 65), true},
		{"unicode agent", subjects.Default, "mesh.hb.agént", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := tc.scheme.Parse(tc.give)
			if !errors.Is(err, subjects.ErrInvalidSubject) {
				t.Fatalf("Parse(%q) = %+v, %v, want ErrInvalidSubject", tc.give, got, err)
			}
			if got != (subjects.Subject{}) {
				t.Errorf("Parse(%q) returned %+v with an error", tc.give, got)
			}
			if errors.Is(err, subjects.ErrInvalidToken) != tc.wantToken {
				t.Errorf("errors.Is(err, ErrInvalidToken) = %v, want %v (err: %v)", !tc.wantToken, tc.wantToken, err)
			}
			if !strings.Contains(err.Error(), tc.give) {
				t.Errorf("error %q does not quote the subject", err)
			}
		})
	}
}

func TestScheme_ConsumerRoundTrip(t *testing.T) {
	t.Parallel()
	for _, agent := range []string{"planner", "planner_1", "a_b_c", "x_high", "_", "__", "a_", "_a", "agent-analyzer", strings.Repeat("a", 64)} {
		for _, p := range subjects.Priorities {
			name, err := subjects.Default.Consumer(agent, p)
			if err != nil {
				t.Fatalf("Consumer(%q, %q): %v", agent, p, err)
			}
			if want := agent + "_" + p; name != want {
				t.Errorf("Consumer(%q, %q) = %q, want %q", agent, p, name, want)
			}
			gotAgent, gotPriority, err := subjects.Default.ParseConsumer(name)
			if err != nil || gotAgent != agent || gotPriority != p {
				t.Errorf("ParseConsumer(%q) = %q, %q, %v, want %q, %q", name, gotAgent, gotPriority, err, agent, p)
			}
		}
	}
}

func TestScheme_ParseConsumer_Invalid(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		give      string
		wantToken bool
	}{
		{"", false},
		{"planner", false},
		{"_high", false},
		{"planner_", true},
		{"planner_urgent", true},
		{"planner_medium", true},
		{"planner_HIGH", true},
		{"planner.1_high", true},
		{"planner 1_high", true},
		{"*_high", true},
		{strings.Repeat("a", 65) + "_high", true},
	} {
		t.Run(tc.give, func(t *testing.T) {
			t.Parallel()
			agent, priority, err := subjects.Default.ParseConsumer(tc.give)
			if !errors.Is(err, subjects.ErrInvalidSubject) {
				t.Fatalf("ParseConsumer(%q) = %q, %q, %v, want ErrInvalidSubject", tc.give, agent, priority, err)
			}
			if agent != "" || priority != "" {
				t.Errorf("ParseConsumer(%q) returned %q, %q with an error", tc.give, agent, priority)
			}
			if errors.Is(err, subjects.ErrInvalidToken) != tc.wantToken {
				t.Errorf("errors.Is(err, ErrInvalidToken) = %v, want %v (err: %v)", !tc.wantToken, tc.wantToken, err)
			}
		})
	}
}

func TestEventSubject_RoundTrip(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		kind subjects.EventKind
		want string
	}{
		{subjects.EventAck, "$JS.EVENT.METRIC.CONSUMER.ACK.MESH.planner_1_high"},
		{subjects.EventNak, "$JS.EVENT.ADVISORY.CONSUMER.MSG_NAKED.MESH.planner_1_high"},
		{subjects.EventTerminated, "$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED.MESH.planner_1_high"},
		{subjects.EventMaxDeliveries, "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.MESH.planner_1_high"},
	} {
		t.Run(string(tc.kind), func(t *testing.T) {
			t.Parallel()
			got, err := subjects.EventSubject(tc.kind, "MESH", "planner_1_high")
			if err != nil || got != tc.want {
				t.Fatalf("EventSubject(%s) = %q, %v, want %q", tc.kind, got, err, tc.want)
			}
			ev, err := subjects.ParseEvent(got)
			want := subjects.Event{Kind: tc.kind, Stream: "MESH", Consumer: "planner_1_high"}
			if err != nil || ev != want {
				t.Errorf("ParseEvent(%q) = %+v, %v, want %+v", got, ev, err, want)
			}
		})
	}
	if _, err := subjects.EventSubject("CREATED", "MESH", "c"); !errors.Is(err, subjects.ErrInvalidSubject) {
		t.Errorf("EventSubject(CREATED): err = %v, want ErrInvalidSubject", err)
	}
}

func TestParseEvent_Invalid(t *testing.T) {
	t.Parallel()
	for _, give := range []string{
		"",
		"$JS.EVENT.METRIC.CONSUMER.ACK",
		"$JS.EVENT.METRIC.CONSUMER.ACK.",
		"$JS.EVENT.METRIC.CONSUMER.ACK.MESH",
		"$JS.EVENT.METRIC.CONSUMER.ACK.MESH.",
		"$JS.EVENT.METRIC.CONSUMER.ACK..c",
		"$JS.EVENT.METRIC.CONSUMER.ACK.MESH.c.extra",
		"$JS.EVENT.ADVISORY.CONSUMER.MSG_NAKED.MESH",
		"$JS.EVENT.ADVISORY.CONSUMER.CREATED.MESH.c",
		"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIESX.MESH.c",
		"$JS.EVENT.ADVISORY.STREAM.CREATED.MESH",
		"mesh.agent.planner_1.high.orch_1",
	} {
		if ev, err := subjects.ParseEvent(give); !errors.Is(err, subjects.ErrInvalidSubject) || ev != (subjects.Event{}) {
			t.Errorf("ParseEvent(%q) = %+v, %v, want ErrInvalidSubject", give, ev, err)
		}
	}
}

// TestPrefixes checks the advisory prefixes compose as documented. Their
// equality with the server's constants is in server_constants_test.go.
func TestPrefixes(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ got, want string }{
		{subjects.AdvisoryConsumerPrefix, "$JS.EVENT.ADVISORY.CONSUMER"},
		{subjects.AckMetricPrefix, "$JS.EVENT.METRIC.CONSUMER.ACK"},
		{subjects.MaxDeliveriesPrefix, "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES"},
		{subjects.NakPrefix, "$JS.EVENT.ADVISORY.CONSUMER.MSG_NAKED"},
		{subjects.TerminatedPrefix, "$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
}

// SentBy matches every message subject of its sender and none of another
// agent's or of another kind.
func TestScheme_SentBy(t *testing.T) {
	t.Parallel()
	s := subjects.Default
	filters, err := s.SentBy("orch_1")
	if err != nil {
		t.Fatal(err)
	}
	matched := func(subject string) bool {
		return slices.ContainsFunc(filters, func(f string) bool { return server.SubjectMatchesFilter(subject, f) })
	}
	for _, sender := range []string{"orch_1", "orch_2"} {
		direct, _ := s.Direct("planner_1", "high", sender)
		topic, _ := s.Topic("findings", "low", sender)
		broadcast, _ := s.Broadcast("critical", sender)
		for _, subject := range []string{direct, topic, broadcast} {
			if matched(subject) != (sender == "orch_1") {
				t.Errorf("%s: matched %v by %v", subject, matched(subject), filters)
			}
		}
	}
	hb, _ := s.Heartbeat("orch_1")
	dlq, _ := s.DLQ("planner_1", "high", "orch_1")
	for _, subject := range []string{hb, dlq} {
		if matched(subject) {
			t.Errorf("%s matched by %v", subject, filters)
		}
	}
	if _, err := s.SentBy("orch.1"); !errors.Is(err, subjects.ErrInvalidToken) {
		t.Errorf("SentBy(orch.1): err = %v, want ErrInvalidToken", err)
	}
}

// The registry's key filters match exactly the keys they name.
func TestRegistryKeys(t *testing.T) {
	t.Parallel()
	instance, _ := subjects.InstanceKey("executor_1", "i1")
	other, _ := subjects.InstanceKey("executor_10", "i1")
	health, _ := subjects.MarkKey(subjects.KeyHealth, "executor_1")
	unavailable, _ := subjects.MarkKey(subjects.KeyUnavailable, "executor_1")
	instances, _ := subjects.InstancesFilter("executor_1")
	healthMarks, _ := subjects.MarksFilter(subjects.KeyHealth)
	for _, tt := range []struct {
		key, filter string
		want        bool
	}{
		{instance, instances, true},
		{other, instances, false},
		{health, instances, false},
		{health, healthMarks, true},
		{unavailable, healthMarks, false},
	} {
		if got := server.SubjectMatchesFilter(tt.key, tt.filter); got != tt.want {
			t.Errorf("%q matches %q: %v, want %v", tt.key, tt.filter, got, tt.want)
		}
	}
	if got := subjects.KVSubject("mesh_registry", instance); got != "$KV.mesh_registry.agent.executor_1.i1" {
		t.Errorf("KVSubject = %q", got)
	}
	if _, err := subjects.MarkKey("agent", "executor_1"); !errors.Is(err, subjects.ErrInvalidToken) {
		t.Errorf("MarkKey(agent): err = %v, want ErrInvalidToken", err)
	}
	for _, key := range []string{"agent.executor_1", "health.a.b", "status.a", "agent.a.>", "health.", ""} {
		if k, err := subjects.ParseRegistryKey(key); !errors.Is(err, subjects.ErrInvalidSubject) {
			t.Errorf("ParseRegistryKey(%q) = %+v, %v, want ErrInvalidSubject", key, k, err)
		}
	}
}

func TestConsumerNames(t *testing.T) {
	t.Parallel()
	s := subjects.Default
	for _, tc := range []struct {
		agent, class string
	}{{"planner_1", "urgent"}, {"a-b_c", "bulk"}} {
		name, err := s.FanoutConsumer(tc.agent, tc.class)
		if err != nil {
			t.Fatal(err)
		}
		c, err := s.ParseConsumerName(name)
		if err != nil || c != (subjects.ConsumerName{Agent: tc.agent, Class: tc.class}) {
			t.Errorf("ParseConsumerName(%q) = %+v, %v", name, c, err)
		}
		if _, _, err := s.ParseConsumer(name); !errors.Is(err, subjects.ErrInvalidSubject) {
			t.Errorf("ParseConsumer(%q) accepted a fan-out consumer: %v", name, err)
		}
	}
	// No agent's direct consumer is named like another agent's fan-out one.
	direct, _ := s.Consumer("x_fanout-urgent", "high")
	if c, err := s.ParseConsumerName(direct); err != nil || c.Agent != "x_fanout-urgent" || c.Priority != "high" {
		t.Errorf("ParseConsumerName(%q) = %+v, %v", direct, c, err)
	}
	for _, bad := range []string{"x_fanout-critical", "x_fanout-", "_fanout-urgent", "x_urgent"} {
		if _, err := s.ParseConsumerName(bad); !errors.Is(err, subjects.ErrInvalidSubject) {
			t.Errorf("ParseConsumerName(%q) = %v, want ErrInvalidSubject", bad, err)
		}
	}
	// A group's consumer is neither an agent's direct nor its fan-out one.
	group, err := s.GroupConsumer("workers", "high")
	if err != nil || group != "workers_group-high" {
		t.Fatalf("GroupConsumer = %q, %v", group, err)
	}
	if c, err := s.ParseConsumerName(group); err != nil || c != (subjects.ConsumerName{Group: "workers", Priority: "high"}) {
		t.Errorf("ParseConsumerName(%q) = %+v, %v", group, c, err)
	}
	if _, _, err := s.ParseConsumer(group); !errors.Is(err, subjects.ErrInvalidSubject) {
		t.Errorf("ParseConsumer(%q) accepted a group consumer: %v", group, err)
	}
	for _, bad := range []string{"w_group-urgent", "w_group-", "_group-high", "w.x_group-high"} {
		if _, err := s.ParseConsumerName(bad); !errors.Is(err, subjects.ErrInvalidSubject) {
			t.Errorf("ParseConsumerName(%q) = %v, want ErrInvalidSubject", bad, err)
		}
	}
	if _, err := s.GroupConsumer("a.b", "high"); !errors.Is(err, subjects.ErrInvalidToken) {
		t.Errorf("GroupConsumer with a bad group name: %v", err)
	}
	if _, err := s.FanoutConsumer("a", "critical"); !errors.Is(err, subjects.ErrInvalidToken) {
		t.Errorf("FanoutConsumer with a priority for a class: %v", err)
	}
	if got := subjects.FanoutPriorities("urgent"); !slices.Equal(got, []string{"critical", "high"}) {
		t.Errorf("FanoutPriorities(urgent) = %q", got)
	}
	if got := subjects.FanoutPriorities("bulk"); !slices.Equal(got, []string{"normal", "low", "batch"}) {
		t.Errorf("FanoutPriorities(bulk) = %q", got)
	}
}
