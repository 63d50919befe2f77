// Package trace reads one conversation back from the mesh stream and
// renders it as a tree: every message whose Mesh-Correlation-Id header
// carries the correlation id, each reply under the message it answers
// (in_reply_to).
//
// [Read] scans the stream headers-only with an ordered consumer and fetches
// the bodies of matching messages only; [Build] links the entries into a
// tree; [Render] prints it with time offsets from the first message.
package trace

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/dlq"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// Entry is one stored message of a conversation.
type Entry struct {
	// Seq is the message's sequence in the stream.
	Seq uint64 `json:"seq"`
	// Time is when the stream stored it.
	Time time.Time `json:"time"`
	// Subject is the subject it was published on.
	Subject string `json:"subject"`
	// Envelope is the decoded body; nil when the body is not a valid
	// envelope (Err says why).
	Envelope *wire.Envelope `json:"envelope,omitempty"`
	// Err is why the body could not be decoded.
	Err string `json:"error,omitempty"`

	// Header-derived fields, set even when the body does not decode.
	MessageID string `json:"message_id"`
	InReplyTo string `json:"in_reply_to,omitempty"`
	Type      string `json:"message_type"`
	Action    string `json:"action,omitempty"`

	// ReplayOf is the dead letter (its sequence in the dead-letter
	// stream) this message is a replay of, 0 for an original.
	ReplayOf uint64 `json:"replay_of,omitempty"`
	// Outcome is what became of the message as far as its receiver's
	// consumer and the dead letters tell (see [AddOutcomes]); empty when
	// unknown (not looked up, or not a direct message).
	Outcome string `json:"outcome,omitempty"`
}

// The outcomes [AddOutcomes] finds.
const (
	// OutcomeAcked: the consumer's ack floor is past it and no dead
	// letter holds it.
	OutcomeAcked = "acked"
	// OutcomeSettled: the ack floor is past it, but without a
	// dead-letter stream (no ack monitor has run) an exhausted or
	// terminated message cannot be told from an acked one.
	OutcomeSettled = "settled (acked, or exhausted: no dead-letter stream to tell)"
	// OutcomePending: the consumer has not delivered it yet.
	OutcomePending = "pending"
	// OutcomeDelivered: delivered, and the ack floor has not passed it:
	// being handled or awaiting redelivery (or acked out of order).
	OutcomeDelivered = "delivered, not settled"
	// OutcomeNoConsumer: the receiver has no consumer at its priority:
	// no agent with that id has started.
	OutcomeNoConsumer = "no consumer: nobody receives it"
	// OutcomeDeadLettered starts the outcome of a message the ack monitor
	// copied to the dead-letter stream: it exhausted its deliveries or
	// was terminated.
	OutcomeDeadLettered = "dead-lettered"
)

// Node is an entry with the replies to it.
type Node struct {
	Entry
	Children []*Node `json:"replies,omitempty"`
}

// ErrNoStream is returned by [Read] when the stream does not exist.
var ErrNoStream = errors.New("trace: stream does not exist")

// Read returns the messages of the scheme's stream whose correlation id is
// correlation, in stream order: agentkit.WorkflowStatus finds them by
// their headers, then their full bodies are fetched by sequence.
func Read(ctx context.Context, js jetstream.JetStream, scheme subjects.Scheme, correlation string) ([]Entry, error) {
	stream := scheme.Stream()
	st, err := js.Stream(ctx, stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, fmt.Errorf("%w: %s", ErrNoStream, stream)
	}
	if err != nil {
		return nil, fmt.Errorf("trace: stream %s: %w", stream, err)
	}
	wf, err := agentkit.WorkflowStatus(ctx, js, scheme, correlation, time.Time{})
	if err != nil {
		return nil, fmt.Errorf("trace: %w", err)
	}
	entries := make([]Entry, 0, len(wf.Messages))
	for _, m := range wf.Messages {
		raw, err := st.GetMsg(ctx, m.Seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue // aged out or deleted since the scan
		}
		if err != nil {
			return nil, fmt.Errorf("trace: get %s/%d: %w", stream, m.Seq, err)
		}
		e := NewEntry(raw.Sequence, raw.Time, raw.Subject, raw.Header.Get(wire.HeaderMsgID),
			raw.Header.Get(wire.HeaderInReplyTo), raw.Header.Get(wire.HeaderType), raw.Header.Get(wire.HeaderAction), raw.Data)
		e.ReplayOf, _ = strconv.ParseUint(raw.Header.Get(dlq.HeaderReplayOf), 10, 64)
		entries = append(entries, e)
	}
	return entries, nil
}

