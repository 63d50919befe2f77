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
