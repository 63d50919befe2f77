package ackmonitor_test

import (
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/ackmonitor/store"
	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/dlq"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// termAll consumes worker_normal on the message stream as a receiver that
// terminates every message with the reason reasonOf gives it, until the
// test ends.
func termAll(t *testing.T, js jetstream.JetStream, reasonOf func(jetstream.Msg) string) {
	t.Helper()
	ctx := testCtx(t)
	if err := agentkit.EnsureStream(ctx, js, agentkit.StreamConfig(subjects.Default, 1)); err != nil {
		t.Fatal(err)
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, subjects.Default.Stream(), jetstream.ConsumerConfig{Durable: "worker_normal",
		FilterSubject: "mesh.agent.worker.normal.*", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	cc, err := cons.Consume(func(msg jetstream.Msg) {
		if err := msg.TermWithReason(reasonOf(msg)); err != nil {
			t.Errorf("term: %v", err)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cc.Stop)
}

// TestFollowUp_DeadLettersWhateverPeersWrote: originals and TERM reasons
// that would make a copy the server refuses at every try are dead-lettered
// all the same, what peers wrote bounded and marked where it was cut: a
// 100 KB TERM reason (cut within a two-byte character), a 60 KB header, a
// body that fills the max payload with its headers, and a JetStream
// header that holds for the message stream only.
func TestFollowUp_DeadLettersWhateverPeersWrote(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	st := openStore(t, sqliteStore)
	ctx := testCtx(t)
	js := m.jetstream()
	longReason := "x" + strings.Repeat("é", 50000)
	termAll(t, js, func(msg jetstream.Msg) string {
		if msg.Headers().Get(wire.HeaderAction) == "long_reason" {
			return longReason
		}
		return "REJECTED: no"
	})
	startMonitor(t, m.s, fastConfig(st))

	nc := m.conn()
	publish := func(action string, h nats.Header, body []byte) uint64 {
		t.Helper()
		if h == nil {
			h = nats.Header{}
		}
		h.Set(wire.HeaderAction, action)
		h.Set(jetstream.MsgIDHeader, action)
		ack, err := js.PublishMsg(ctx, &nats.Msg{Subject: "mesh.agent.worker.normal.client", Header: h, Data: body})
		if err != nil {
			t.Fatalf("%s: %v", action, err)
		}
		return ack.Sequence
	}
	seqs := map[string]uint64{
		"long_reason": publish("long_reason", nil, []byte(`{}`)),
		"long_header": publish("long_header", nats.Header{wire.HeaderTaskID: {strings.Repeat("t", 60<<10)}}, []byte(`{}`)),
		"full":        publish("full", nil, make([]byte, int(nc.MaxPayload())-200)),
		"expected":    publish("expected", nats.Header{jetstream.ExpectedStreamHeader: {subjects.Default.Stream()}}, []byte(`{}`)),
	}
	eventually(t, 30*time.Second, "every row recording its dead letter", func() bool {
		recs, err := st.Messages(ctx, store.Query{DeadLetter: true})
		return err == nil && len(recs) == len(seqs)
	})
	dlqStream, err := js.Stream(ctx, subjects.Default.DLQStream())
	if err != nil {
		t.Fatal(err)
	}
	copyOf := func(action string) *jetstream.RawStreamMsg {
		t.Helper()
		r, err := st.Get(ctx, store.Key{StreamSeq: seqs[action], Consumer: "worker_normal"})
		if err != nil {
			t.Fatal(err)
		}
		msg, err := dlqStream.GetMsg(ctx, r.DLQSeq)
		if err != nil {
			t.Fatal(err)
		}
		return msg
	}

	reason := copyOf("long_reason").Header.Get(dlq.HeaderReason)
	if len(reason) > 1024 || !utf8.ValidString(reason) || !strings.HasPrefix(reason, "terminated: xé") || !strings.HasSuffix(reason, "…(truncated)") {
		t.Errorf("reason of %d bytes, valid UTF-8 %v: %.40q ... %q", len(reason), utf8.ValidString(reason), reason, reason[max(len(reason)-20, 0):])
	}
	c := copyOf("long_header")
	if task := c.Header.Get(wire.HeaderTaskID); len(task) > 4096 || !strings.HasSuffix(task, "…(truncated)") {
		t.Errorf("task id header of %d bytes, ending %q", len(task), task[max(len(task)-20, 0):])
	}
	if string(c.Data) != `{}` {
		t.Errorf("body %q", c.Data)
	}
	c = copyOf("full")
	if len(c.Data) != 0 || c.Header.Get(dlq.HeaderBodyOmitted) == "" || c.Header.Get(dlq.HeaderStreamSeq) == "" {
		t.Errorf("copy of a message filling the max payload: %d bytes of body, headers %v", len(c.Data), c.Header)
	}
	c = copyOf("expected")
	if c.Header.Get(jetstream.ExpectedStreamHeader) != "" || string(c.Data) != `{}` {
		t.Errorf("copy with the original's expected stream: headers %v", c.Header)
	}
}
