package ackmonitor

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/ackmonitor/store"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// A group consumer's event names the group, not the receiver: the
// receiver is the message's, which the subject of the message at the
// event's stream sequence says. The sends intake sees every message's
// subject first in the usual order, so it remembers the latest ones by
// sequence (seqReceivers); an event that comes before its send, or after
// a restart forgot it, has the subject read from the stream, which is
// exact (the sequence names one stored message) where the ledger may not
// have the send yet. A message that is no longer in the stream, is not
// a valid direct message, or whose receiver the group does not deliver
// for is attributed to nobody: its event is counted and logged as
// ignored, as an undecodable one is, so a forged or stray event cannot
// write a row of an agent the group does not host.

// seqRemembered is how many stream sequences' receivers the intake keeps
// (a few MiB). An event further behind its send than that costs a read of
// its message.
const seqRemembered = 64 << 10

// attributeReadDeliveries is how many deliveries of a group's event
// attributeGroupEvents lets fail to look its receiver up (the stream or
// the consumer info unavailable) before it gives up on it, so one event
// cannot come back for good.
const attributeReadDeliveries = 10

// attributeNakDelay is how long an event whose receiver could not be
// looked up waits for its redelivery.
const attributeNakDelay = 2 * time.Second

// directTo is what a stored message is, for attribution: a direct
// message to receiver at priority, or (receiver "") anything else.
type directTo struct{ receiver, priority string }

// seqReceivers remembers the last messages' directTo by stream sequence,
// forgetting the oldest beyond its capacity.
type seqReceivers struct {
	mu   sync.Mutex
	m    map[uint64]directTo
	ring []uint64 // insertion order, for forgetting; 0 is an empty slot (sequences start at 1)
	next int
}

func newSeqReceivers(capacity int) *seqReceivers {
	return &seqReceivers{m: make(map[uint64]directTo, capacity), ring: make([]uint64, capacity)}
}

// add remembers that the message at seq is to.
func (s *seqReceivers) add(seq uint64, to directTo) {
	if seq == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.m[seq]; !ok {
		delete(s.m, s.ring[s.next])
		s.ring[s.next] = seq
		s.next = (s.next + 1) % len(s.ring)
	}
	s.m[seq] = to
}

// get returns what the message at seq is, if remembered.
func (s *seqReceivers) get(seq uint64) (directTo, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	to, ok := s.m[seq]
	return to, ok
}

// verdict is what attribution decided about an event.
type verdict uint8

const (
	eventKept    verdict = iota // no group's event, or attributed to its receiver
	eventIgnored                // a group's event attributed to nobody
	eventLater                  // its receiver could not be looked up now
)

// attributeGroupEvents rewrites each group consumer's event among events
// to its message's receiver: Consumer "<receiver>_<priority>", the ledger
// key of the message's row, and the receiver and priority of the subject.
// since is when the events were received (at the latest): a group's
// membership read before then is read again for an event it does not
// cover. It returns each event's verdict; tries is how many deliveries
// each event had, and an event whose look-up fails on its
// attributeReadDeliveries-th is ignored rather than put off. With tries
// nil (directIntake: the events stream has a copy of each event) every
// event not attributed is put off, unlogged.
func (in *intake) attributeGroupEvents(ctx context.Context, events []*store.Event, tries []uint64, since time.Time) []verdict {
	out := make([]verdict, len(events))
	var groupEvents []int
	unknown := map[uint64]struct{}{}
	for i, e := range events {
		if !in.groups.isGroup(e.Consumer) {
			continue
		}
		groupEvents = append(groupEvents, i)
		if _, ok := in.seqs.get(e.StreamSeq); !ok {
			unknown[e.StreamSeq] = struct{}{}
		}
	}
	if len(groupEvents) == 0 {
		return out
	}
	failed := in.readSubjects(ctx, unknown)
	for _, i := range groupEvents {
		e := events[i]
		to, ok := in.seqs.get(e.StreamSeq)
		member := false
		var err error
		switch {
		case failed[e.StreamSeq] != nil:
			err = failed[e.StreamSeq]
		case !ok || to.receiver == "":
		default:
			direct, cerr := in.cfg.Scheme.Consumer(to.receiver, to.priority)
			if cerr != nil { // the subject was validated; never here
				break
			}
			rctx, cancel := context.WithTimeout(ctx, copyTimeout)
			member, err = in.groups.isMember(rctx, e.Consumer, direct, since)
			var until uint64
			if member {
				until, err = in.groups.catchUpEnd(rctx, direct)
				member = err == nil
			}
			cancel()
			if member && e.StreamSeq <= until {
				// The member's catch-up delivers it; the group acked it
				// unread, or gave it back as the member did not run.
				out[i] = eventIgnored
				in.cfg.Logger.Debug("a group consumer's event about a message of a catch-up; ignored",
					"consumer", e.Consumer, "stream_seq", e.StreamSeq, "event", e.Kind, "catch_up", direct)
				continue
			}
			if member {
				e.Consumer, e.Receiver, e.Priority = direct, to.receiver, to.priority
			}
		}
		switch {
		case member:
		case tries == nil: // the events stream's intake decides, and logs
			out[i] = eventLater
		case err != nil && tries[i] < attributeReadDeliveries:
			out[i] = eventLater
			if ctx.Err() == nil {
				in.cfg.Logger.Warn("looking up the receiver of a group consumer's event; tried again later",
					"consumer", e.Consumer, "stream_seq", e.StreamSeq, "err", err)
			}
		default:
			out[i] = eventIgnored
			attrs := []any{"consumer", e.Consumer, "stream_seq", e.StreamSeq, "event", e.Kind}
			switch {
			case err != nil:
				attrs = append(attrs, "err", err)
			case !ok:
				attrs = append(attrs, "why", "no such message in the stream")
			case to.receiver == "":
				attrs = append(attrs, "why", "not a direct message")
			default:
				attrs = append(attrs, "why", "its receiver is not in the group's filters", "receiver", to.receiver, "priority", to.priority)
			}
			in.cfg.Logger.Warn("a group consumer's event attributed to no receiver; ignored", attrs...)
		}
	}
	return out
}

// readSubjects reads the subjects of the messages at seqs from the mesh
// stream and remembers what they are; it returns the errors of the reads
// that failed otherwise than for a message not in the stream (which stays
// unknown).
func (in *intake) readSubjects(ctx context.Context, seqs map[uint64]struct{}) map[uint64]error {
	if len(seqs) == 0 {
		return nil
	}
	todo := make([]uint64, 0, len(seqs))
	for seq := range seqs {
		todo = append(todo, seq)
	}
	errs := make([]error, len(todo))
	parallel(len(todo), bodyReaders, func(j int) {
		if in.mesh == nil {
			errs[j] = errors.New("ackmonitor: no mesh stream to read from")
			return
		}
		rctx, cancel := context.WithTimeout(ctx, copyTimeout)
		defer cancel()
		raw, err := in.mesh.GetMsg(rctx, todo[j])
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound):
		case err != nil:
			errs[j] = err
		case raw.Sequence != todo[j]:
		default:
			in.seqs.add(todo[j], in.directToOf(raw.Subject))
		}
	})
	out := map[uint64]error{}
	for j, err := range errs {
		if err != nil {
			out[todo[j]] = err
		}
	}
	return out
}

// directToOf parses subject as the intake parses a send's (parseSubject).
func (in *intake) directToOf(subject string) directTo {
	sub, err := parseSubject(in.cfg.Scheme, subject)
	if err != nil || sub.Kind != subjects.KindDirect {
		return directTo{}
	}
	return directTo{receiver: sub.Receiver, priority: sub.Priority}
}
