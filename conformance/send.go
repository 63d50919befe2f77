package conformance

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/agentkit/wire"
)

// kitType is the sender_type the kit writes, so replies must carry it
// back as receiver_type.
const kitType = "conformance-kit"

// headerRoom is what PROTOCOL.md §4 leaves under the server's max payload
// for headers: a larger envelope goes through the object store.
const headerRoom = 4096

// envelope returns a new envelope from the kit to the agent.
func (p *peer) envelope(typ wire.MessageType, action string, prio wire.Priority) *wire.Envelope {
	e := wire.NewEnvelope(typ, p.cfg.KitID, action)
	e.Priority = prio
	e.SenderType = kitType
	e.ReceiverID = p.cfg.AgentID
	return e
}

// headersOf returns the headers PROTOCOL.md §4 mirrors from e.
func headersOf(e *wire.Envelope) nats.Header {
	h := nats.Header{}
	h.Set(wire.HeaderMsgID, e.MessageID)
	h.Set(wire.HeaderType, string(e.MessageType))
	h.Set(wire.HeaderAction, e.Action)
	for name, v := range map[string]string{
		wire.HeaderTaskID: e.TaskID, wire.HeaderInReplyTo: e.InReplyTo, wire.HeaderCorrelation: e.Correlation,
		wire.HeaderWorkflow: e.WorkflowID, wire.HeaderStatus: e.Status,
	} {
		if v != "" {
			h.Set(name, v)
		}
	}
	return h
}

// publish stores one message in the stream and returns its sequence.
func (p *peer) publish(t *testing.T, subject string, h nats.Header, body []byte) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), p.cfg.Timeout)
	defer cancel()
	ack, err := p.js.PublishMsg(ctx, &nats.Msg{Subject: subject, Header: h, Data: body})
	if err != nil {
		t.Fatalf("publish to %s: %v", subject, err)
	}
	if ack.Duplicate {
		t.Fatalf("publish to %s: the stream dropped it as a duplicate of %s", subject, h.Get(wire.HeaderMsgID))
	}
	return ack.Sequence
}

// send encodes e and publishes it to the agent's direct subject at its
// priority, with the mirrored headers.
func (p *peer) send(t *testing.T, e *wire.Envelope) uint64 {
	t.Helper()
	body, err := e.Encode()
	if err != nil {
		t.Fatalf("encode: %v", err)
	}
	return p.publish(t, p.toAgent(string(e.Priority)), headersOf(e), body)
}

// settled waits until the agent acks or terminates message seq.
func (p *peer) settled(t *testing.T, seq uint64, what string) event {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), p.cfg.Timeout)
	defer cancel()
	ev, _, err := p.events.await(ctx, seq)
	if err != nil {
		t.Fatalf("%s: %v (an ack is seen through the consumer's ack metric: sample_freq must be \"100\")", what, err)
	}
	return ev
}

// acked checks that the agent acks message seq on consumer.
func (p *peer) acked(t *testing.T, seq uint64, consumer, what string) {
	t.Helper()
	ev := p.settled(t, seq, what)
	if ev.Kind != "ack" {
		t.Fatalf("%s: want Ack, the agent terminated it with reason %q", what, ev.Reason)
	}
	if ev.Consumer != consumer {
		t.Errorf("%s: acked on consumer %s, want %s", what, ev.Consumer, consumer)
	}
}

// termed checks that the agent terminates message seq and returns the
// reason, which PROTOCOL.md §5 bounds to 512 bytes.
func (p *peer) termed(t *testing.T, seq uint64, what string) string {
	t.Helper()
	ev := p.settled(t, seq, what)
	if ev.Kind != "term" {
		t.Fatalf("%s: want Term, the agent acked it", what)
	}
	if len(ev.Reason) > 512 {
		t.Errorf("%s: TERM reason of %d bytes, at most 512 allowed", what, len(ev.Reason))
	}
	return ev.Reason
}

