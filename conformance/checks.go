package conformance

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/agentmesh-io/agentmesh/agentkit/wire"
)

// check is one behaviour of the agent, run as a subtest.
type check struct {
	name string
	run  func(t *testing.T, p *peer)
}

// checks run in parallel; each uses its own messages.
var checks = []check{
	{"Consumers", checkConsumers},
	{"Request", checkRequest},
	{"Headerless", checkHeaderless},
	{"RequiresAck", checkRequiresAck},
	{"Reject", checkReject},
	{"UnknownAction", checkUnknownAction},
	{"Expired", checkExpired},
	{"Invalid", checkInvalid},
	{"LargeEnvelope", checkLargeEnvelope},
	{"FanoutIgnored", checkFanoutIgnored},
	{"Registry", checkRegistry},
}

// checkConsumers checks the agent's consumers' configuration (PROTOCOL.md §3).
func checkConsumers(t *testing.T, p *peer) {
	ctx, cancel := context.WithTimeout(t.Context(), p.cfg.Timeout)
	defer cancel()
	direct := make(map[string]jetstream.ConsumerConfig)
	for _, prio := range priorities {
		name := p.consumer(prio)
		info, err := p.js.Consumer(ctx, p.stream, name)
		if err != nil {
			t.Errorf("consumer %s: %v", name, err)
			continue
		}
		c := info.CachedInfo().Config
		direct[prio] = c
		filters := c.FilterSubjects
		if c.FilterSubject != "" {
			filters = append(filters, c.FilterSubject)
		}
		want := p.cfg.Prefix + ".agent." + p.cfg.AgentID + "." + prio + ".*"
		if c.Durable != name {
			t.Errorf("%s: durable_name %q, want %q", name, c.Durable, name)
		}
		if !slices.Equal(filters, []string{want}) {
			t.Errorf("%s: filter %q, want %q", name, filters, want)
		}
		if c.DeliverPolicy != jetstream.DeliverAllPolicy {
			t.Errorf("%s: deliver_policy %v, want all", name, c.DeliverPolicy)
		}
		if c.MaxAckPending != 1000 {
			t.Errorf("%s: max_ack_pending %d, want 1000", name, c.MaxAckPending)
		}
		checkPolicy(t, name, c)
	}
	// Fan-out consumers exist only for an agent that takes actions from
	// fan-out; an administrator's provisioning creates both.
	var fanout int
	for class, prios := range map[string][]string{"urgent": {"critical", "high"}, "bulk": {"normal", "low", "batch"}} {
		name := p.cfg.AgentID + "_fanout-" + class
		info, err := p.js.Consumer(ctx, p.stream, name)
		if err != nil {
			t.Logf("%s: %v (an agent that takes no action from fan-out has none)", name, err)
			continue
		}
		fanout++
		c := info.CachedInfo().Config
		if c.Durable != name {
			t.Errorf("%s: durable_name %q, want %q", name, c.Durable, name)
		}
		filters := c.FilterSubjects
		if c.FilterSubject != "" {
			filters = append(filters, c.FilterSubject)
		}
		var want []string
		for _, prio := range prios {
			want = append(want, p.cfg.Prefix+".broadcast."+prio+".*")
		}
		if len(filters) < len(want) || !slices.Equal(filters[:len(want)], want) {
			t.Errorf("%s: filter_subjects %q do not start with %q", name, filters, want)
		} else {
			topic := regexp.MustCompile(`^` + regexp.QuoteMeta(p.cfg.Prefix) + `\.topic\.([A-Za-z0-9_-]{1,64})\.([a-z]+)\.\*$`)
			rest := filters[len(want):]
			for i, f := range rest {
				m := topic.FindStringSubmatch(f)
				if m == nil || m[2] != prios[i%len(prios)] {
					t.Errorf("%s: filter %q at %d, want %s.topic.<topic>.%s.*", name, f, len(want)+i, p.cfg.Prefix, prios[i%len(prios)])
				}
			}
		}
		// A consumer made by `agentmesh migrate` starts at a sequence.
		if c.DeliverPolicy != jetstream.DeliverNewPolicy && c.DeliverPolicy != jetstream.DeliverByStartSequencePolicy {
			t.Errorf("%s: deliver_policy %v, want new", name, c.DeliverPolicy)
		}
		checkPolicy(t, name, c)
		if of, ok := direct[prios[0]]; ok {
			if c.AckWait != of.AckWait || !slices.Equal(c.BackOff, of.BackOff) || c.MaxDeliver != of.MaxDeliver || c.MaxAckPending != of.MaxAckPending {
				t.Errorf("%s: ack_wait %v backoff %v max_deliver %d max_ack_pending %d, want %s's: %v %v %d %d", name,
					c.AckWait, c.BackOff, c.MaxDeliver, c.MaxAckPending, p.consumer(prios[0]), of.AckWait, of.BackOff, of.MaxDeliver, of.MaxAckPending)
			}
		}
	}
	if fanout == 1 {
		t.Errorf("agent has one fan-out consumer of two")
	}
}

