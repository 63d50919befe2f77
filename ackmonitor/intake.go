package ackmonitor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/ackmonitor/store"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// intake writes the mesh's sends and consumer events to the ledger: it
// pulls the sends and events consumers (pull), writes the events received
// on core NATS (directIntake), and keeps the count of messages the ledger
// refuses (writeSplit). It renews the lease with the events pulls served as
// the pin holder's, and tells the follow-ups of rows to follow up and of
// how far the events are written.
type intake struct {
	cfg       *Config
	nc        *nats.Conn
	metrics   *metrics
	lease     *lease
	followUps *followUps
	unknown   *unknownReceivers // checks the new sends' receivers
	direct    *directEvents     // events directIntake wrote
	groups    *groupMembers     // the group consumers' members, for attributing their events
	seqs      *seqReceivers     // the latest sends' receivers, by stream sequence
	mesh      jetstream.Stream  // set by Run before the intake starts; nil in tests that do not run

	eventsHeld atomic.Int64  // events this instance fetched and has not yet acked
	applied    atomic.Uint64 // stream messages committed to the ledger
	lastLag    atomic.Int64  // ns
}

// held is the number of events this instance fetched and has not yet
// acked.
func (in *intake) held() int64 { return in.eventsHeld.Load() }

// processed is the number of stream messages committed to the ledger.
func (in *intake) processed() uint64 { return in.applied.Load() }

// lag is how old the newest event or send of the last batch written was
// when it was written.
func (in *intake) lag() time.Duration { return time.Duration(in.lastLag.Load()) }

// advisory is the JSON of an ack metric or a NAK, TERM or MAX_DELIVERIES
// advisory, as nats-server publishes them; nats.go has no types for them.
type advisory struct {
	ID         string    `json:"id"`
	Timestamp  time.Time `json:"timestamp"`
	Stream     string    `json:"stream"`
	Consumer   string    `json:"consumer"`
	StreamSeq  uint64    `json:"stream_seq"`
	AckTime    int64     `json:"ack_time"` // ns
	Deliveries uint64    `json:"deliveries"`
	Reason     string    `json:"reason"`
}

var eventKinds = map[subjects.EventKind]store.EventKind{
	subjects.EventAck:           store.EventAck,
	subjects.EventNak:           store.EventNak,
	subjects.EventTerminated:    store.EventTerm,
	subjects.EventMaxDeliveries: store.EventMax,
}

// parseEvent turns a MESH_EVENTS message into a ledger event; ok is false
// for messages the ledger ignores.
func (in *intake) parseEvent(msg jetstream.Msg) (store.Event, bool) {
	e, ok := in.parseAdvisory(msg.Subject(), msg.Data())
	if ok && e.ID == "" {
		// The events stream sequence identifies the event as well.
		if md, err := msg.Metadata(); err == nil {
			e.ID = "events-seq-" + strconv.FormatUint(md.Sequence.Stream, 10)
		}
	}
	return e, ok
}

// parseAdvisory turns a consumer event published on subject into a ledger
// event; ok is false for events the ledger ignores. The event's id is the
// advisory's, if it has one.
func (in *intake) parseAdvisory(subject string, data []byte) (store.Event, bool) {
	ev, err := subjects.ParseEvent(subject)
	if err != nil || ev.Stream != in.cfg.Scheme.Stream() {
		return store.Event{}, false
	}
	var a advisory
	if err := json.Unmarshal(data, &a); err != nil {
		in.cfg.Logger.Warn("undecodable consumer event", "subject", subject, "err", err)
		return store.Event{}, false
	}
	// A fan-out consumer's event has no priority: the consumer reads
	// several, and the ledger row takes its message's from the send.
	c, err := in.cfg.Scheme.ParseConsumerName(ev.Consumer)
	if err != nil {
		return store.Event{}, false // not an agent consumer (e.g. the monitor's own)
	}
	return store.Event{ID: a.ID, Kind: eventKinds[ev.Kind], Consumer: ev.Consumer, Receiver: c.Agent, Priority: c.Priority,
		StreamSeq: a.StreamSeq, Deliveries: a.Deliveries, AckTime: time.Duration(a.AckTime), Reason: a.Reason,
		At: a.Timestamp.UTC()}, true
}