// AddOutcomes sets the Outcome of every direct message among entries
// from its receiver's consumer at its priority (delivered sequence and
// ack floor) and, for those the ack floor has passed, the dead letters
// (Mesh-Dlq-Stream-Seq, else the original message id). The ack floor
// passes an acked message and an exhausted or terminated one alike, so
// only a dead letter tells them apart. Messages to topics and broadcasts,
// read by many consumers, keep no outcome.
func AddOutcomes(ctx context.Context, js jetstream.JetStream, scheme subjects.Scheme, entries []Entry) error {
	infos := map[string]*jetstream.ConsumerInfo{}
	floorPassed := make([]bool, len(entries))
	anyPassed := false
	for i := range entries {
		e := &entries[i]
		sub, err := scheme.Parse(e.Subject)
		if err != nil || sub.Kind != subjects.KindDirect {
			continue
		}
		name, err := scheme.Consumer(sub.Receiver, sub.Priority)
		if err != nil {
			continue
		}
		ci, seen := infos[name]
		if !seen {
			cons, err := js.Consumer(ctx, scheme.Stream(), name)
			switch {
			case errors.Is(err, jetstream.ErrConsumerNotFound):
			case err != nil:
				return fmt.Errorf("trace: consumer %s: %w", name, err)
			default:
				ci = cons.CachedInfo()
			}
			infos[name] = ci
		}
		switch {
		case ci == nil:
			e.Outcome = OutcomeNoConsumer
		case e.Seq <= ci.AckFloor.Stream:
			floorPassed[i], anyPassed = true, true
		case e.Seq > ci.Delivered.Stream:
			e.Outcome = OutcomePending
		default:
			e.Outcome = OutcomeDelivered
		}
	}
	if !anyPassed {
		return nil
	}
	letters, err := dlq.Read(ctx, js, scheme, 0)
	noDLQ := errors.Is(err, dlq.ErrNoStream)
	if err != nil && !noDLQ {
		return fmt.Errorf("trace: %w", err)
	}
	bySeq, byID := map[uint64]dlq.Letter{}, map[string]dlq.Letter{}
	for _, l := range letters {
		if n, err := strconv.ParseUint(l.Header.Get(dlq.HeaderStreamSeq), 10, 64); err == nil {
			bySeq[n] = l
		} else {
			byID[l.MessageID()] = l
		}
	}
	for i := range entries {
		if !floorPassed[i] {
			continue
		}
		e := &entries[i]
		l, ok := bySeq[e.Seq]
		if !ok && e.ReplayOf == 0 {
			// A replay carries its original's message id: only the
			// original can match a letter without the stream sequence.
			l, ok = byID[e.MessageID]
		}
		switch {
		case ok:
			e.Outcome = fmt.Sprintf("%s: %s (dead letter %d)", OutcomeDeadLettered, cmp.Or(l.Reason(), l.Status(), "?"), l.Seq)
		case noDLQ:
			e.Outcome = OutcomeSettled
		default:
			e.Outcome = OutcomeAcked
		}
	}
	return nil
}

// NewEntry builds an entry from a stored message's parts; the body's
// envelope, when it decodes, supplies what the headers lack.
func NewEntry(seq uint64, at time.Time, subject, msgID, inReplyTo, typ, action string, body []byte) Entry {
	e := Entry{Seq: seq, Time: at, Subject: subject, MessageID: msgID, InReplyTo: inReplyTo, Type: typ, Action: action}
	env, err := wire.Decode(body)
	if err != nil {
		e.Err = err.Error()
		return e
	}
	e.Envelope = env
	e.MessageID = cmp.Or(env.MessageID, e.MessageID)
	e.InReplyTo = cmp.Or(env.InReplyTo, e.InReplyTo)
	e.Type = cmp.Or(string(env.MessageType), e.Type)
	e.Action = cmp.Or(env.Action, e.Action)
	return e
}

