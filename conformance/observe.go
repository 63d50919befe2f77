package conformance

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/agentkit/wire"
)

// sentMsg is one message the agent published, as stored in the stream.
type sentMsg struct {
	Subject string
	Header  nats.Header
	Data    []byte
	Seq     uint64
	// env is the decoded body (a stub for a large envelope); err why it
	// did not decode.
	env *wire.Envelope
	err error
}

// collector reads every direct message the agent sends from the stream
// (an ordered consumer, so the kit needs no durable consumer of its own)
// and indexes them by in_reply_to.
type collector struct {
	mu      sync.Mutex
	byReply map[string][]*sentMsg
	changed chan struct{} // closed and replaced on every message
	cc      jetstream.ConsumeContext
}

func watchSent(ctx context.Context, js jetstream.JetStream, stream, filter string) (*collector, error) {
	cons, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{filter},
		DeliverPolicy:  jetstream.DeliverNewPolicy,
	})
	if err != nil {
		return nil, fmt.Errorf("conformance: read %s on %s: %w", filter, stream, err)
	}
	c := &collector{byReply: make(map[string][]*sentMsg), changed: make(chan struct{})}
	c.cc, err = cons.Consume(c.add)
	if err != nil {
		return nil, fmt.Errorf("conformance: read %s on %s: %w", filter, stream, err)
	}
	return c, nil
}

func (c *collector) add(m jetstream.Msg) {
	s := &sentMsg{Subject: m.Subject(), Header: m.Headers(), Data: m.Data()}
	if md, err := m.Metadata(); err == nil {
		s.Seq = md.Sequence.Stream
	}
	s.env, s.err = wire.Decode(s.Data)
	key := s.Header.Get(wire.HeaderInReplyTo)
	if s.env != nil {
		key = s.env.InReplyTo
	}
	c.mu.Lock()
	c.byReply[key] = append(c.byReply[key], s)
	close(c.changed)
	c.changed = make(chan struct{})
	c.mu.Unlock()
}

// replies returns what the agent sent in reply to id so far.
func (c *collector) replies(id string) []*sentMsg {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*sentMsg(nil), c.byReply[id]...)
}

// await waits until the agent sent a reply to id of message type typ and
// returns it.
func (c *collector) await(ctx context.Context, id string, typ wire.MessageType) (*sentMsg, error) {
	for {
		c.mu.Lock()
		for _, s := range c.byReply[id] {
			if s.env != nil && s.env.MessageType == typ {
				c.mu.Unlock()
				return s, nil
			}
		}
		changed := c.changed
		c.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("no %s in reply to %s: %w", typ, id, ctx.Err())
		case <-changed:
		}
	}
}

func (c *collector) stop() { c.cc.Stop() }

// event is one JetStream advisory or ack metric about a message of the
// agent's consumers.
type event struct {
	Kind       string // "ack", "term", "nak" or "max_deliveries"
	Consumer   string `json:"consumer"`
	StreamSeq  uint64 `json:"stream_seq"`
	Deliveries uint64 `json:"deliveries"`
	Reason     string `json:"reason"`
}

// events indexes the settling events of the agent's consumers by stream
// sequence, from core subscriptions to the server's advisory subjects.
type events struct {
	agent   string
	mu      sync.Mutex
	bySeq   map[uint64][]event
	changed chan struct{}
	subs    []*nats.Subscription
}

// The server's advisory and metric subjects, followed by
// <stream>.<consumer> (PROTOCOL.md §10).
var eventSubjects = map[string]string{
	"$JS.EVENT.METRIC.CONSUMER.ACK":              "ack",
	"$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED": "term",
	"$JS.EVENT.ADVISORY.CONSUMER.MSG_NAKED":      "nak",
	"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES": "max_deliveries",
}

func watchEvents(nc *nats.Conn, stream, agent string) (*events, error) {
	e := &events{agent: agent, bySeq: make(map[uint64][]event), changed: make(chan struct{})}
	for prefix, kind := range eventSubjects {
		sub, err := nc.Subscribe(prefix+"."+stream+".*", func(m *nats.Msg) { e.add(kind, m.Data) })
		if err != nil {
			e.stop()
			return nil, fmt.Errorf("conformance: subscribe to %s: %w", prefix, err)
		}
		e.subs = append(e.subs, sub)
	}
	// The subscriptions must be in place before the first message is sent.
	if err := nc.Flush(); err != nil {
		e.stop()
		return nil, fmt.Errorf("conformance: subscribe to advisories: %w", err)
	}
	return e, nil
}

func (e *events) add(kind string, data []byte) {
	var ev event
	if err := json.Unmarshal(data, &ev); err != nil || !strings.HasPrefix(ev.Consumer, e.agent+"_") {
		return
	}
	ev.Kind = kind
	e.mu.Lock()
	e.bySeq[ev.StreamSeq] = append(e.bySeq[ev.StreamSeq], ev)
	close(e.changed)
	e.changed = make(chan struct{})
	e.mu.Unlock()
}

// await waits for the first ack or term of stream sequence seq and
// returns it with every event seen for seq until then.
func (e *events) await(ctx context.Context, seq uint64) (event, []event, error) {
	for {
		e.mu.Lock()
		all := append([]event(nil), e.bySeq[seq]...)
		changed := e.changed
		e.mu.Unlock()
		for _, ev := range all {
			if ev.Kind == "ack" || ev.Kind == "term" {
				return ev, all, nil
			}
		}
		select {
		case <-ctx.Done():
			return event{}, all, fmt.Errorf("message %d was neither acked nor terminated (events seen: %v): %w", seq, all, ctx.Err())
		case <-changed:
		}
	}
}

func (e *events) stop() {
	for _, s := range e.subs {
		_ = s.Unsubscribe()
	}
}

// muteList holds the messages the agent must never answer, or answer
// only with one reply of each allowed type, for the last check.
type muteList struct {
	mu  sync.Mutex
	ids map[string]*muted
}

type muted struct {
	why   string
	allow []wire.MessageType
	seen  map[wire.MessageType]bool
}

func (l *muteList) add(id, why string, allow ...wire.MessageType) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ids == nil {
		l.ids = make(map[string]*muted)
	}
	l.ids[id] = &muted{why: why, allow: allow, seen: make(map[wire.MessageType]bool)}
}

func (l *muteList) all() map[string]*muted {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[string]*muted, len(l.ids))
	for k, v := range l.ids {
		out[k] = v
	}
	return out
}
