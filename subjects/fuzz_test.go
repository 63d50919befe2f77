package subjects_test

import (
	"errors"
	"testing"

	"github.com/agentmesh-io/agentmesh/subjects"
)

// kinds is the number of kinds of name roundTrip builds.
const kinds = 9

// roundTrip builds a name of the kind sel selects from a, b and c, and
// returns the parts the parser must give back.
func roundTrip(s subjects.Scheme, sel uint8, a, b, c string) (name string, build error, parse func(string) (any, error), want any) {
	parseSubject := func(name string) (any, error) { return s.Parse(name) }
	parseKey := func(name string) (any, error) { return subjects.ParseRegistryKey(name) }
	switch sel % kinds {
	case 0:
		name, build = s.Direct(a, b, c)
		return name, build, parseSubject, subjects.Subject{Kind: subjects.KindDirect, Receiver: a, Priority: b, Sender: c}
	case 1:
		name, build = s.Topic(a, b, c)
		return name, build, parseSubject, subjects.Subject{Kind: subjects.KindTopic, Topic: a, Priority: b, Sender: c}
	case 2:
		name, build = s.Broadcast(a, b)
		return name, build, parseSubject, subjects.Subject{Kind: subjects.KindBroadcast, Priority: a, Sender: b}
	case 3:
		name, build = s.Heartbeat(a)
		return name, build, parseSubject, subjects.Subject{Kind: subjects.KindHeartbeat, Agent: a}
	case 4:
		name, build = s.Alert(a, b)
		return name, build, parseSubject, subjects.Subject{Kind: subjects.KindAlert, Severity: a, Agent: b}
	case 5:
		name, build = s.DLQ(a, b, c)
		return name, build, parseSubject, subjects.Subject{Kind: subjects.KindDLQ, Receiver: a, Priority: b, Sender: c}
	case 6:
		name, build = subjects.InstanceKey(a, b)
		return name, build, parseKey, subjects.RegistryKey{Kind: subjects.KeyInstance, Agent: a, Instance: b}
	case 7:
		name, build = subjects.MarkKey(a, b)
		return name, build, parseKey, subjects.RegistryKey{Kind: a, Agent: b}
	default:
		name, build = s.Consumer(a, b)
		parseConsumer := func(name string) (any, error) {
			agent, priority, err := s.ParseConsumer(name)
			return [2]string{agent, priority}, err
		}
		return name, build, parseConsumer, [2]string{a, b}
	}
}

// FuzzRoundTrip checks that whatever a builder accepts, the parser gives back
// exactly, and that whatever it rejects is rejected with ErrInvalidToken.
func FuzzRoundTrip(f *testing.F) {
	f.Add(uint8(0), "planner_1", "high", "orch_1")
	f.Add(uint8(1), "findings", "low", "agent-analyzer")
	f.Add(uint8(2), "critical", "supervisor", "")
	f.Add(uint8(3), "executor_1", "", "")
	f.Add(uint8(4), "warning", "executor_1", "")
	f.Add(uint8(5), "executor_1", "batch", "orch_1")
	f.Add(uint8(6), "executor_1", "Xk3dJ9aQ", "")
	f.Add(uint8(7), "health", "executor_1", "")
	f.Add(uint8(7), "unavailable", "a.b", "")
	f.Add(uint8(8), "planner_1_high", "normal", "")
	f.Add(uint8(0), "a.b", "high", "c")
	f.Add(uint8(8), "x", "medium", "")
	team, err := subjects.New("team_a")
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, sel uint8, a, b, c string) {
		for _, s := range []subjects.Scheme{subjects.Default, team} {
			name, buildErr, parse, want := roundTrip(s, sel, a, b, c)
			if buildErr != nil {
				if !errors.Is(buildErr, subjects.ErrInvalidToken) || name != "" {
					t.Fatalf("build(%d, %q, %q, %q) = %q, %v, want \"\" and ErrInvalidToken", sel%kinds, a, b, c, name, buildErr)
				}
				continue
			}
			got, err := parse(name)
			if err != nil || got != want {
				t.Fatalf("parse(%q) = %+v, %v, want %+v", name, got, err, want)
			}
		}
	})
}

