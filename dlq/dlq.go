// Package dlq owns the mesh's dead letters: the headers a dead letter
// carries, reading them from the dead-letter stream and replaying them to
// the subject they were first sent on.
//
// The ack monitor writes a dead letter when a message exhausted its
// delivery attempts or was terminated: a copy of the original (its
// headers and body) on mesh.dlq.<receiver>.<priority>.<sender> in stream
// MESH_DLQ, with the Mesh-Dlq-* headers below saying why. The CLI
// (agentmesh dlq) and the monitor's dashboard read them with this
// package; replay and removal (how a dead letter is marked resolved) are
// the CLI's.
package dlq

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// Headers the ack monitor adds to a dead letter; the original's headers
// are kept beside them.
const (
	HeaderReason     = "Mesh-Dlq-Reason"      // "max_deliveries" or "terminated: <TERM reason>"
	HeaderStatus     = "Mesh-Dlq-Status"      // TIMEOUT, NACK or INVALID
	HeaderDeliveries = "Mesh-Dlq-Deliveries"  // delivery attempts made
	HeaderConsumer   = "Mesh-Dlq-Consumer"    // the consumer that gave up
	HeaderStreamSeq  = "Mesh-Dlq-Stream-Seq"  // the original's sequence in the message stream
	HeaderSubject    = "Mesh-Dlq-Subject"     // the original subject
	HeaderOriginalID = "Mesh-Dlq-Original-Id" // the original Nats-Msg-Id (message_id)
	// HeaderOmittedHeaders names the original's headers left out of the
	// copy: not valid header names, or too large for the server's header
	// limit together with the rest (the largest go first).
	HeaderOmittedHeaders = "Mesh-Dlq-Omitted-Headers"
	// HeaderBodyOmitted is set when the original's body is left out: with
	// the copy's headers it would exceed the server's max payload. The
	// value says how large it was; the original stays in the message
	// stream at Mesh-Dlq-Stream-Seq until it expires.
	HeaderBodyOmitted = "Mesh-Dlq-Body-Omitted"
	// HeaderReplayOf marks a replayed message with the dead letter's
	// sequence in MESH_DLQ.
	HeaderReplayOf = "Mesh-Replay-Of"
)

// HeaderPrefix starts every header the monitor adds to a dead letter.
const HeaderPrefix = "Mesh-Dlq-"

// ErrNoStream reports that the dead-letter stream does not exist: the ack
// monitor creates it, so no monitor has run on this mesh yet.
var ErrNoStream = errors.New("dlq: no dead-letter stream")

// ErrNotFound reports that the dead-letter stream holds no message at the
// sequence asked for: it never existed, was removed, or aged out.
var ErrNotFound = errors.New("not found")

// notFoundError is [ErrNotFound] in place of the server's answer, which
// it wraps for callers that match nats.go's errors: the server's own
// words ("API error: code=404 err_code=10037") say nothing to a user.
type notFoundError struct{ err error }

func (e notFoundError) Error() string        { return ErrNotFound.Error() }
func (e notFoundError) Is(target error) bool { return target == ErrNotFound }
func (e notFoundError) Unwrap() error        { return e.err }

// notFound matches the server's "no message found" answers, which nats.go
// returns as a bare API error from some calls (DeleteMsg) and as
// jetstream.ErrMsgNotFound from others.
func notFound(err error) bool {
	var apiErr *jetstream.APIError
	return errors.Is(err, jetstream.ErrMsgNotFound) ||
		errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeMessageNotFound
}

// Letter is one dead letter as stored in the dead-letter stream.
type Letter struct {
	Seq     uint64    // sequence in the dead-letter stream
	Time    time.Time // when the monitor stored it
	Subject string    // mesh.dlq.<receiver>.<priority>.<sender>
	Header  nats.Header
	Data    []byte // the original envelope, unless HeaderBodyOmitted is set
}

// Reason is why the message became a dead letter.
func (l Letter) Reason() string { return l.Header.Get(HeaderReason) }

// Status is the ledger status of the original: TIMEOUT, NACK or INVALID.
func (l Letter) Status() string { return l.Header.Get(HeaderStatus) }

