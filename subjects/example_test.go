package subjects_test

import (
	"errors"
	"fmt"

	"github.com/agentmesh-io/agentmesh/subjects"
)

func ExampleScheme_Direct() {
	subject, err := subjects.Default.Direct("planner_1", "high", "orch_1")
	fmt.Println(subject, err)

	_, err = subjects.Default.Direct("planner.1", "high", "orch_1")
	fmt.Println(errors.Is(err, subjects.ErrInvalidToken))
	fmt.Println(err)
	// Output:
	// mesh.agent.planner_1.high.orch_1 <nil>
	// true
	// subjects: invalid receiver id "planner.1": character '.' at byte 7 is not in [A-Za-z0-9_-]
}

func ExampleScheme_Parse() {
	team, err := subjects.New("team_a")
	if err != nil {
		fmt.Println(err)
		return
	}
	s, err := team.Parse("team_a.topic.findings.low.agent-analyzer")
	fmt.Printf("%s topic=%s priority=%s sender=%s %v\n", s.Kind, s.Topic, s.Priority, s.Sender, err)

	_, err = team.Parse("team_a.agent.planner_1.urgent.orch_1")
	fmt.Println(errors.Is(err, subjects.ErrInvalidSubject), errors.Is(err, subjects.ErrInvalidToken))
	// Output:
	// topic topic=findings priority=low sender=agent-analyzer <nil>
	// true true
}

func ExampleScheme_Consumer() {
	name, _ := subjects.Default.Consumer("planner_1", "critical")
	fmt.Println(name)

	agent, priority, err := subjects.Default.ParseConsumer(name)
	fmt.Println(agent, priority, err)
	// Output:
	// planner_1_critical
	// planner_1 critical <nil>
}