// FuzzParse checks that whatever the parser accepts, the builders rebuild
// exactly: no two subjects parse to the same parts.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"mesh.agent.planner_1.high.orch_1", "mesh.topic.findings.low.a", "mesh.broadcast.batch.s",
		"mesh.hb.x", "mesh.alert.info.x", "mesh.dlq.r.normal.s", "mesh.agent..high.x", "mesh.hb.>", "planner_1_high",
		"agent.executor_1.Xk3dJ9aQ", "health.executor_1", "unavailable.x.y"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, subject string) {
		s := subjects.Default
		if p, err := s.Parse(subject); err == nil {
			var rebuilt string
			var err error
			switch p.Kind {
			case subjects.KindDirect:
				rebuilt, err = s.Direct(p.Receiver, p.Priority, p.Sender)
			case subjects.KindTopic:
				rebuilt, err = s.Topic(p.Topic, p.Priority, p.Sender)
			case subjects.KindBroadcast:
				rebuilt, err = s.Broadcast(p.Priority, p.Sender)
			case subjects.KindHeartbeat:
				rebuilt, err = s.Heartbeat(p.Agent)
			case subjects.KindAlert:
				rebuilt, err = s.Alert(p.Severity, p.Agent)
			case subjects.KindDLQ:
				rebuilt, err = s.DLQ(p.Receiver, p.Priority, p.Sender)
			default:
				t.Fatalf("Parse(%q) returned kind %q", subject, p.Kind)
			}
			if err != nil || rebuilt != subject {
				t.Fatalf("Parse(%q) = %+v, rebuilt %q, %v", subject, p, rebuilt, err)
			}
		} else if !errors.Is(err, subjects.ErrInvalidSubject) {
			t.Fatalf("Parse(%q): err = %v, want ErrInvalidSubject", subject, err)
		}
		if k, err := subjects.ParseRegistryKey(subject); err == nil {
			var rebuilt string
			switch k.Kind {
			case subjects.KeyInstance:
				rebuilt, err = subjects.InstanceKey(k.Agent, k.Instance)
			case subjects.KeyHost:
				rebuilt, err = subjects.HostKey(k.Group, k.Instance)
			default:
				rebuilt, err = subjects.MarkKey(k.Kind, k.Agent)
			}
			if err != nil || rebuilt != subject {
				t.Fatalf("ParseRegistryKey(%q) = %+v, rebuilt %q, %v", subject, k, rebuilt, err)
			}
		} else if !errors.Is(err, subjects.ErrInvalidSubject) {
			t.Fatalf("ParseRegistryKey(%q): err = %v, want ErrInvalidSubject", subject, err)
		}
		if agent, priority, err := s.ParseConsumer(subject); err == nil {
			if rebuilt, err := s.Consumer(agent, priority); err != nil || rebuilt != subject {
				t.Fatalf("ParseConsumer(%q) = %q, %q, rebuilt %q, %v", subject, agent, priority, rebuilt, err)
			}
		} else if !errors.Is(err, subjects.ErrInvalidSubject) {
			t.Fatalf("ParseConsumer(%q): err = %v, want ErrInvalidSubject", subject, err)
		}
		if ev, err := subjects.ParseEvent(subject); err == nil {
			if rebuilt, err := subjects.EventSubject(ev.Kind, ev.Stream, ev.Consumer); err != nil || rebuilt != subject {
				t.Fatalf("ParseEvent(%q) = %+v, rebuilt %q, %v", subject, ev, rebuilt, err)
			}
		} else if !errors.Is(err, subjects.ErrInvalidSubject) {
			t.Fatalf("ParseEvent(%q): err = %v, want ErrInvalidSubject", subject, err)
		}
	})
}