// UnknownSender stands for the sender of a message whose subject's
// sender token is not a valid agent id (a peer published it without
// agentkit, which its receiver terminates as invalid): the ledger
// attributes the message to it, and its dead letter and alerts go to
// subjects with it as the sender token. Agent ids may start with "_", but
// no agentkit agent should be called this.
const UnknownSender = "_unknown"

// parseSubject parses a message subject as scheme does, except
// that one whose sender token (the last) alone is invalid parses with
// UnknownSender instead: the sender is what the subject says, never a
// header or envelope field the sender writes freely, and a bounded,
// valid token.
func parseSubject(scheme subjects.Scheme, subject string) (subjects.Subject, error) {
	sub, err := scheme.Parse(subject)
	if err == nil {
		return sub, nil
	}
	if i := strings.LastIndexByte(subject, '.'); i >= 0 {
		alt, altErr := scheme.Parse(subject[:i+1] + UnknownSender)
		if altErr == nil && (alt.Kind == subjects.KindDirect || alt.Kind == subjects.KindTopic || alt.Kind == subjects.KindBroadcast) {
			return alt, nil
		}
	}
	return subjects.Subject{}, err
}

// parseSend turns a headers-only MESH message into a send record. body is
// the message's body when its sender mirrors no header (see wire.Mirrored),
// else nil: the record then takes from the envelope what the headers
// lack.
func (in *intake) parseSend(msg jetstream.Msg, body []byte) (store.Send, bool) {
	md, err := msg.Metadata()
	if err != nil {
		return store.Send{}, false
	}
	sub, err := parseSubject(in.cfg.Scheme, msg.Subject())
	if err != nil {
		return store.Send{}, false
	}
	h := msg.Headers()
	s := store.Send{StreamSeq: md.Sequence.Stream, MessageID: h.Get(wire.HeaderMsgID), Sender: sub.Sender,
		Kind: string(sub.Kind), Priority: sub.Priority, MessageType: h.Get(wire.HeaderType),
		Action: h.Get(wire.HeaderAction), Correlation: h.Get(wire.HeaderCorrelation),
		Workflow: h.Get(wire.HeaderWorkflow), InReplyTo: h.Get(wire.HeaderInReplyTo), SentAt: md.Timestamp.UTC()}
	if env := envelopeOf(body); env != nil {
		s.MessageID = first(s.MessageID, env.MessageID)
		s.MessageType = first(s.MessageType, string(env.MessageType))
		s.Action = first(s.Action, env.Action)
		s.Correlation = first(s.Correlation, env.Correlation)
		s.Workflow = first(s.Workflow, env.WorkflowID)
		s.InReplyTo = first(s.InReplyTo, env.InReplyTo)
	}
	switch sub.Kind {
	case subjects.KindDirect:
		s.Receiver = sub.Receiver
	case subjects.KindTopic:
		s.Topic = sub.Topic
	}
	return s, true
}

// intakeBatch is what one fetch of stream messages amounts to: the ledger
// batch to write, each message's kind (for the metrics), and the newest
// event or send time among them (for the lag), also of events directIntake
// wrote already and the batch leaves out. later marks the messages to be
// redelivered instead of acked once the batch is written (nil: none).
type intakeBatch struct {
	store.Batch
	kinds  []string
	newest time.Time
	later  []bool
}

// anyLater reports whether some message of b waits for its redelivery.
func (b *intakeBatch) anyLater() bool { return slices.Contains(b.later, true) }