// checkPolicy checks what every agent consumer shares: explicit acks, the
// BackOff list as ack timeouts, every ack sampled, pull delivery.
func checkPolicy(t *testing.T, name string, c jetstream.ConsumerConfig) {
	t.Helper()
	if c.AckPolicy != jetstream.AckExplicitPolicy {
		t.Errorf("%s: ack_policy %v, want explicit", name, c.AckPolicy)
	}
	if len(c.BackOff) == 0 {
		t.Errorf("%s: no backoff", name)
	} else if c.AckWait != c.BackOff[0] {
		t.Errorf("%s: ack_wait %v, want backoff[0] %v", name, c.AckWait, c.BackOff[0])
	}
	if c.MaxDeliver < len(c.BackOff) || c.MaxDeliver <= 0 {
		t.Errorf("%s: max_deliver %d, want at least len(backoff) = %d", name, c.MaxDeliver, len(c.BackOff))
	}
	if c.SampleFrequency != "100" && c.SampleFrequency != "100%" {
		t.Errorf("%s: sample_freq %q, want \"100\"", name, c.SampleFrequency)
	}
	if c.DeliverSubject != "" {
		t.Errorf("%s: push consumer (deliver_subject %q), want pull", name, c.DeliverSubject)
	}
}

// echoPayload is a payload whose round trip the echo checks compare.
func echoPayload() json.RawMessage {
	return json.RawMessage(fmt.Sprintf(`{"n":%d,"text":"héllo \u2028 \"wire\"","list":[1,2.5,null,true],"nested":{"a":{}}}`, time.Now().UnixNano()))
}

// checkRequest sends echo requests and checks the responses (PROTOCOL.md §6).
func checkRequest(t *testing.T, p *peer) {
	t.Run("ids copied", func(t *testing.T) {
		req := p.envelope(wire.TypeRequest, ActionEcho, wire.PriorityHigh)
		req.Correlation, req.WorkflowID, req.TaskID, req.SessionID = "corr-"+nuid.Next(), "wf-"+nuid.Next(), "task-"+nuid.Next(), "sess_"+nuid.Next()
		req.Context = json.RawMessage(`{"user":"u1","turn":3}`)
		req.Payload = echoPayload()
		seq := p.send(t, req)
		resp := p.reply(t, req, wire.TypeResponse)
		checkEcho(t, req, resp)
		p.acked(t, seq, p.consumer("high"), "echo request")
		p.mute.add(req.MessageID, "an echo request without requires_ack", wire.TypeResponse)
	})
	t.Run("correlation defaults to message_id", func(t *testing.T) {
		req := p.envelope(wire.TypeRequest, ActionEcho, wire.PriorityLow)
		req.Payload = echoPayload()
		seq := p.send(t, req)
		checkEcho(t, req, p.reply(t, req, wire.TypeResponse))
		p.acked(t, seq, p.consumer("low"), "echo request")
	})
}

