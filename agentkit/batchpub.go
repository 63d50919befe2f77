package agentkit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/subjects"
)

// SendBatch stores a batch with JetStream's fast batch publish (NATS 2.14+,
// the stream's allow_batched): the messages travel without a reply each
// and the stream confirms the batch with one ack that counts the messages
// it stored, from the first, in order. That saves the stream's per-message
// ack and its decoding. nats.go has no client for it, so fastBatch speaks
// the server's protocol: each message's reply subject
// (subjects.AppendFastBatchReply) carries the batch's id, the message's
// place in it and the operation.
//
// fastBatch is only a faster way to the same result. Whatever it does not
// confirm, SendBatch publishes again one message at a time, under the same
// message ids, so a message the stream stored anyway is deduplicated, and
// each failure is reported for its own message.

const (
	// fastBatchFlow is the most messages the server may let pass between
	// two flow-control acks, its own ceiling: fastBatch needs none, only
	// the commit's ack.
	fastBatchFlow = 500
	// maxFastBatch bounds one fast batch in messages and bytes, so a batch
	// never floods the stream's ingest queue (100,000 messages and 128 MiB
	// by default, shared by every publisher); longer ones go in turn.
	maxFastBatch      = 1000
	maxFastBatchBytes = 8 << 20
)

// errFastBatchUnsupported reports a server or stream without fast batch
// publish.
var errFastBatchUnsupported = errors.New("agentkit: stream does not accept fast batch publish")

// jsBatchPublishDisabled is the server's error code for a stream without
// allow_batched (JSBatchPublishDisabledErr).
const jsBatchPublishDisabled = 10205

// fastBatchReply is any message the stream sends to a fast batch's reply
// subject: a flow-control message (Type set), the batch's ack, or an error.
type fastBatchReply struct {
	Type  string              `json:"type"` // flow control: ack, gap or err
	Batch string              `json:"batch"`
	Count int                 `json:"count"`
	Error *jetstream.APIError `json:"error"`
}

// fastBatches tracks whether the stream accepts fast batches (it starts
// on and turns off for good at the first sign it does not: a server before
// 2.14 or a stream without allow_batched), and routes every batch's
// replies to the batch waiting for them through one wildcard subscription,
// made on first use: a subscription per batch would cost a SUB and an
// UNSUB each, and every change to the server's subscription list empties
// its match cache.
//
// It also admits the agent's sends (enter, leave), none once the agent has
// stopped: a send then would subscribe again to its acks (nats.go's async
// publisher, or the batch replies), and nothing would drop that
// subscription, nor its goroutine, before the connection closes. Its
// close is the stop's last step for the send side.
type fastBatches struct {
	off atomic.Bool

	mu      sync.Mutex
	closed  bool                // the agent has stopped: no new send, no new subscription
	sends   int                 // sends admitted and not yet done
	js      jetstream.JetStream // the publisher the admitted sends used
	sub     *nats.Subscription
	base    string // the subscription is base.>; a batch's inbox is base.<batch id>
	waiting map[string]chan fastOutcome
}

// enter admits a send through js, unless the agent has stopped. A send
// admitted calls leave when it is done.
func (f *fastBatches) enter(js jetstream.JetStream) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return false
	}
	f.sends++
	f.js = js
	return true
}

// leave ends a send enter admitted. The stop cleans up the publisher's
// reply subscription before close, and a send under way then may have made
// it again: the last one to end after close cleans it up once more.
func (f *fastBatches) leave() {
	f.mu.Lock()
	f.sends--
	js, last := f.js, f.closed && f.sends == 0
	f.mu.Unlock()
	if last {
		js.CleanupPublisher()
	}
}

// fastOutcome is how a fast batch ended: how many messages, from the
// first, the stream stored, or why it failed.
type fastOutcome struct {
	stored int
	err    error
}

// errFastBatchesClosed reports a fast batch of a stopped agent: its
// messages are published one by one.
var errFastBatchesClosed = errors.New("agentkit: agent stopped: no fast batches")