func (in *intake) eventsBatch(ctx context.Context, msgs []jetstream.Msg) intakeBatch {
	since := time.Now() // the messages were received before
	b := intakeBatch{kinds: make([]string, len(msgs))}
	events := make([]store.Event, len(msgs))
	var todo []*store.Event // parsed, and not written by directIntake
	var todoAt []int
	var tries []uint64
	for i, msg := range msgs {
		e, ok := in.parseEvent(msg)
		if !ok {
			b.kinds[i] = "ignored"
			continue
		}
		events[i] = e
		b.kinds[i] = string(e.Kind)
		if !in.direct.written(e.ID) {
			todo, todoAt = append(todo, &events[i]), append(todoAt, i)
			n := uint64(1)
			if md, err := msg.Metadata(); err == nil {
				n = md.NumDelivered
			}
			tries = append(tries, n)
		}
	}
	verdicts := in.attributeGroupEvents(ctx, todo, tries, since)
	skip := make([]bool, len(msgs))
	for j, v := range verdicts {
		i := todoAt[j]
		switch v {
		case eventIgnored:
			b.kinds[i], skip[i] = "ignored", true
		case eventLater:
			if b.later == nil {
				b.later = make([]bool, len(msgs))
			}
			b.kinds[i], skip[i], b.later[i] = "", true, true
		default:
			b.Events = append(b.Events, *todo[j])
		}
	}
	for i := range msgs {
		if b.kinds[i] != "ignored" && !skip[i] {
			b.newest = maxTime(b.newest, events[i].At)
		}
	}
	return b
}

// sendsBatch turns sends into a batch, reading from mesh the bodies of
// those whose sender mirrors no header.
func (in *intake) sendsBatch(ctx context.Context, mesh jetstream.Stream, msgs []jetstream.Msg) intakeBatch {
	b := intakeBatch{kinds: make([]string, len(msgs))}
	bodies := in.bodies(ctx, mesh, msgs)
	for i, msg := range msgs {
		s, ok := in.parseSend(msg, bodies[i])
		if !ok {
			in.seqs.add(streamSeq(msg), directTo{}) // no valid mesh message
			b.kinds[i] = "ignored"
			continue
		}
		if s.Kind == string(subjects.KindDirect) {
			in.seqs.add(s.StreamSeq, directTo{receiver: s.Receiver, priority: s.Priority})
		} else {
			in.seqs.add(s.StreamSeq, directTo{})
		}
		b.Sends = append(b.Sends, s)
		b.kinds[i], b.newest = "send", maxTime(b.newest, s.SentAt)
	}
	return b
}

// pullEvents writes the consumer events of cons, the events consumer,
// until ctx is done (pull).
func (in *intake) pullEvents(ctx context.Context, cons jetstream.Consumer) {
	in.pull(ctx, cons, true, func(msgs []jetstream.Msg) intakeBatch { return in.eventsBatch(ctx, msgs) })
}

// pullSends writes the sends of cons, the sends consumer on mesh, until
// ctx is done (pull).
func (in *intake) pullSends(ctx context.Context, cons jetstream.Consumer, mesh jetstream.Stream) {
	in.pull(ctx, cons, false, func(msgs []jetstream.Msg) intakeBatch { return in.sendsBatch(ctx, mesh, msgs) })
}

// bodyReaders bounds the body reads a batch of sends has in flight.
const bodyReaders = 8

// bodies returns, for each of msgs (headers only), its body read from
// mesh when its sender mirrors no header, else nil. The sends consumer
// delivers headers only, so a sender that leaves them out costs a read
// per message, never a ledger field. A read that fails leaves the
// record with what the headers say.
func (in *intake) bodies(ctx context.Context, mesh jetstream.Stream, msgs []jetstream.Msg) [][]byte {
	out := make([][]byte, len(msgs))
	var todo []int
	for i, msg := range msgs {
		if !wire.Mirrored(msg.Headers()) {
			todo = append(todo, i)
		}
	}
	if len(todo) == 0 || mesh == nil {
		return out
	}
	parallel(len(todo), bodyReaders, func(j int) {
		i := todo[j]
		seq := streamSeq(msgs[i])
		if seq == 0 {
			return
		}
		rctx, cancel := context.WithTimeout(ctx, copyTimeout)
		defer cancel()
		raw, err := mesh.GetMsg(rctx, seq)
		if err != nil {
			if ctx.Err() == nil {
				in.cfg.Logger.Warn("reading the body of a send without headers", "stream_seq", seq, "err", err)
			}
			return
		}
		out[i] = raw.Data
	})
	return out
}