// checkHeaderless sends an echo request with no mirrored header, only the
// required Nats-Msg-Id: the agent reads everything from the envelope
// (PROTOCOL.md §4) and answers as it does a request with them.
func checkHeaderless(t *testing.T, p *peer) {
	req := p.envelope(wire.TypeRequest, ActionEcho, wire.PriorityNormal)
	req.Correlation, req.WorkflowID, req.TaskID, req.SessionID = "corr-"+nuid.Next(), "wf-"+nuid.Next(), "task-"+nuid.Next(), "sess_"+nuid.Next()
	req.Payload = echoPayload()
	body, err := req.Encode()
	if err != nil {
		t.Fatal(err)
	}
	seq := p.publish(t, p.toAgent(string(req.Priority)), nats.Header{wire.HeaderMsgID: {req.MessageID}}, body)
	checkEcho(t, req, p.reply(t, req, wire.TypeResponse))
	p.acked(t, seq, p.consumer("normal"), "echo request without mirrored headers")
	p.mute.add(req.MessageID, "an echo request without requires_ack", wire.TypeResponse)
}

// checkEcho checks a response to an echo request.
func checkEcho(t *testing.T, req, resp *wire.Envelope) {
	t.Helper()
	if resp.Action != ActionEcho {
		t.Errorf("response action %q, want %q", resp.Action, ActionEcho)
	}
	if resp.Status != wire.StatusSuccess {
		t.Errorf("response status %q, want %q", resp.Status, wire.StatusSuccess)
	}
	if resp.Error != nil {
		t.Errorf("response carries error %v", resp.Error)
	}
	if !jsonEqual(resp.Payload, req.Payload) {
		t.Errorf("response payload %.200s, want the request's %.200s", resp.Payload, req.Payload)
	}
}

var decimal = regexp.MustCompile(`^[0-9]+$`)

// checkAck checks an ack envelope: ACK or, with code, a NACK carrying it.
func checkAck(t *testing.T, req, ack *wire.Envelope, code wire.ErrorCode) {
	t.Helper()
	want := wire.StatusACK
	if code != "" {
		want = wire.StatusNACK
	}
	if ack.Status != want {
		t.Errorf("ack status %q, want %q", ack.Status, want)
	}
	if ack.Action != req.Action {
		t.Errorf("ack action %q, want the original's %q", ack.Action, req.Action)
	}
	if pt := ack.Metadata[wire.MetaProcessingTime]; !decimal.MatchString(pt) {
		t.Errorf("ack metadata %s = %q, want decimal milliseconds", wire.MetaProcessingTime, pt)
	}
	switch {
	case code == "" && ack.Error != nil:
		t.Errorf("ACK carries error %v", ack.Error)
	case code != "" && ack.Error == nil:
		t.Errorf("NACK without error, want code %s", code)
	case code != "" && ack.Error.Code != code:
		t.Errorf("NACK code %s, want %s", ack.Error.Code, code)
	case code != "" && ack.Error.Retryable != code.Retryable():
		t.Errorf("NACK retryable %v, want %v", ack.Error.Retryable, code.Retryable())
	}
}

// checkRequiresAck checks the ACK envelope of requires_ack (PROTOCOL.md §5, §6).
func checkRequiresAck(t *testing.T, p *peer) {
	t.Run("request", func(t *testing.T) {
		req := p.envelope(wire.TypeRequest, ActionEcho, wire.PriorityNormal)
		req.RequiresAck, req.Payload = true, echoPayload()
		seq := p.send(t, req)
		checkEcho(t, req, p.reply(t, req, wire.TypeResponse))
		checkAck(t, req, p.reply(t, req, wire.TypeAck), "")
		p.acked(t, seq, p.consumer("normal"), "echo request with requires_ack")
	})
	t.Run("notification", func(t *testing.T) {
		n := p.envelope(wire.TypeNotification, ActionEcho, wire.PriorityCritical)
		n.RequiresAck, n.Payload = true, echoPayload()
		seq := p.send(t, n)
		checkAck(t, n, p.reply(t, n, wire.TypeAck), "")
		p.acked(t, seq, p.consumer("critical"), "echo notification with requires_ack")
		p.mute.add(n.MessageID, "an echo notification answers only with its ACK", wire.TypeAck)
	})
	t.Run("notification without requires_ack", func(t *testing.T) {
		n := p.envelope(wire.TypeNotification, ActionEcho, wire.PriorityBatch)
		n.Payload = echoPayload()
		p.acked(t, p.send(t, n), p.consumer("batch"), "echo notification")
		p.mute.add(n.MessageID, "a notification without requires_ack is not answered")
	})
}