// reply waits for the agent's reply of type typ to req, resolves a large
// one from the object store, and checks what PROTOCOL.md §6 and §4 say
// every reply carries: its subject, ids copied from the request, and the
// mirrored headers.
func (p *peer) reply(t *testing.T, req *wire.Envelope, typ wire.MessageType) *wire.Envelope {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), p.cfg.Timeout)
	defer cancel()
	m, err := p.sent.await(ctx, req.MessageID, typ)
	if err != nil {
		for _, s := range p.sent.replies(req.MessageID) {
			t.Logf("reply that does not count: subject %s, decode error %v, body %.300s", s.Subject, s.err, s.Data)
		}
		t.Fatalf("%s %s: %v", req.MessageType, req.Action, err)
	}
	env := m.env
	if ref := m.Header.Get(wire.HeaderEnvelopeRef); ref != "" {
		env = p.claim(t, m)
	}
	what := fmt.Sprintf("%s answering %s %s", typ, req.MessageType, req.Action)
	if want := p.direct(p.cfg.KitID, string(req.Priority), p.cfg.AgentID); m.Subject != want {
		t.Errorf("%s: subject %s, want %s", what, m.Subject, want)
	}
	wantCorr := req.Correlation
	if wantCorr == "" {
		wantCorr = req.MessageID
	}
	for _, f := range []struct{ field, got, want string }{
		{"sender_id", env.SenderID, p.cfg.AgentID},
		{"receiver_id", env.ReceiverID, p.cfg.KitID},
		{"receiver_type", env.ReceiverType, req.SenderType},
		{"priority", string(env.Priority), string(req.Priority)},
		{"in_reply_to", env.InReplyTo, req.MessageID},
		{"correlation_id", env.Correlation, wantCorr},
		{"workflow_id", env.WorkflowID, req.WorkflowID},
		{"task_id", env.TaskID, req.TaskID},
		{"session_id", env.SessionID, req.SessionID},
		{"topic", env.Topic, ""},
	} {
		if f.got != f.want {
			t.Errorf("%s: %s %q, want %q", what, f.field, f.got, f.want)
		}
	}
	if env.MessageID == req.MessageID {
		t.Errorf("%s: reuses the request's message_id", what)
	}
	if !jsonEqual(env.Context, req.Context) {
		t.Errorf("%s: context %s, want %s (copied)", what, env.Context, req.Context)
	}
	checkHeaders(t, what, m.Header, env)
	return env
}

// checkHeaders checks the headers PROTOCOL.md §4 mirrors from the
// envelope: each header present on a message equals its field, and
// Nats-Msg-Id is present, as is, on a message with Mesh-Type (a mirroring
// sender's), the mirror of every field that is set.
func checkHeaders(t *testing.T, what string, h nats.Header, e *wire.Envelope) {
	t.Helper()
	_, mirrors := h[wire.HeaderType]
	for _, f := range []struct {
		name, want string
		required   bool
	}{
		{wire.HeaderMsgID, e.MessageID, true},
		{wire.HeaderType, string(e.MessageType), false},
		{wire.HeaderAction, e.Action, mirrors && e.Action != ""},
		{wire.HeaderInReplyTo, e.InReplyTo, mirrors && e.InReplyTo != ""},
		{wire.HeaderCorrelation, e.Correlation, mirrors && e.Correlation != ""},
		{wire.HeaderWorkflow, e.WorkflowID, mirrors && e.WorkflowID != ""},
		{wire.HeaderTaskID, e.TaskID, mirrors && e.TaskID != ""},
		{wire.HeaderStatus, e.Status, mirrors && e.Status != ""},
	} {
		vals, ok := h[f.name]
		switch {
		case !ok && f.required:
			t.Errorf("%s: header %s missing, want %q", what, f.name, f.want)
		case ok && (len(vals) != 1 || vals[0] != f.want):
			t.Errorf("%s: header %s = %q, want [%q]", what, f.name, vals, f.want)
		}
	}
	if _, ok := h["Nats-Pin-Id"]; ok {
		t.Errorf("%s: carries a Nats-Pin-Id header, which receivers terminate", what)
	}
}

// payloads returns the mesh's large-payload object store, creating it as
// PROTOCOL.md §2 describes when the agent has not.
func (p *peer) payloads(t *testing.T) jetstream.ObjectStore {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), p.cfg.Timeout)
	defer cancel()
	name := p.cfg.Prefix + "_payloads"
	s, err := p.js.ObjectStore(ctx, name)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		s, err = p.js.CreateObjectStore(ctx, jetstream.ObjectStoreConfig{Bucket: name, TTL: 7 * 24 * time.Hour, Storage: jetstream.FileStorage})
		if errors.Is(err, jetstream.ErrBucketExists) {
			s, err = p.js.ObjectStore(ctx, name)
		}
	}
	if err != nil {
		t.Fatalf("object store %s: %v", name, err)
	}
	return s
}

// chunkSize is the object chunk size PROTOCOL.md §12 asks for: at most
// 128 KiB and the server's max payload less 1 KiB.
func (p *peer) chunkSize() uint32 {
	return uint32(min(128<<10, max(p.nc.MaxPayload()-1024, 1024)))
}