// envelopeOf decodes body as an envelope, or returns nil when it is not a
// valid one (its receiver terminates it) or is empty. Decoding validates
// every field the ledger takes, and is bounded like a receiver's.
func envelopeOf(body []byte) *wire.Envelope {
	if len(body) == 0 || len(body) > wire.DefaultMaxEnvelopeBytes {
		return nil
	}
	env, err := wire.Decode(body)
	if err != nil {
		return nil
	}
	return env
}

// pull pulls batches from cons (in the pinned priority group), writes
// each batch in one store transaction and acks its messages only after
// the commit. A batch that fails is written again in parts (writeSplit),
// so one message the ledger refuses cannot hold up the rest;
// the ledger's idempotency makes the retries safe. isEvents tells the
// events consumer, whose pulls renew the lease, from the sends consumer.
func (in *intake) pull(ctx context.Context, cons jetstream.Consumer, isEvents bool, toBatch func([]jetstream.Msg) intakeBatch) {
	refused := map[uint64]int{} // see writeSplit
	// The events written (followUps.eventsWritten) may not pass a failed
	// write's NAKed events before they are redelivered (writeSplit's
	// delay): a pull before then finds them missing, not written.
	var nakedUntil int64
	through := func(pulled int64) {
		if isEvents && pulled > nakedUntil {
			in.followUps.eventsWritten(pulled)
		}
	}
	for ctx.Err() == nil {
		pulled := time.Now().UnixNano()
		pinned := isEvents && in.lease.pinned()
		msgs, err := in.fetch(cons, isEvents)
		whole := err == nil // msgs is all the pull brought
		if isEvents {
			in.lease.answered(pulled, pinned, err)
		}
		if err != nil && len(msgs) > 0 {
			in.cfg.Logger.Warn("fetch ended early", "consumer", cons.CachedInfo().Name, "n", len(msgs), "err", err)
		} else if err != nil {
			if ctx.Err() != nil {
				return
			}
			if !errors.Is(err, jetstream.ErrPinIDMismatch) {
				in.cfg.Logger.Warn("fetch", "consumer", cons.CachedInfo().Name, "err", err)
			}
			sleep(ctx, in.cfg.FetchWait)
			continue
		}
		if len(msgs) == 0 {
			through(pulled)
			continue
		}
		if isEvents {
			if pin := msgs[len(msgs)-1].Headers().Get("Nats-Pin-Id"); pin != "" {
				in.lease.pinnedAs(pin)
			}
		}
		b := toBatch(msgs)
		applied, err := in.apply(ctx, b.Batch)
		if isEvents {
			in.eventsHeld.Store(0) // before the acks, so a status check errs on the side of waiting
		}
		if err != nil {
			in.cfg.Logger.Error("ledger write failed; writing the batch in parts", "n", len(msgs), "err", err)
			if !in.writeSplit(ctx, cons, msgs, toBatch, refused) {
				sleep(ctx, time.Second) // nothing written: the store is down
			}
			nakedUntil = time.Now().Add(intakeNakDelay).UnixNano()
			continue
		}
		in.committed(msgs, b, applied)
		if len(refused) > 0 {
			for _, msg := range msgs {
				delete(refused, streamSeq(msg)) // written after all
			}
		}
		if b.anyLater() {
			nakedUntil = time.Now().Add(attributeNakDelay).UnixNano()
		} else if whole {
			through(pulled)
		}
	}
}