// checkReject checks a handler's rejection: Term with "<CODE>: <message>"
// and the failure as an error envelope, or a NACK with requires_ack.
func checkReject(t *testing.T, p *peer) {
	const msg = "the conformance kit asked for this rejection"
	payload := json.RawMessage(`{"code":"NOT_FOUND","message":"` + msg + `"}`)
	t.Run("request", func(t *testing.T) {
		req := p.envelope(wire.TypeRequest, ActionReject, wire.PriorityNormal)
		req.Payload = payload
		seq := p.send(t, req)
		if r := p.termed(t, seq, "rejected request"); r != "NOT_FOUND: "+msg {
			t.Errorf("TERM reason %q, want %q", r, "NOT_FOUND: "+msg)
		}
		checkFailure(t, req, p.reply(t, req, wire.TypeError), wire.CodeNotFound)
		p.mute.add(req.MessageID, "a rejected request answers with one error", wire.TypeError)
	})
	t.Run("notification with requires_ack", func(t *testing.T) {
		n := p.envelope(wire.TypeNotification, ActionReject, wire.PriorityHigh)
		n.RequiresAck, n.Payload = true, payload
		seq := p.send(t, n)
		p.termed(t, seq, "rejected notification")
		checkAck(t, n, p.reply(t, n, wire.TypeAck), wire.CodeNotFound)
		p.mute.add(n.MessageID, "a failure with requires_ack is a NACK, not an error envelope", wire.TypeAck)
	})
}

// checkFailure checks an error envelope answering req.
func checkFailure(t *testing.T, req, e *wire.Envelope, code wire.ErrorCode) {
	t.Helper()
	if e.Action != req.Action {
		t.Errorf("error action %q, want the original's %q", e.Action, req.Action)
	}
	if e.Error == nil {
		t.Fatalf("error envelope without error")
	}
	if e.Error.Code != code || e.Error.Retryable {
		t.Errorf("error %s retryable %v, want %s retryable false", e.Error.Code, e.Error.Retryable, code)
	}
	if e.Status != wire.StatusRejected {
		t.Errorf("error status %q, want %q", e.Status, wire.StatusRejected)
	}
}

// checkUnknownAction checks a direct message whose action the agent does
// not handle (PROTOCOL.md §5 check 15).
func checkUnknownAction(t *testing.T, p *peer) {
	const action = "conformance.no-such-action"
	wantReason := fmt.Sprintf("CAPABILITY_MISSING: agent %s has no handler for action %q", p.cfg.AgentID, action)
	t.Run("request", func(t *testing.T) {
		req := p.envelope(wire.TypeRequest, action, wire.PriorityNormal)
		seq := p.send(t, req)
		if r := p.termed(t, seq, "request of an unknown action"); r != wantReason {
			t.Errorf("TERM reason %q, want %q", r, wantReason)
		}
		checkFailure(t, req, p.reply(t, req, wire.TypeError), wire.CodeCapabilityMissing)
		p.mute.add(req.MessageID, "an unknown action answers with one error", wire.TypeError)
	})
	t.Run("requires_ack", func(t *testing.T) {
		req := p.envelope(wire.TypeRequest, action, wire.PriorityLow)
		req.RequiresAck = true
		seq := p.send(t, req)
		p.termed(t, seq, "request of an unknown action")
		checkAck(t, req, p.reply(t, req, wire.TypeAck), wire.CodeCapabilityMissing)
		p.mute.add(req.MessageID, "an unknown action with requires_ack answers with one NACK", wire.TypeAck)
	})
}

// checkExpired checks a message past its ttl_ms: acked, never handled,
// NACKed with EXPIRED when it asks for an ack (PROTOCOL.md §5 check 12).
func checkExpired(t *testing.T, p *peer) {
	req := p.envelope(wire.TypeRequest, ActionEcho, wire.PriorityNormal)
	req.Timestamp = time.Now().UTC().Add(-time.Hour)
	req.TTLMillis = 1000
	req.RequiresAck, req.Payload = true, echoPayload()
	seq := p.send(t, req)
	p.acked(t, seq, p.consumer("normal"), "expired request")
	checkAck(t, req, p.reply(t, req, wire.TypeAck), wire.CodeExpired)
	p.mute.add(req.MessageID, "an expired message is never handled", wire.TypeAck)
}

