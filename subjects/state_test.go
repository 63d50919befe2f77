package subjects_test

import (
	"errors"
	"testing"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/agentmesh-io/agentmesh/subjects"
)

// State keys are "<kind in lower case>.<id>" and parse back to the kind as
// entity_type spells it.
func TestStateKeys(t *testing.T) {
	t.Parallel()
	key, err := subjects.StateKey("TASK", "t1")
	if err != nil || key != "task.t1" {
		t.Fatalf("StateKey(TASK, t1) = %q, %v, want task.t1", key, err)
	}
	kind, id, err := subjects.ParseStateKey(key)
	if err != nil || kind != "TASK" || id != "t1" {
		t.Errorf("ParseStateKey(%q) = %q, %q, %v, want TASK, t1", key, kind, id, err)
	}
	for _, tok := range goodTokens {
		key, err := subjects.StateKey("AGENT", tok)
		if err != nil {
			t.Fatalf("StateKey(AGENT, %q): %v", tok, err)
		}
		if kind, id, err := subjects.ParseStateKey(key); err != nil || kind != "AGENT" || id != tok {
			t.Errorf("ParseStateKey(%q) = %q, %q, %v", key, kind, id, err)
		}
	}
	for _, tt := range badTokens {
		if _, err := subjects.StateKey("TASK", tt.give); err == nil {
			t.Errorf("StateKey(TASK, %s) accepted", tt.name)
		} else {
			wantInvalidToken(t, err, "entity id", tt.give)
		}
		if _, err := subjects.StateKey(tt.give, "t1"); err == nil {
			t.Errorf("StateKey(%s, t1) accepted", tt.name)
		} else {
			wantInvalidToken(t, err, "entity kind", tt.give)
		}
		if _, err := subjects.StateFilter(tt.give); !errors.Is(err, subjects.ErrInvalidToken) {
			t.Errorf("StateFilter(%s): err = %v, want ErrInvalidToken", tt.name, err)
		}
		if _, err := subjects.SessionKey(tt.give); err == nil {
			t.Errorf("SessionKey(%s) accepted", tt.name)
		} else {
			wantInvalidToken(t, err, "session id", tt.give)
		}
	}
	for _, key := range []string{"task", "task.", ".t1", "task.a.b", "task.*", ""} {
		if kind, id, err := subjects.ParseStateKey(key); !errors.Is(err, subjects.ErrInvalidSubject) {
			t.Errorf("ParseStateKey(%q) = %q, %q, %v, want ErrInvalidSubject", key, kind, id, err)
		}
	}

	tasks, err := subjects.StateFilter("TASK")
	if err != nil || tasks != "task.>" {
		t.Fatalf("StateFilter(TASK) = %q, %v, want task.>", tasks, err)
	}
	agent, _ := subjects.StateKey("AGENT", "t1")
	for _, tt := range []struct {
		key  string
		want bool
	}{{key, true}, {agent, false}} {
		if got := server.SubjectMatchesFilter(tt.key, tasks); got != tt.want {
			t.Errorf("%q matches %q: %v, want %v", tt.key, tasks, got, tt.want)
		}
	}

	if sess, err := subjects.SessionKey("sess_1"); err != nil || sess != "sess_1" {
		t.Errorf("SessionKey(sess_1) = %q, %v", sess, err)
	}
	if got := subjects.KVSubject("mesh_state", key); got != "$KV.mesh_state.task.t1" {
		t.Errorf("KVSubject = %q", got)
	}
}
