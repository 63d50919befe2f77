package agentkit

import (
	"sync/atomic"

	"github.com/agentmesh-io/agentmesh/agentkit/wire"
)

// Outcome names what happened to a received message.
type Outcome string

// The outcomes counted in [Stats].
const (
	OutcomeAck               Outcome = "ack"                // handled; acked
	OutcomeNak               Outcome = "nak"                // handler failed or was busy; redelivered later
	OutcomeTerm              Outcome = "term"               // rejected by the handler (or no handler); terminated
	OutcomeInvalid           Outcome = "invalid"            // not a valid envelope for this agent; terminated
	OutcomeExpired           Outcome = "expired"            // ttl_ms passed before handling; acked unhandled
	OutcomeReply             Outcome = "reply"              // a response or ack delivered to a waiting Request/SendAndWait
	OutcomeLateReply         Outcome = "late_reply"         // a response nobody waits for any more; acked and dropped
	OutcomeOwn               Outcome = "own"                // the agent's own broadcast or topic message; acked
	OutcomeIgnored           Outcome = "ignored"            // a broadcast or topic message whose action the agent does not handle; acked
	OutcomePanic             Outcome = "panic"              // a handler panicked (also counted as nak)
	OutcomeCapabilityMissing Outcome = "capability_missing" // no handler for the action (also counted as term)
	OutcomeReroute           Outcome = "reroute"            // forwarded to another agent by Reroute; acked
	OutcomeFallback          Outcome = "fallback"           // a send redirected from an open circuit to a fallback agent
	OutcomeDuplicate         Outcome = "duplicate"          // a redelivery of a message this instance handled (acked) or is handling (left to that run)
)

// Outcomes lists every outcome.
var Outcomes = []Outcome{OutcomeAck, OutcomeNak, OutcomeTerm, OutcomeInvalid, OutcomeExpired,
	OutcomeReply, OutcomeLateReply, OutcomeOwn, OutcomeIgnored, OutcomePanic, OutcomeCapabilityMissing, OutcomeReroute, OutcomeFallback, OutcomeDuplicate}

type outcome int

const (
	outcomeAck outcome = iota
	outcomeRetry
	outcomeTerm
	outcomeReroute
)

type counters struct {
	n              [14]atomic.Uint64 // indexed like Outcomes
	publishRetries atomic.Uint64
	publishDups    atomic.Uint64
	fastBatched    atomic.Uint64
	fastFallbacks  atomic.Uint64
}

func (c *counters) add(o Outcome) {
	for i, v := range Outcomes {
		if v == o {
			c.n[i].Add(1)
			return
		}
	}
}

// Stats is a snapshot of an agent's counters since New.
type Stats struct {
	// Outcomes counts received messages by what happened to them.
	Outcomes map[Outcome]uint64
	// PublishRetries counts publish attempts that failed and were retried.
	PublishRetries uint64
	// PublishDuplicates counts publishes the stream acknowledged without
	// storing them, as duplicates of a message id it already held (within
	// its duplicate window): a retry of a publish that was stored after
	// all, or a message_id sent twice. Messages stored with fast batch
	// publish (FastBatched) are not counted: the batch's ack does not say.
	PublishDuplicates uint64
	// FastBatched counts messages stored with fast batch publish, one
	// stream ack per batch: by [Agent.SendBatch], and by concurrent Sends
	// that shared a batch (see [Agent.Send]).
	FastBatched uint64
	// FastBatchFallbacks counts messages [Agent.SendBatch] published one by
	// one because a fast batch ended before the stream confirmed them
	// (they are deduplicated if it stored them after all).
	FastBatchFallbacks uint64
	// TaskRecordsDropped counts acked task.* messages the agent did not
	// record in their task's state (see [ErrTaskRecordDropped]).
	TaskRecordsDropped uint64
	// Prefetch is how many messages each priority buffers ahead of its
	// workers now, besides one per worker: Prefetch until the handlers'
	// pace is known, then what the pace calls for (see
	// [DeliveryPolicy.MaxPrefetch]). Empty until Start.
	Prefetch map[wire.Priority]int
}

// Stats returns a snapshot of the agent's counters.
func (a *Agent) Stats() Stats {
	s := Stats{Outcomes: make(map[Outcome]uint64, len(Outcomes)), PublishRetries: a.stats.publishRetries.Load(),
		PublishDuplicates: a.stats.publishDups.Load(),
		FastBatched:       a.stats.fastBatched.Load(), FastBatchFallbacks: a.stats.fastFallbacks.Load(),
		TaskRecordsDropped: a.tracker.dropped.Load()}
	for i, o := range Outcomes {
		s.Outcomes[o] = a.stats.n[i].Load()
	}
	if sources := a.recv.sources.Load(); sources != nil {
		s.Prefetch = make(map[wire.Priority]int, len(*sources))
		for _, src := range *sources {
			if src.spec.class == "" {
				s.Prefetch[src.spec.priority] = src.prefetch()
			}
		}
	}
	return s
}