// checkInvalid sends messages that are not valid for the agent; each must
// be terminated with a reason starting "INVALID: " and never answered
// (PROTOCOL.md §5 checks 4–10).
func checkInvalid(t *testing.T, p *peer) {
	valid := func() *wire.Envelope {
		e := p.envelope(wire.TypeRequest, ActionEcho, wire.PriorityNormal)
		e.Payload = json.RawMessage(`{}`)
		return e
	}
	encode := func(t *testing.T, e *wire.Envelope) []byte {
		b, err := e.Encode()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	cases := []struct {
		name string
		// build returns the message's id, subject, headers and body.
		build func(t *testing.T) (string, string, nats.Header, []byte)
	}{
		{"not JSON", func(t *testing.T) (string, string, nats.Header, []byte) {
			e := valid()
			return e.MessageID, p.toAgent("normal"), headersOf(e), []byte(`{"acl":"1","message_id":`)
		}},
		{"unknown member", func(t *testing.T) (string, string, nats.Header, []byte) {
			e := valid()
			b := encode(t, e)
			return e.MessageID, p.toAgent("normal"), headersOf(e), append(b[:len(b)-1], `,"x_conformance":1}`...)
		}},
		{"duplicate member", func(t *testing.T) (string, string, nats.Header, []byte) {
			e := valid()
			b := encode(t, e)
			return e.MessageID, p.toAgent("normal"), headersOf(e), append(b[:len(b)-1], `,"priority":"normal"}`...)
		}},
		{"acl version 2", func(t *testing.T) (string, string, nats.Header, []byte) {
			e := valid()
			b := encode(t, e)
			return e.MessageID, p.toAgent("normal"), headersOf(e), []byte(strings.Replace(string(b), `"acl":"1"`, `"acl":"2"`, 1))
		}},
		{"spoofed sender", func(t *testing.T) (string, string, nats.Header, []byte) {
			e := valid()
			e.SenderID = "conformance-spoofed-" + nuid.Next()
			return e.MessageID, p.toAgent("normal"), headersOf(e), encode(t, e)
		}},
		{"receiver mismatch", func(t *testing.T) (string, string, nats.Header, []byte) {
			e := valid()
			e.ReceiverID = "conformance-other-" + nuid.Next()
			return e.MessageID, p.toAgent("normal"), headersOf(e), encode(t, e)
		}},
		{"priority mismatch", func(t *testing.T) (string, string, nats.Header, []byte) {
			e := valid()
			return e.MessageID, p.toAgent("low"), headersOf(e), encode(t, e)
		}},
		{"Mesh-Task-Id differs from task_id", func(t *testing.T) (string, string, nats.Header, []byte) {
			e := valid()
			e.TaskID = "task-a"
			h := headersOf(e)
			h.Set(wire.HeaderTaskID, "task-b")
			return e.MessageID, p.toAgent("normal"), h, encode(t, e)
		}},
		{"Nats-Pin-Id header", func(t *testing.T) (string, string, nats.Header, []byte) {
			e := valid()
			h := headersOf(e)
			h.Set("Nats-Pin-Id", nuid.Next())
			return e.MessageID, p.toAgent("normal"), h, encode(t, e)
		}},
		{"Mesh-Envelope-Ref not the message id", func(t *testing.T) (string, string, nats.Header, []byte) {
			e := valid()
			h := headersOf(e)
			h.Set(wire.HeaderEnvelopeRef, wire.NewMessageID())
			return e.MessageID, p.toAgent("normal"), h, encode(t, e)
		}},
		{"Mesh-Envelope-Ref without object", func(t *testing.T) (string, string, nats.Header, []byte) {
			p.payloads(t) // the store exists, so the object is missing, not the store unreachable
			e := valid()
			h := headersOf(e)
			h.Set(wire.HeaderEnvelopeRef, e.MessageID)
			return e.MessageID, p.toAgent("normal"), h, encode(t, e)
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			id, subject, h, body := c.build(t)
			p.mute.add(id, "invalid input is never answered ("+c.name+")")
			seq := p.publish(t, subject, h, body)
			if r := p.termed(t, seq, c.name); !strings.HasPrefix(r, "INVALID: ") {
				t.Errorf("TERM reason %q, want it to start with \"INVALID: \"", r)
			}
		})
	}
}

// checkLargeEnvelope sends an echo request too large for the server's max
// payload through the object store; its response is as large, so it comes
// back the same way (PROTOCOL.md §7).
func checkLargeEnvelope(t *testing.T, p *peer) {
	limit := int(p.nc.MaxPayload()) - headerRoom
	blob := strings.Repeat("0123456789abcdef", limit/16+4096)
	req := p.envelope(wire.TypeRequest, ActionEcho, wire.PriorityNormal)
	req.RequiresAck = true
	req.Payload = json.RawMessage(`{"blob":"` + blob + `"}`)
	req.Metadata = map[string]string{"conformance": "large"}
	body, h := p.offload(t, req)
	seq := p.publish(t, p.toAgent("normal"), h, body)

	resp := p.reply(t, req, wire.TypeResponse)
	checkEcho(t, req, resp)
	if m, err := p.sent.await(t.Context(), req.MessageID, wire.TypeResponse); err == nil && m.Header.Get(wire.HeaderEnvelopeRef) == "" {
		t.Errorf("response of %d bytes sent inline, above the server's max payload less %d", len(m.Data), headerRoom)
	}
	checkAck(t, req, p.reply(t, req, wire.TypeAck), "")
	p.acked(t, seq, p.consumer("normal"), "large request")

	// After it acks a direct message the receiver deletes its object.
	ctx, cancel := context.WithTimeout(t.Context(), p.cfg.Timeout)
	defer cancel()
	store := p.payloads(t)
	if err := poll(ctx, func() bool {
		_, err := store.GetInfo(ctx, req.MessageID)
		return errors.Is(err, jetstream.ErrObjectNotFound)
	}); err != nil {
		t.Errorf("the agent acked the large request but left its object %s in %s_payloads", req.MessageID, p.cfg.Prefix)
	}
}

// checkFanoutIgnored broadcasts a notification of an action nobody handles:
// an agent with fan-out consumers acks it, never terminates it
// (PROTOCOL.md §5 checks 2 and 14). Other agents of the mesh receive it
// too and ignore it the same way.
func checkFanoutIgnored(t *testing.T, p *peer) {
	name := p.cfg.AgentID + "_fanout-bulk"
	if _, err := p.js.Consumer(t.Context(), p.stream, name); err != nil {
		t.Skipf("no fan-out consumer %s: %v", name, err)
	}
	n := wire.NewEnvelope(wire.TypeNotification, p.cfg.KitID, "conformance.no-such-action")
	n.Priority = wire.PriorityLow
	body, err := n.Encode()
	if err != nil {
		t.Fatal(err)
	}
	seq := p.publish(t, p.cfg.Prefix+".broadcast.low."+p.cfg.KitID, headersOf(n), body)
	p.acked(t, seq, name, "broadcast of an unhandled action")
	p.mute.add(n.MessageID, "a broadcast notification is not answered")
}

// checkUnanswered checks that nothing answered what must go unanswered.
// A barrier request first: when its response is in, the agent has had
// at least as long as the other checks took to send a stray reply.
func checkUnanswered(t *testing.T, p *peer) {
	req := p.envelope(wire.TypeRequest, ActionEcho, wire.PriorityNormal)
	req.Payload = echoPayload()
	p.send(t, req)
	p.reply(t, req, wire.TypeResponse)
	for id, m := range p.mute.all() {
		for _, s := range p.sent.replies(id) {
			typ := "undecodable message"
			if s.env != nil {
				typ = string(s.env.MessageType)
				if slices.Contains(m.allow, s.env.MessageType) {
					if m.seen[s.env.MessageType] {
						t.Errorf("%s: a second %s in reply to %s", m.why, typ, id)
					}
					m.seen[s.env.MessageType] = true
					continue
				}
			}
			t.Errorf("%s, but the agent sent a %s in reply to %s on %s", m.why, typ, id, s.Subject)
		}
	}
}