// Deliveries is how many delivery attempts were made, 0 when unknown.
func (l Letter) Deliveries() int {
	n, _ := strconv.Atoi(l.Header.Get(HeaderDeliveries))
	return n
}

// Consumer is the consumer that gave up on the original.
func (l Letter) Consumer() string { return l.Header.Get(HeaderConsumer) }

// Action is the original's action: its Mesh-Action header or, for a
// sender that mirrors no headers (no Mesh-Type), its envelope's; empty
// when neither says.
func (l Letter) Action() string {
	if a := l.Header.Get(wire.HeaderAction); a != "" || l.Header.Get(wire.HeaderType) != "" || len(l.Data) == 0 {
		return a
	}
	env, err := wire.Decode(l.Data)
	if err != nil {
		return "" // an invalid envelope (INVALID letters) names no action
	}
	return env.Action
}

// MessageID is the original's message id: Mesh-Dlq-Original-Id, or the
// part of the letter's own Nats-Msg-Id before its first colon for letters
// that lack it.
func (l Letter) MessageID() string {
	if id := l.Header.Get(HeaderOriginalID); id != "" {
		return id
	}
	id, _, _ := strings.Cut(l.Header.Get(wire.HeaderMsgID), ":")
	return id
}

// Read returns the dead letters of scheme's mesh, oldest first, at most
// the newest limit of them (all when limit <= 0). It fails with
// [ErrNoStream] when there is no dead-letter stream.
func Read(ctx context.Context, js jetstream.JetStream, scheme subjects.Scheme, limit int) ([]Letter, error) {
	st, err := stream(ctx, js, scheme)
	if err != nil {
		return nil, err
	}
	info, err := st.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("dlq: %w", err)
	}
	if info.State.Msgs == 0 {
		return nil, nil
	}
	start := info.State.FirstSeq
	if limit > 0 && info.State.Msgs > uint64(limit) {
		start = info.State.LastSeq - uint64(limit) + 1
	}
	cons, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: start})
	if err != nil {
		return nil, fmt.Errorf("dlq: %w", err)
	}
	var letters []Letter
	for {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("dlq: %w", err)
		}
		// Ask for no more than the sequences left, or the fetch waits
		// out its expiry for messages that will never come.
		left := info.State.LastSeq - start + 1
		if len(letters) > 0 {
			left = info.State.LastSeq - letters[len(letters)-1].Seq
		}
		batch, err := cons.Fetch(int(min(left, 256)), jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			return nil, fmt.Errorf("dlq: %w", err)
		}
		n, done := 0, false
		for m := range batch.Messages() {
			n++
			md, err := m.Metadata()
			if err != nil {
				continue // not a stream message: nothing to list
			}
			letters = append(letters, Letter{Seq: md.Sequence.Stream, Time: md.Timestamp,
				Subject: m.Subject(), Header: m.Headers(), Data: m.Data()})
			if md.Sequence.Stream >= info.State.LastSeq || md.NumPending == 0 {
				done = true
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			return nil, fmt.Errorf("dlq: %w", err)
		}
		if done || n == 0 {
			if limit > 0 && len(letters) > limit {
				letters = letters[len(letters)-limit:]
			}
			return letters, nil
		}
	}
}

// Get returns the dead letter at seq.
func Get(ctx context.Context, js jetstream.JetStream, scheme subjects.Scheme, seq uint64) (Letter, error) {
	st, err := stream(ctx, js, scheme)
	if err != nil {
		return Letter{}, err
	}
	raw, err := st.GetMsg(ctx, seq)
	if notFound(err) {
		return Letter{}, fmt.Errorf("dlq: dead letter %d: %w", seq, notFoundError{err})
	}
	if err != nil {
		return Letter{}, fmt.Errorf("dlq: dead letter %d: %w", seq, err)
	}
	return Letter{Seq: seq, Time: raw.Time, Subject: raw.Subject, Header: raw.Header, Data: raw.Data}, nil
}

