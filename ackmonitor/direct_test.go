package ackmonitor

import (
	"fmt"
	"testing"

	"github.com/agentmesh-io/agentmesh/ackmonitor/store"
)

// TestDirectEvents: the ids of the last events written are remembered, the
// oldest forgotten beyond the capacity, and events without an id never
// match.
func TestDirectEvents(t *testing.T) {
	d := newDirectEvents(3)
	ev := func(ids ...string) []store.Event {
		var es []store.Event
		for _, id := range ids {
			es = append(es, store.Event{ID: id})
		}
		return es
	}
	d.add(ev("a", "b", "", "b"))
	d.add(ev("c", "d"))
	for id, want := range map[string]bool{"a": false, "b": true, "c": true, "d": true, "": false, "e": false} {
		if got := d.written(id); got != want {
			t.Errorf("written(%q) = %v, want %v", id, got, want)
		}
	}
	for i := range 10 {
		d.add(ev(fmt.Sprint(i)))
	}
	if n := len(d.ids); n != 3 {
		t.Errorf("remembers %d ids, want 3", n)
	}
}
