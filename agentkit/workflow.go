package agentkit

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// Workflow is the history of one conversation (a workflow's status):
// every message with its correlation id, the agents
// involved in order of appearance, and how each request ended.
type Workflow struct {
	CorrelationID string            `json:"correlation_id"`
	Messages      []WorkflowMessage `json:"messages"`
	Agents        []string          `json:"agents"`
	Started       time.Time         `json:"started"`
	Last          time.Time         `json:"last"`
	// Outcome is "failed" when any request failed, "in_progress" while a
	// request has no answer, else "completed".
	Outcome string `json:"outcome"`
}

// WorkflowMessage is one message of a workflow, read from the stream's
// headers and subject.
type WorkflowMessage struct {
	Seq       uint64           `json:"seq"`
	Time      time.Time        `json:"time"`
	MessageID string           `json:"message_id"`
	Type      wire.MessageType `json:"message_type"`
	Action    string           `json:"action,omitempty"`
	Priority  string           `json:"priority"`
	Sender    string           `json:"sender"`
	Receiver  string           `json:"receiver,omitempty"`
	Topic     string           `json:"topic,omitempty"`
	InReplyTo string           `json:"in_reply_to,omitempty"`
	Status    string           `json:"status,omitempty"`
	// Outcome, for requests and notifications: "answered", "acked",
	// "failed" (an error or NACK came back) or "no_reply". A message an
	// agent forwarded ([Reroute]) is answered to the original sender: the
	// forward has the outcome of the original.
	Outcome string `json:"outcome,omitempty"`
}

// Workflow outcomes.
const (
	WorkflowCompleted  = "completed"
	WorkflowInProgress = "in_progress"
	WorkflowFailed     = "failed"
)

// workflowScanIdle is how long the server keeps the consumer of a
// WorkflowStatus scan that was not deleted (its client went away).
const workflowScanIdle = 30 * time.Second

// WorkflowStatus reads the messages of correlationID back from the message
// stream. It scans the stream's headers (not bodies) from since (zero: the
// beginning), so its cost grows with the stream; it is a diagnostic, not a
// hot path. A message without the mirrored headers (PROTOCOL.md §4) costs
// a read of its body. An unknown correlation id returns a workflow with no messages.
// The scan stops with ctx's error when ctx ends, and deletes its temporary
// consumer when it returns.
func WorkflowStatus(ctx context.Context, js jetstream.JetStream, scheme subjects.Scheme, correlationID string, since time.Time) (*Workflow, error) {
	cfg := jetstream.ConsumerConfig{FilterSubjects: scheme.StreamSubjects(), HeadersOnly: true, AckPolicy: jetstream.AckNonePolicy,
		Replicas: 1, MemoryStorage: true, InactiveThreshold: workflowScanIdle}
	if !since.IsZero() {
		cfg.DeliverPolicy, cfg.OptStartTime = jetstream.DeliverByStartTimePolicy, &since
	}
	cons, err := js.CreateConsumer(ctx, scheme.Stream(), cfg)
	if err != nil {
		return nil, fmt.Errorf("agentkit: read stream %s: %w", scheme.Stream(), err)
	}
	info := cons.CachedInfo()
	defer func() {
		// Now rather than at the inactive threshold, also when ctx has
		// ended: without ctx's deadline, the request has js's API timeout,
		// which the caller sized for its server, not a guess of ours.
		_ = js.DeleteConsumer(context.WithoutCancel(ctx), scheme.Stream(), info.Name)
	}()
	w := &Workflow{CorrelationID: correlationID}
	bodies := &bodyReader{js: js, name: scheme.Stream()}
	for pending := info.NumPending; pending > 0; {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("agentkit: read stream %s: %w", scheme.Stream(), err)
		}
		batch, err := cons.FetchNoWait(256)
		if err != nil {
			return nil, fmt.Errorf("agentkit: read stream %s: %w", scheme.Stream(), err)
		}
		n := 0
		for msg := range batch.Messages() {
			n++
			md, err := msg.Metadata()
			if err != nil {
				continue
			}
			pending = md.NumPending
			h := msg.Headers()
			wm := WorkflowMessage{Seq: md.Sequence.Stream, Time: md.Timestamp, MessageID: h.Get(wire.HeaderMsgID),
				Type: wire.MessageType(h.Get(wire.HeaderType)), Action: h.Get(wire.HeaderAction),
				InReplyTo: h.Get(wire.HeaderInReplyTo), Status: h.Get(wire.HeaderStatus)}
			corr := h.Get(wire.HeaderCorrelation)
			if !wire.Mirrored(h) {
				// The sender mirrors no header: the body says it all, at a
				// read per message.
				env, err := bodies.envelope(ctx, md.Sequence.Stream)
				if err != nil {
					return nil, err
				}
				if env == nil {
					continue // not an envelope: its receiver terminates it
				}
				corr = env.Correlation
				wm.MessageID, wm.Type, wm.Action = env.MessageID, env.MessageType, env.Action
				wm.InReplyTo, wm.Status = env.InReplyTo, env.Status
			}
			if corr != correlationID {
				continue
			}
			sub, err := scheme.Parse(msg.Subject())
			if err != nil {
				continue
			}
			wm.Priority, wm.Sender, wm.Receiver, wm.Topic = sub.Priority, sub.Sender, sub.Receiver, sub.Topic
			w.Messages = append(w.Messages, wm)
		}
		if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) {
			return nil, fmt.Errorf("agentkit: read stream %s: %w", scheme.Stream(), err)
		}
		if n == 0 {
			break
		}
	}
	w.summarize()
	return w, nil
}

