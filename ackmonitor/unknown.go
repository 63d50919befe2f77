package ackmonitor

import (
	"context"
	"errors"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/ackmonitor/store"
)

// The bounds of the unknown-receiver tracking: a sender can make up any
// number of receiver ids, so neither the metric's labels nor the list the
// API shows may grow with them.
const (
	// maxUnknownLabels is how many receivers get a label value of their
	// own in ackmonitor_messages_to_unknown_agents_total; the rest count
	// as OtherReceivers.
	maxUnknownLabels = 50
	// maxUnknownListed is how many receivers the API lists; the one seen
	// longest ago makes room for a new one.
	maxUnknownListed = 100
	// unknownQueue bounds the sends waiting for their check; past it new
	// ones are not checked.
	unknownQueue = 4096
	// unknownGrace is how long after its send a message's receiver is
	// looked up, so an agent starting just after a message to it was sent
	// is not taken for unknown.
	unknownGrace = 2 * time.Second
	// consumerKnownFor is how long a consumer found stays known without a
	// new lookup; consumerMissingFor the same for one not found.
	consumerKnownFor   = time.Minute
	consumerMissingFor = 5 * time.Second
)

// OtherReceivers is the receiver label of the messages to unknown agents
// past the first maxUnknownLabels receivers.
const OtherReceivers = "_other"

// UnknownReceiver is a receiver that had no consumer for a direct message
// sent to it (GET /api/v1/unknown_receivers): no such agent, or not at
// that priority. The message waits in the stream, undelivered.
type UnknownReceiver struct {
	Receiver      string    `json:"receiver"`
	Messages      int64     `json:"messages"` // since this instance started
	LastMessageID string    `json:"last_message_id"`
	LastSender    string    `json:"last_sender"`
	LastPriority  string    `json:"last_priority"`
	LastSentAt    time.Time `json:"last_sent_at"`
}

// unknownReceivers finds the direct messages whose receiver has no
// consumer in the mesh stream: the intake offers each new send, and run
// looks the consumer up unknownGrace after the send. Each instance checks
// the sends it applied first, as the other counters do.
type unknownReceivers struct {
	cfg     *Config
	js      jetstream.JetStream
	metrics *metrics
	queue   chan store.Send
	groups  *groupMembers // nil: no group consumer is looked at (tests)

	mu     sync.Mutex
	seen   map[string]consumerSeen // consumer → last lookup
	labels map[string]bool         // receivers with a label value of their own
	listed map[string]*UnknownReceiver
}

type consumerSeen struct {
	exists bool
	at     time.Time
}

func newUnknownReceivers(cfg *Config, js jetstream.JetStream, m *metrics) *unknownReceivers {
	return &unknownReceivers{cfg: cfg, js: js, metrics: m, queue: make(chan store.Send, unknownQueue),
		seen: map[string]consumerSeen{}, labels: map[string]bool{}, listed: map[string]*UnknownReceiver{}}
}

// offer queues the direct sends among sends for their check, without
// blocking the intake.
func (u *unknownReceivers) offer(sends []store.Send) {
	if u == nil { // an intake built without the checks (tests)
		return
	}
	for _, s := range sends {
		if s.Consumer() == "" {
			continue
		}
		select {
		case u.queue <- s:
		default: // a flood: the checks fall behind, the intake must not
		}
	}
}

// run checks the queued sends until ctx is done.
func (u *unknownReceivers) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case s := <-u.queue:
			sleep(ctx, time.Until(s.SentAt.Add(unknownGrace)))
			if ctx.Err() != nil {
				return
			}
			exists, err := u.exists(ctx, s.Consumer())
			if err != nil {
				u.cfg.Logger.Debug("receiver lookup", "consumer", s.Consumer(), "err", err)
				continue
			}
			if !exists {
				u.record(s)
			}
		}
	}
}

// exists reports whether consumer (a receiver's direct consumer) is in
// the mesh stream or a group consumer's filters include its receiver's,
// from the cache when it is fresh.
func (u *unknownReceivers) exists(ctx context.Context, consumer string) (bool, error) {
	now := time.Now()
	u.mu.Lock()
	c, ok := u.seen[consumer]
	u.mu.Unlock()
	if ok && (c.exists && now.Sub(c.at) < consumerKnownFor || !c.exists && now.Sub(c.at) < consumerMissingFor) {
		return c.exists, nil
	}
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err := u.js.Consumer(lctx, u.cfg.Scheme.Stream(), consumer)
	found := err == nil
	switch {
	case errors.Is(err, jetstream.ErrConsumerNotFound):
		if u.groups == nil {
			break
		}
		// A member's messages are its group consumer's to deliver. The
		// group consumers are listed at most every consumerMissingFor.
		group, gerr := u.groups.groupOf(lctx, consumer, now.Add(-consumerMissingFor))
		if gerr != nil {
			return false, gerr
		}
		found = group != ""
	case err != nil:
		return false, err
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.seen) >= 10*maxUnknownListed {
		clear(u.seen) // made-up receivers: a cache, so start again
	}
	u.seen[consumer] = consumerSeen{exists: found, at: now}
	return found, nil
}

// record counts a message to an unknown receiver and lists it.
func (u *unknownReceivers) record(s store.Send) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.metrics.unknownReceivers.WithLabelValues(u.label(s.Receiver)).Inc()
	r := u.listed[s.Receiver]
	if r == nil {
		if len(u.listed) >= maxUnknownListed {
			oldest := ""
			for k, v := range u.listed {
				if oldest == "" || v.LastSentAt.Before(u.listed[oldest].LastSentAt) {
					oldest = k
				}
			}
			delete(u.listed, oldest)
		}
		r = &UnknownReceiver{Receiver: s.Receiver}
		u.listed[s.Receiver] = r
	}
	r.Messages++
	r.LastMessageID, r.LastSender, r.LastPriority, r.LastSentAt = s.MessageID, s.Sender, s.Priority, s.SentAt
}

// label returns receiver's label value: its own for the first
// maxUnknownLabels receivers, OtherReceivers after. u.mu is held.
func (u *unknownReceivers) label(receiver string) string {
	if u.labels[receiver] {
		return receiver
	}
	if len(u.labels) >= maxUnknownLabels {
		return OtherReceivers
	}
	u.labels[receiver] = true
	return receiver
}

// list returns the listed receivers, the latest message first.
func (u *unknownReceivers) list() []UnknownReceiver {
	u.mu.Lock()
	out := make([]UnknownReceiver, 0, len(u.listed))
	for _, r := range u.listed {
		out = append(out, *r)
	}
	u.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		if !out[i].LastSentAt.Equal(out[j].LastSentAt) {
			return out[i].LastSentAt.After(out[j].LastSentAt)
		}
		return out[i].Receiver < out[j].Receiver
	})
	return slices.Clip(out)
}
