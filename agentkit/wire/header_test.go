package wire_test

import (
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/agentkit/wire"
)

// TestHeaderMsgID_IsJetStreams checks that the message id header is the one
// JetStream deduplicates on; wire spells it out to stay free of nats.go.
func TestHeaderMsgID_IsJetStreams(t *testing.T) {
	if wire.HeaderMsgID != jetstream.MsgIDHeader {
		t.Fatalf("HeaderMsgID = %q, want jetstream.MsgIDHeader %q", wire.HeaderMsgID, jetstream.MsgIDHeader)
	}
}

func TestReplayOf(t *testing.T) {
	t.Parallel()
	id := "f9e48890-d98b-43d5-b104-67cb559cd814"
	for _, c := range []struct {
		msgID, want string
		replay      bool
	}{
		{id, id, false},
		{wire.ReplayID(id, 7), id, true},
		{wire.ReplayID(wire.ReplayID(id, 7), 12), id, true},
		{id + ":replay:", id + ":replay:", false},
		{id + ":replay:7x", id + ":replay:7x", false},
		{":replay:7", ":replay:7", false}, // names no message
		{"a:replay:b:replay:3", "a:replay:b", true},
	} {
		got, replay := wire.ReplayOf(c.msgID)
		if got != c.want || replay != c.replay {
			t.Errorf("ReplayOf(%q) = %q, %v; want %q, %v", c.msgID, got, replay, c.want, c.replay)
		}
	}
}

func TestMirrored(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		h    map[string][]string
		want bool
	}{
		{nil, false},
		{map[string][]string{wire.HeaderMsgID: {"m1"}, wire.HeaderTaskID: {"t1"}}, false},
		{map[string][]string{wire.HeaderType: {"request"}}, true},
		{map[string][]string{wire.HeaderType: {""}}, true}, // present, even empty
	} {
		if got := wire.Mirrored(c.h); got != c.want {
			t.Errorf("Mirrored(%v) = %v, want %v", c.h, got, c.want)
		}
	}
}
