package subjects_test

import (
	"testing"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/agentmesh-io/agentmesh/subjects"
)

// TestServerConstants checks the advisory and metric prefixes restated in
// subjects against nats-server's own constants (server/jetstream_api.go).
func TestServerConstants(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, got, want string }{
		{"AdvisoryPrefix", subjects.AdvisoryPrefix, server.JSAdvisoryPrefix},
		{"MetricPrefix", subjects.MetricPrefix, server.JSMetricPrefix},
		{"AckMetricPrefix", subjects.AckMetricPrefix, server.JSMetricConsumerAckPre},
		{"MaxDeliveriesPrefix", subjects.MaxDeliveriesPrefix, server.JSAdvisoryConsumerMaxDeliveryExceedPre},
		{"NakPrefix", subjects.NakPrefix, server.JSAdvisoryConsumerMsgNakPre},
		{"TerminatedPrefix", subjects.TerminatedPrefix, server.JSAdvisoryConsumerMsgTerminatedPre},
	} {
		if tc.got != tc.want {
			t.Errorf("subjects.%s = %q, server says %q", tc.name, tc.got, tc.want)
		}
	}
}

// TestServerSubjectMatching checks with the server's own matcher that each
// stream's filters capture exactly the subjects meant for it.
func TestServerSubjectMatching(t *testing.T) {
	t.Parallel()
	s := subjects.Default
	matches := func(subject string, filters []string) bool {
		for _, f := range filters {
			if server.SubjectMatchesFilter(subject, f) {
				return true
			}
		}
		return false
	}
	direct, _ := s.Direct("planner_1", "high", "orch_1")
	topic, _ := s.Topic("findings", "high", "orch_1")
	broadcast, _ := s.Broadcast("high", "orch_1")
	dlq, _ := s.DLQ("planner_1", "high", "orch_1")
	hb, _ := s.Heartbeat("planner_1")
	alert, _ := s.Alert("critical", "planner_1")
	for _, tc := range []struct {
		subject            string
		stream, dlqStream  bool
		heartbeat, alerted bool
	}{
		{direct, true, false, false, false},
		{topic, true, false, false, false},
		{broadcast, true, false, false, false},
		{dlq, false, true, false, false},
		{hb, false, false, true, false},
		{alert, false, false, false, true},
	} {
		if got := matches(tc.subject, s.StreamSubjects()); got != tc.stream {
			t.Errorf("%s matches StreamSubjects: %v, want %v", tc.subject, got, tc.stream)
		}
		if got := matches(tc.subject, s.DLQSubjects()); got != tc.dlqStream {
			t.Errorf("%s matches DLQSubjects: %v, want %v", tc.subject, got, tc.dlqStream)
		}
		if got := matches(tc.subject, []string{s.HeartbeatFilter()}); got != tc.heartbeat {
			t.Errorf("%s matches HeartbeatFilter: %v, want %v", tc.subject, got, tc.heartbeat)
		}
		if got := matches(tc.subject, []string{s.AlertFilter()}); got != tc.alerted {
			t.Errorf("%s matches AlertFilter: %v, want %v", tc.subject, got, tc.alerted)
		}
	}

	// Malformed shapes match no stream subject, so the server refuses them
	// at publish; the wide subjects of older streams stored them all.
	for _, bad := range []string{"mesh.agent.x.y", "mesh.agent.a.notapriority.b", "mesh.agent.a.high.b.c",
		"mesh.agent.a.HIGH.b", "mesh.topic.t.high", "mesh.broadcast.high", "mesh.broadcast.urgent.a", "mesh.broadcast.high.a.b"} {
		if matches(bad, s.StreamSubjects()) {
			t.Errorf("%s matches StreamSubjects", bad)
		}
		if !matches(bad, s.WideStreamSubjects()) {
			t.Errorf("%s does not match WideStreamSubjects", bad)
		}
	}
	for _, good := range []string{direct, topic, broadcast} {
		if !matches(good, s.WideStreamSubjects()) {
			t.Errorf("%s does not match WideStreamSubjects", good)
		}
	}

	// Fan-out filters: each class takes its own priorities only.
	urgent, _ := s.FanoutFilters("urgent", []string{"findings"})
	bulk, _ := s.FanoutFilters("bulk", []string{"findings"})
	for _, tc := range []struct {
		subject        string
		urgent, bulkOK bool
	}{
		{broadcast, true, false},
		{topic, true, false},
		{must2(s.Broadcast("critical", "orch_1")), true, false},
		{must2(s.Broadcast("batch", "orch_1")), false, true},
		{must2(s.Topic("findings", "normal", "orch_1")), false, true},
		{must2(s.Topic("other", "normal", "orch_1")), false, false},
		{direct, false, false},
	} {
		if matches(tc.subject, urgent) != tc.urgent || matches(tc.subject, bulk) != tc.bulkOK {
			t.Errorf("%s: urgent %v (want %v), bulk %v (want %v)", tc.subject, matches(tc.subject, urgent), tc.urgent, matches(tc.subject, bulk), tc.bulkOK)
		}
	}

	df, _ := s.DirectFilter("planner_1", "high")
	tf, _ := s.TopicFilter("findings", "high")
	bf, _ := s.BroadcastFilter("high")
	for _, tc := range []struct {
		filter, yes, no string
	}{
		{df, direct, must2(s.Direct("planner_1", "low", "orch_1"))},
		{tf, topic, must2(s.Topic("findings", "normal", "orch_1"))},
		{bf, broadcast, must2(s.Broadcast("critical", "orch_1"))},
	} {
		if !server.SubjectMatchesFilter(tc.yes, tc.filter) || server.SubjectMatchesFilter(tc.no, tc.filter) {
			t.Errorf("filter %s: matches %s = %v (want true), %s = %v (want false)", tc.filter,
				tc.yes, server.SubjectMatchesFilter(tc.yes, tc.filter), tc.no, server.SubjectMatchesFilter(tc.no, tc.filter))
		}
	}

	// The events stream captures its own stream's consumer events only.
	for _, kind := range []subjects.EventKind{subjects.EventAck, subjects.EventNak, subjects.EventTerminated, subjects.EventMaxDeliveries} {
		own, _ := subjects.EventSubject(kind, s.Stream(), "planner_1_high")
		other, _ := subjects.EventSubject(kind, s.EventsStream(), "monitor")
		if !matches(own, s.EventsSubjects()) || matches(other, s.EventsSubjects()) {
			t.Errorf("EventsSubjects %q: %s matched %v (want true), %s matched %v (want false)", s.EventsSubjects(),
				own, matches(own, s.EventsSubjects()), other, matches(other, s.EventsSubjects()))
		}
	}
	// ...and not the other consumer advisories of the stream.
	for _, pre := range []string{server.JSAdvisoryConsumerCreatedPre, server.JSAdvisoryConsumerDeletedPre, server.JSAdvisoryConsumerPinnedPre} {
		if subj := pre + "." + s.Stream() + ".planner_1_high"; matches(subj, s.EventsSubjects()) {
			t.Errorf("EventsSubjects captures %s", subj)
		}
	}
}

func must2(s string, err error) string {
	if err != nil {
		panic(err)
	}
	return s
}