// committed acks msgs, whose batch b the ledger has written, and counts
// them.
func (in *intake) committed(msgs []jetstream.Msg, b intakeBatch, applied store.Applied) {
	acked := 0
	for i, msg := range msgs {
		if b.later != nil && b.later[i] {
			_ = msg.NakWithDelay(attributeNakDelay)
			continue
		}
		_ = msg.Ack() // a lost ack means a redelivery, which the ledger ignores
		acked++
	}
	for _, k := range b.kinds {
		if k != "" { // counted when it is written
			in.metrics.events.WithLabelValues(k).Inc()
		}
	}
	in.applied.Add(uint64(acked))
	in.metrics.batches.Inc()
	in.recorded(applied)
	if !b.newest.IsZero() {
		lag := time.Since(b.newest)
		in.lastLag.Store(int64(lag))
		in.metrics.lag.Set(lag.Seconds())
	}
}

// intakeNakDelay is how long a message the ledger refused waits for its
// redelivery.
const intakeNakDelay = time.Second

// maxIntakeAttempts is how many passes of writeSplit may refuse a message
// while the store takes other writes before the message is terminated.
const maxIntakeAttempts = 5

// maxRefused bounds writeSplit's count of refusals; past it the count
// starts again.
const maxRefused = 10000

// writeSplit writes msgs after their batch failed, acking each one
// written, and reports whether any was. While the store is down (its
// probe fails) nothing is tried and every message is NAKed for
// redelivery. Otherwise the batch is halved until the parts that fail are
// single messages, so one message the store refuses costs a few writes
// per pass rather than one per message of the batch. A message that fails
// alone is NAKed for redelivery. When the store takes other writes in the
// same pass (the other messages' or, when none was written, a probe
// after the failures), the failure is the message's (data the store
// cannot take), not the store's, and counts in refused (by stream
// sequence); at maxIntakeAttempts the message is terminated, logged and
// counted in ackmonitor_intake_refused_total instead of failing every
// batch it lands in for good. A refused event is recorded as such
// (store.Batch Refused) before it is terminated, so no ACK is inferred
// for a message whose TERM or MAX_DELIVERIES is lost; while that fails it
// is NAKed.
func (in *intake) writeSplit(ctx context.Context, cons jetstream.Consumer, msgs []jetstream.Msg, toBatch func([]jetstream.Msg) intakeBatch, refused map[uint64]int) bool {
	if in.probe(ctx) != nil {
		for _, msg := range msgs {
			_ = msg.NakWithDelay(intakeNakDelay)
		}
		return false
	}
	type failure struct {
		msg jetstream.Msg
		err error
	}
	var failed []failure
	wrote := false
	var write func(part []jetstream.Msg)
	write = func(part []jetstream.Msg) {
		b := toBatch(part)
		applied, err := in.apply(ctx, b.Batch)
		switch {
		case err == nil:
			in.committed(part, b, applied)
			for _, msg := range part {
				delete(refused, streamSeq(msg))
			}
			// Only a store write is evidence the store takes writes: a
			// message the intake ignores (or directIntake wrote) writes
			// nothing.
			wrote = wrote || len(b.Sends)+len(b.Events) > 0
		case len(part) == 1:
			failed = append(failed, failure{part[0], err})
		default:
			write(part[:len(part)/2])
			write(part[len(part)/2:])
		}
	}
	if len(msgs) == 1 {
		write(msgs)
	} else { // the whole batch failed already
		write(msgs[:len(msgs)/2])
		write(msgs[len(msgs)/2:])
	}
	if len(refused) > maxRefused {
		clear(refused) // entries of messages handled elsewhere since (another instance, MaxAge)
	}
	took := wrote || len(failed) > 0 && in.probe(ctx) == nil // the store takes writes
	for _, f := range failed {
		seq := streamSeq(f.msg)
		if took && seq > 0 {
			refused[seq]++
		}
		if refused[seq] < maxIntakeAttempts {
			_ = f.msg.NakWithDelay(intakeNakDelay)
			continue
		}
		events := toBatch([]jetstream.Msg{f.msg}).Events
		if _, err := in.apply(ctx, store.Batch{Refused: events}); err != nil {
			in.cfg.Logger.Warn("recording a refused event failed; not terminated", "stream_seq", seq, "err", err)
			_ = f.msg.NakWithDelay(intakeNakDelay) // tried again, as the count stays
			continue
		}
		delete(refused, seq)
		name := cons.CachedInfo().Name
		attrs := []any{"consumer", name, "subject", f.msg.Subject(), "stream_seq", seq, "err", f.err}
		for _, e := range events {
			// The ledger row the event is about (stream_seq is the event's
			// own): after a TERM or MAX_DELIVERIES it stays pending for good.
			attrs = append(attrs, "event", e.Kind, "row", fmt.Sprintf("%d/%s", e.StreamSeq, e.Consumer))
		}
		in.cfg.Logger.Error("the ledger refuses a message; terminated", attrs...)
		in.metrics.refused.WithLabelValues(name).Inc()
		_ = f.msg.TermWithReason("the ack ledger refuses it: " + f.err.Error())
	}
	return wrote
}