// Build links entries into trees: an entry answering a message of the set
// (in_reply_to) goes under it, and so does the ack monitor's escalation of
// a message (payload message_id); anything else is a root. Roots and children
// are in stream order. A message stored twice under one id (a replay)
// appears twice; replies go under the first.
func Build(entries []Entry) []*Node {
	sorted := slices.Clone(entries)
	slices.SortFunc(sorted, func(a, b Entry) int { return cmp.Compare(a.Seq, b.Seq) })
	byID := make(map[string]*Node, len(sorted))
	nodes := make([]*Node, len(sorted))
	for i := range sorted {
		nodes[i] = &Node{Entry: sorted[i]}
		if _, dup := byID[sorted[i].MessageID]; !dup && sorted[i].MessageID != "" {
			byID[sorted[i].MessageID] = nodes[i]
		}
	}
	var roots []*Node
	for _, n := range nodes {
		parent := n.InReplyTo
		if parent == "" {
			parent = escalated(n.Envelope)
		}
		if p, ok := byID[parent]; ok && parent != "" && p != n {
			p.Children = append(p.Children, n)
			continue
		}
		roots = append(roots, n)
	}
	return roots
}

// escalated returns the message id an escalation envelope (the ack
// monitor's, action "escalation") is about, so it goes under that message.
func escalated(env *wire.Envelope) string {
	if env == nil || env.Action != "escalation" {
		return ""
	}
	var p struct {
		MessageID string `json:"message_id"`
	}
	if json.Unmarshal(env.Payload, &p) != nil {
		return ""
	}
	return p.MessageID
}

// Render writes the trees as indented lines, offsets measured from start
// (the first message's time when start is zero):
//
//	+0ms     orch_1 → planner_1  request plan_workflow [high]
//	└─ +4ms  planner_1 → orch_1  response plan_complete [high] success
func Render(w io.Writer, roots []*Node, scheme subjects.Scheme, start time.Time) error {
	if start.IsZero() {
		for _, r := range roots {
			if start.IsZero() || r.Time.Before(start) {
				start = r.Time
			}
		}
	}
	var err error
	var walk func(n *Node, prefix string, last, root bool)
	walk = func(n *Node, prefix string, last, root bool) {
		branch, next := "", ""
		if !root {
			branch, next = "├─ ", "│  "
			if last {
				branch, next = "└─ ", "   "
			}
		}
		if _, werr := fmt.Fprintf(w, "%s%s%s\n", prefix, branch, Line(n.Entry, scheme, start)); werr != nil && err == nil {
			err = werr
		}
		for i, c := range n.Children {
			walk(c, prefix+next, i == len(n.Children)-1, false)
		}
	}
	for _, r := range roots {
		walk(r, "", true, true)
	}
	return err
}

// Line describes one entry: offset, route, type, action, priority,
// status or error, and the subject when it is not a mesh message; then
// the stream sequence, the dead letter it replays and its outcome, when
// known.
func Line(e Entry, scheme subjects.Scheme, start time.Time) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%-8s ", offset(e.Time.Sub(start)))
	sub, perr := scheme.Parse(e.Subject)
	switch {
	case perr != nil:
		b.WriteString(e.Subject)
	case sub.Kind == subjects.KindDirect:
		fmt.Fprintf(&b, "%s → %s", sub.Sender, sub.Receiver)
	case sub.Kind == subjects.KindTopic:
		fmt.Fprintf(&b, "%s → topic %s", sub.Sender, sub.Topic)
	case sub.Kind == subjects.KindBroadcast:
		fmt.Fprintf(&b, "%s → all", sub.Sender)
	default:
		b.WriteString(e.Subject)
	}
	fmt.Fprintf(&b, "  %s", cmp.Or(e.Type, "?"))
	if e.Action != "" {
		fmt.Fprintf(&b, " %s", e.Action)
	}
	if perr == nil && sub.Priority != "" {
		fmt.Fprintf(&b, " [%s]", sub.Priority)
	}
	if env := e.Envelope; env != nil {
		if env.TaskID != "" {
			fmt.Fprintf(&b, " task=%s", env.TaskID)
		}
		if env.Status != "" {
			fmt.Fprintf(&b, " %s", env.Status)
		}
		if env.Error != nil {
			fmt.Fprintf(&b, " %s: %s", env.Error.Code, env.Error.Message)
		}
	} else if e.Err != "" {
		fmt.Fprintf(&b, " (body: %s)", e.Err)
	}
	fmt.Fprintf(&b, "  #%d", e.Seq)
	if e.ReplayOf != 0 {
		fmt.Fprintf(&b, "  replay of dead letter %d", e.ReplayOf)
	}
	if e.Outcome != "" {
		fmt.Fprintf(&b, "  → %s", e.Outcome)
	}
	return b.String()
}

func offset(d time.Duration) string {
	switch {
	case d < 0:
		return "-" + offset(-d)
	case d < time.Second:
		return fmt.Sprintf("+%dms", d.Milliseconds())
	default:
		return fmt.Sprintf("+%.2fs", d.Seconds())
	}
}