// open registers a new batch and returns its inbox and id, and the channel
// that receives its outcome.
func (f *fastBatches) open(nc *nats.Conn) (inbox, id string, result chan fastOutcome, err error) {
	inbox = nc.NewInbox()
	id = inbox[strings.LastIndexByte(inbox, '.')+1:]
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		// A subscription made now would outlive the agent: nothing
		// would drop it before the connection closes.
		return "", "", nil, errFastBatchesClosed
	}
	if f.sub == nil {
		base := nc.NewInbox()
		sub, err := nc.Subscribe(base+".>", f.route)
		if err != nil {
			return "", "", nil, err
		}
		f.sub, f.base, f.waiting = sub, base, make(map[string]chan fastOutcome)
	}
	result = make(chan fastOutcome, 1)
	f.waiting[id] = result
	return f.base + "." + id, id, result, nil
}

// done forgets batch id: later replies to it are noise.
func (f *fastBatches) done(id string) {
	f.mu.Lock()
	delete(f.waiting, id)
	f.mu.Unlock()
}

// route hands a reply to its batch, if it decides the batch.
func (f *fastBatches) route(m *nats.Msg) {
	f.mu.Lock()
	rest, _ := strings.CutPrefix(m.Subject, f.base+".")
	id, _, _ := strings.Cut(rest, ".")
	result := f.waiting[id]
	f.mu.Unlock()
	if result == nil {
		return
	}
	if stored, err := fastBatchResult(m, id); stored >= 0 || err != nil {
		select {
		case result <- fastOutcome{max(stored, 0), err}:
		default: // the batch is decided; later replies are noise
		}
	}
}

// stopped reports whether close has run: the agent admits no more sends.
func (f *fastBatches) stopped() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.closed
}

// close drops the reply subscription for good and admits no more sends:
// the agent has stopped. If no send is under way, it cleans up the
// publisher once more, for a send that made its reply subscription again
// after the stop's cleanup and ended before close; else the last one to
// end does (leave).
func (f *fastBatches) close() {
	f.mu.Lock()
	f.closed = true
	if f.sub != nil {
		f.sub.Unsubscribe() //nolint:errcheck // a closed connection has dropped it already
		f.sub, f.waiting = nil, nil
	}
	js, idle := f.js, f.sends == 0
	f.mu.Unlock()
	if idle && js != nil {
		js.CleanupPublisher()
	}
}

// publishFast stores msgs with fast batches of at most maxFastBatch and
// returns how many of them, from the first, the stream confirmed. The
// messages after those are left for the caller to publish one by one; the
// ones a batch sent without an answer that accounts for them are noted
// in tried as maybe stored.
func (s *sender) publishFast(ctx context.Context, msgs []outMsg, tried []attempts) int {
	done := 0
	for done < len(msgs) && !s.fast.off.Load() && ctx.Err() == nil {
		n, size := 0, 0
		for _, m := range msgs[done:] {
			if n == maxFastBatch || (n > 0 && size+len(m.Data) > maxFastBatchBytes) {
				break
			}
			n, size = n+1, size+len(m.Data)
		}
		if n < 2 {
			break // one message is cheaper alone
		}
		stored, sent, err := s.fastBatch(ctx, msgs[done:done+n])
		if stored > n {
			stored, err = 0, fmt.Errorf("agentkit: fast batch ack counts %d of %d messages", stored, n)
		}
		for i := done + stored; i < done+sent; i++ {
			tried[i].note(fastUnconfirmed(err))
		}
		done += stored
		s.stats.fastBatched.Add(uint64(stored))
		if err != nil || stored < n {
			if errors.Is(err, errFastBatchUnsupported) && s.fast.off.CompareAndSwap(false, true) {
				s.opts.logger.Info("stream takes no fast batches: SendBatch publishes one message at a time",
					"agent", s.id, "stream", s.opts.scheme.Stream(), "err", err)
			}
			s.opts.logger.Debug("agentkit fast batch ended early", "agent", s.id, "stored", stored, "of", n, "err", err)
			s.stats.fastFallbacks.Add(uint64(len(msgs) - done))
			break
		}
	}
	for i := done; i < len(msgs); i++ {
		msgs[i].Reply = "" // PublishMsgAsync sets its own
	}
	return done
}