// Remove deletes the dead letter at seq from the dead-letter stream: it
// is resolved (replayed, or given up on) and should no longer be listed.
// It fails with [ErrNotFound] when there is none at seq. Removing needs
// the right to delete messages of the stream, which only an
// administrator's credentials have.
func Remove(ctx context.Context, js jetstream.JetStream, scheme subjects.Scheme, seq uint64) error {
	st, err := stream(ctx, js, scheme)
	if err != nil {
		return err
	}
	err = st.DeleteMsg(ctx, seq)
	if err != nil && !notFound(err) {
		// A failed delete says why only in free text ("no message found",
		// "stream store EOF" past the last sequence): ask for the message
		// to tell a missing one from a real failure.
		if _, gerr := st.GetMsg(ctx, seq); notFound(gerr) {
			err = gerr
		}
	}
	if notFound(err) {
		return fmt.Errorf("dlq: dead letter %d: %w", seq, notFoundError{err})
	}
	if err != nil {
		return fmt.Errorf("dlq: remove dead letter %d: %w", seq, err)
	}
	return nil
}

func stream(ctx context.Context, js jetstream.JetStream, scheme subjects.Scheme) (jetstream.Stream, error) {
	st, err := js.Stream(ctx, scheme.DLQStream())
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, fmt.Errorf("%w: stream %s does not exist", ErrNoStream, scheme.DLQStream())
	}
	if err != nil {
		return nil, fmt.Errorf("dlq: stream %s: %w", scheme.DLQStream(), err)
	}
	return st, nil
}

// ReplayMsg builds the message that sends l back: the original envelope,
// unchanged, on the subject it was first sent on, with the original's
// Mesh-* headers and HeaderReplayOf. Its Nats-Msg-Id is
// "<message_id>:replay:<seq>", so replaying one dead letter twice within
// the stream's duplicate window stores it once; the envelope's message_id
// stays the original's. It fails for a letter whose subject or body is
// not a mesh message's (e.g. the body was omitted).
func ReplayMsg(scheme subjects.Scheme, l Letter) (*nats.Msg, error) {
	target := l.Header.Get(HeaderSubject)
	if target == "" {
		// No original subject recorded: rebuild the direct subject from
		// the letter's mesh.dlq.<receiver>.<priority>.<sender>.
		sub, err := scheme.Parse(l.Subject)
		if err != nil || sub.Kind != subjects.KindDLQ {
			return nil, fmt.Errorf("dlq: dead letter %d: subject %q is not a dead-letter subject", l.Seq, l.Subject)
		}
		if target, err = scheme.Direct(sub.Receiver, sub.Priority, sub.Sender); err != nil {
			return nil, fmt.Errorf("dlq: dead letter %d: %w", l.Seq, err)
		}
	}
	if _, err := scheme.Parse(target); err != nil {
		return nil, fmt.Errorf("dlq: dead letter %d: original subject: %w", l.Seq, err)
	}
	if _, err := wire.Decode(l.Data); err != nil {
		return nil, fmt.Errorf("dlq: dead letter %d: body: %w", l.Seq, err)
	}
	out := nats.Header{}
	for k, v := range l.Header {
		if strings.HasPrefix(k, HeaderPrefix) || strings.HasPrefix(k, "Nats-") {
			continue
		}
		out[k] = append([]string(nil), v...)
	}
	out.Set(wire.HeaderMsgID, wire.ReplayID(l.MessageID(), l.Seq))
	out.Set(HeaderReplayOf, strconv.FormatUint(l.Seq, 10))
	return &nats.Msg{Subject: target, Header: out, Data: l.Data}, nil
}

// Replayed is where a replayed dead letter went.
type Replayed struct {
	Subject   string // the original subject it was sent to
	Stream    string // the stream that stored it
	Sequence  uint64 // its sequence there
	Duplicate bool   // already replayed within the duplicate window: stored once
}

// Replay sends l back (see [ReplayMsg]).
func Replay(ctx context.Context, js jetstream.JetStream, scheme subjects.Scheme, l Letter) (Replayed, error) {
	msg, err := ReplayMsg(scheme, l)
	if err != nil {
		return Replayed{}, err
	}
	ack, err := js.PublishMsg(ctx, msg)
	if err != nil {
		return Replayed{}, fmt.Errorf("dlq: replay dead letter %d: %w", l.Seq, err)
	}
	return Replayed{Subject: msg.Subject, Stream: ack.Stream, Sequence: ack.Sequence, Duplicate: ack.Duplicate}, nil
}