// streamSeq is msg's sequence in its stream, or 0.
func streamSeq(msg jetstream.Msg) uint64 {
	md, err := msg.Metadata()
	if err != nil {
		return 0
	}
	return md.Sequence.Stream
}

// recorded counts what a committed batch changed and wakes the follow-up
// loop when a row reached a status it follows up.
func (in *intake) recorded(applied store.Applied) {
	in.metrics.observe(applied)
	in.unknown.offer(applied.NewSends)
	for _, r := range applied.Resolved {
		if followedUp(r.Status) {
			in.followUps.wake()
			return
		}
	}
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// probe checks that the store takes writes: it applies an empty batch,
// which the store commits as a write that changes nothing.
func (in *intake) probe(ctx context.Context) error {
	c, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := in.cfg.Store.Apply(c, store.Batch{}); err != nil {
		return fmt.Errorf("ackmonitor: store probe: %w", err)
	}
	return nil
}

// apply writes b, retrying on the monitor's shutdown-independent context
// so a commit in flight is not cut off half way by ctx.
func (in *intake) apply(ctx context.Context, b store.Batch) (store.Applied, error) {
	if len(b.Sends) == 0 && len(b.Events) == 0 && len(b.Refused) == 0 {
		return store.Applied{}, nil
	}
	c, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	a, err := in.cfg.Store.Apply(c, b)
	if err != nil {
		return a, fmt.Errorf("ackmonitor: apply: %w", err)
	}
	return a, nil
}

// fetch returns the next batch: up to BatchSize messages, waiting at most
// FetchWait for them. The pull ends when the server says it expired, not
// at a client deadline: a message the server delivered just before its
// expiry would arrive after such a deadline and be dropped, unacked, so
// it came back only after AckWait (under load, a takeover's follow-ups
// then missed a redelivered NAK). A shutdown waits for the pull to end.
func (in *intake) fetch(cons jetstream.Consumer, isEvents bool) ([]jetstream.Msg, error) {
	batch, err := cons.Fetch(in.cfg.BatchSize, jetstream.FetchMaxWait(in.cfg.FetchWait), jetstream.FetchPriorityGroup(in.cfg.PriorityGroup))
	if err != nil {
		return nil, err
	}
	var msgs []jetstream.Msg
	for msg := range batch.Messages() {
		msgs = append(msgs, msg)
		if isEvents {
			in.eventsHeld.Add(1) // as it arrives: a status check may come before the batch is complete
		}
	}
	return msgs, batch.Error() // nil when the pull expired
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