// fastUnconfirmed is the outcome of the messages a fast batch that ended
// with err sent after those it confirmed. Only a few answers prove it
// stored none of them: its ack (the count says where the batch ended),
// no stream listening, a stream refusing fast batches. An error reply is
// one message's and says nothing of the others, and silence nothing at
// all.
func fastUnconfirmed(err error) pubOutcome {
	var apiErr *jetstream.APIError
	switch {
	case err == nil, errors.Is(err, nats.ErrNoResponders),
		errors.Is(err, errFastBatchUnsupported) && errors.As(err, &apiErr):
		return pubNone
	}
	return pubUnknown
}

// fastBatch publishes msgs, at least two, as one fast batch and waits for
// its ack, at most one publish attempt's time (or half what is left of
// ctx). It returns how many messages, from the first, the stream stored,
// and how many left this client. A reply it cannot account for ends the
// wait with nothing confirmed: republishing is always safe, trusting an
// unexplained reply is not.
func (s *sender) fastBatch(ctx context.Context, msgs []outMsg) (stored, sent int, err error) {
	inbox, batchID, result, err := s.fast.open(s.nc)
	if err != nil {
		return 0, 0, err
	}
	defer s.fast.done(batchID)
	reply := make([]byte, 0, len(inbox)+48)
	for i, m := range msgs {
		op := subjects.FastBatchAppend
		switch {
		case i == len(msgs)-1:
			op = subjects.FastBatchCommit
		case i == 0:
			op = subjects.FastBatchStart
		}
		reply = subjects.AppendFastBatchReply(reply[:0], inbox, fastBatchFlow, i+1, op)
		m.Reply = string(reply)
		if err := s.nc.PublishMsg(m.Msg); err != nil {
			return 0, i, err
		}
	}
	wait := s.opts.attemptTimeout
	if deadline, ok := ctx.Deadline(); ok {
		wait = min(wait, time.Until(deadline)/2)
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case r := <-result:
		return r.stored, len(msgs), r.err
	case <-timer.C:
		return 0, len(msgs), fmt.Errorf("agentkit: fast batch: no ack within %v: %w", wait, context.DeadlineExceeded)
	case <-ctx.Done():
		return 0, len(msgs), ctx.Err()
	}
}

// fastBatchResult reads one message on a fast batch's reply subject: the
// number of messages the batch stored, or -1 for a flow-control message.
func fastBatchResult(m *nats.Msg, batchID string) (int, error) {
	if status := m.Header.Get("Status"); status == "503" {
		return 0, fmt.Errorf("agentkit: fast batch: %w", nats.ErrNoResponders) // no stream, or no leader yet
	} else if status != "" {
		return 0, fmt.Errorf("agentkit: fast batch: reply status %s %s", status, m.Header.Get("Description"))
	}
	var r fastBatchReply
	if err := json.Unmarshal(m.Data, &r); err != nil {
		return 0, fmt.Errorf("agentkit: fast batch reply %q: %w", m.Data, err)
	}
	switch {
	case r.Type != "":
		return -1, nil // a gap or an error ends the batch, and its ack says where
	case r.Error != nil && r.Error.ErrorCode == jsBatchPublishDisabled:
		return 0, fmt.Errorf("%w: %w", errFastBatchUnsupported, r.Error)
	case r.Error != nil:
		return 0, r.Error
	case r.Batch != batchID:
		// A plain ack: a server that does not know fast batches stored the
		// first message as a single publish.
		return 0, errFastBatchUnsupported
	}
	return r.Count, nil
}