// offload stores e's encoding in the object store and returns the stub
// and headers to publish in its place (PROTOCOL.md §7).
func (p *peer) offload(t *testing.T, e *wire.Envelope) ([]byte, nats.Header) {
	t.Helper()
	full, err := e.Encode()
	if err != nil {
		t.Fatalf("encode: %v", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), p.cfg.Timeout)
	defer cancel()
	meta := jetstream.ObjectMeta{Name: e.MessageID, Opts: &jetstream.ObjectMetaOptions{ChunkSize: p.chunkSize()}}
	if _, err := p.payloads(t).Put(ctx, meta, bytes.NewReader(full)); err != nil {
		t.Fatalf("store large envelope: %v", err)
	}
	stub := *e
	stub.Payload, stub.Context, stub.Metadata = nil, nil, nil
	body, err := stub.Encode()
	if err != nil {
		t.Fatalf("encode stub: %v", err)
	}
	h := headersOf(e)
	h.Set(wire.HeaderEnvelopeRef, e.MessageID)
	return body, h
}

// claim reads the full envelope of a large reply m from the object store,
// checks it as a receiver must (PROTOCOL.md §7) and deletes the object,
// as the receiver of a direct message does after it acks.
func (p *peer) claim(t *testing.T, m *sentMsg) *wire.Envelope {
	t.Helper()
	ref, id := m.Header.Get(wire.HeaderEnvelopeRef), m.Header.Get(wire.HeaderMsgID)
	if ref != id {
		t.Fatalf("large reply: %s %q is not its %s %q", wire.HeaderEnvelopeRef, ref, wire.HeaderMsgID, id)
	}
	if m.env == nil {
		t.Fatalf("large reply: stub is not a valid envelope: %v", m.err)
	}
	if m.env.Payload != nil || m.env.Context != nil || m.env.Metadata != nil {
		t.Errorf("large reply: stub keeps payload, context or metadata, which PROTOCOL.md §7 strips")
	}
	ctx, cancel := context.WithTimeout(t.Context(), p.cfg.Timeout)
	defer cancel()
	store := p.payloads(t)
	obj, err := store.Get(ctx, ref)
	if err != nil {
		t.Fatalf("large reply: object %s: %v", ref, err)
	}
	data, err := io.ReadAll(io.LimitReader(obj, wire.DefaultMaxEnvelopeBytes+1))
	obj.Close()
	if err != nil {
		t.Fatalf("large reply: read object %s: %v", ref, err)
	}
	if len(data) > wire.DefaultMaxEnvelopeBytes {
		t.Fatalf("large reply: object %s exceeds %d bytes", ref, wire.DefaultMaxEnvelopeBytes)
	}
	env, err := wire.Decode(data)
	if err != nil {
		t.Fatalf("large reply: object %s is not a valid envelope: %v", ref, err)
	}
	if env.MessageID != id {
		t.Fatalf("large reply: object's message_id %q, the message's %q", env.MessageID, id)
	}
	a, errA := stubOf(env).AppendJSON(nil)
	b, errB := m.env.AppendJSON(nil)
	if errA != nil || errB != nil || !bytes.Equal(a, b) {
		t.Errorf("large reply: the stub is not the full envelope less payload, context and metadata")
	}
	if err := store.Delete(ctx, ref); err != nil && !errors.Is(err, jetstream.ErrObjectNotFound) {
		t.Errorf("large reply: delete object %s: %v", ref, err)
	}
	return env
}

// stubOf returns e as PROTOCOL.md §7 stubs it, decoded form.
func stubOf(e *wire.Envelope) *wire.Envelope {
	s := *e
	s.Payload, s.Context, s.Metadata, s.Error = nil, nil, nil, nil
	if e.Error != nil {
		s.Error = &wire.Error{Code: e.Error.Code, Retryable: e.Error.Retryable, RetryAfterMS: e.Error.RetryAfterMS}
	}
	return &s
}

// jsonEqual reports whether two JSON documents hold the same value
// (absent and null are equal).
func jsonEqual(a, b json.RawMessage) bool {
	norm := func(r json.RawMessage) (any, bool) {
		if len(bytes.TrimSpace(r)) == 0 {
			return nil, true
		}
		var v any
		err := json.Unmarshal(r, &v)
		return v, err == nil
	}
	va, oka := norm(a)
	vb, okb := norm(b)
	if !oka || !okb {
		return false
	}
	if va == nil || vb == nil {
		return va == nil && vb == nil
	}
	return reflect.DeepEqual(va, vb)
}