// bodyReader reads messages of the message stream by sequence, for
// WorkflowStatus: the stream's handle is looked up at the first read.
type bodyReader struct {
	js     jetstream.JetStream
	name   string
	stream jetstream.Stream
}

// envelope reads message seq and decodes it as bounded as a receiver
// does; nil, nil when the message is gone or no valid envelope.
func (b *bodyReader) envelope(ctx context.Context, seq uint64) (*wire.Envelope, error) {
	if b.stream == nil {
		st, err := b.js.Stream(ctx, b.name)
		if err != nil {
			return nil, fmt.Errorf("agentkit: read stream %s: %w", b.name, err)
		}
		b.stream = st
	}
	raw, err := b.stream.GetMsg(ctx, seq)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("agentkit: read message %d of %s: %w", seq, b.name, err)
	case len(raw.Data) > wire.DefaultMaxEnvelopeBytes:
		return nil, nil
	}
	env, err := wire.Decode(raw.Data)
	if err != nil {
		return nil, nil //nolint:nilerr // an invalid envelope is no message of any workflow
	}
	return env, nil
}

// WorkflowStatus reads correlationID's messages from the agent's stream;
// see the package-level [WorkflowStatus].
func (a *Agent) WorkflowStatus(ctx context.Context, correlationID string) (*Workflow, error) {
	return WorkflowStatus(ctx, a.js, a.opts.scheme, correlationID, time.Time{})
}

// summarize fills agents, times and outcomes from the messages.
func (w *Workflow) summarize() {
	w.Outcome = WorkflowCompleted
	if len(w.Messages) == 0 {
		return
	}
	w.Started, w.Last = w.Messages[0].Time, w.Messages[len(w.Messages)-1].Time
	replies := map[string][]WorkflowMessage{}
	for _, m := range w.Messages {
		for _, id := range []string{m.Sender, m.Receiver} {
			if id != "" && !slices.Contains(w.Agents, id) {
				w.Agents = append(w.Agents, id)
			}
		}
		if m.InReplyTo != "" {
			replies[m.InReplyTo] = append(replies[m.InReplyTo], m)
		}
	}
	// The id each message would be forwarded under by its receiver (any
	// agent of the workflow for a topic or broadcast) → the message's id.
	forwarded := map[string]string{}
	for _, m := range w.Messages {
		by := w.Agents
		if m.Receiver != "" {
			by = []string{m.Receiver}
		}
		for _, a := range by {
			forwarded[forwardID(a, m.MessageID)] = m.MessageID
		}
	}
	for i := range w.Messages {
		m := &w.Messages[i]
		if m.Type != wire.TypeRequest && m.Type != wire.TypeNotification {
			continue
		}
		// A forward (Reroute) is answered as the message it passes on:
		// the reply goes to the original sender, in reply to the original.
		id := m.MessageID
		for n := 0; forwarded[id] != "" && n < len(w.Messages); n++ {
			id = forwarded[id]
		}
		m.Outcome = "no_reply"
		for _, r := range replies[id] {
			switch {
			case r.Type == wire.TypeError || r.Status == wire.StatusNACK || r.Status == wire.StatusFailed || r.Status == wire.StatusRejected:
				m.Outcome = "failed"
			case r.Type == wire.TypeAck && m.Outcome != "failed":
				m.Outcome = "acked"
			case r.Type == wire.TypeResponse && m.Outcome != "failed":
				m.Outcome = "answered"
			}
		}
		switch {
		case m.Outcome == "failed":
			w.Outcome = WorkflowFailed
		case m.Outcome == "no_reply" && m.Type == wire.TypeRequest && w.Outcome != WorkflowFailed:
			w.Outcome = WorkflowInProgress
		}
	}
}
