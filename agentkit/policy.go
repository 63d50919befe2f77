package agentkit

import (
	"fmt"
	"slices"
	"time"

	"github.com/agentmesh-io/agentmesh/agentkit/wire"
)

// DeliveryPolicy is how the broker and the runtime treat messages of one
// priority. [DefaultPolicies] holds the defaults of all five priorities;
// [WithPolicy] fills a field left zero with the priority's default, so a
// policy names only what it changes.
type DeliveryPolicy struct {
	// BackOff is the ack timeout of each delivery attempt: attempt n waits
	// BackOff[min(n-1, len-1)] for an ack (or InProgress) before the broker
	// redelivers. It is also the NakWithDelay schedule for retryable
	// failures. JetStream sets AckWait to BackOff[0]. Pull requests live
	// twice BackOff[0], between 2s and 10s. Empty: the priority's default.
	BackOff []time.Duration
	// MaxDeliver is the number of delivery attempts, the first included;
	// after the last one the monitor escalates. It must be ≥ len(BackOff).
	// Zero: the priority's default, raised to len(BackOff) when BackOff
	// is longer.
	MaxDeliver int
	// ProcessingLimit bounds how long a handler may run: InProgress keeps
	// the message alive until then, and the handler's context is cancelled
	// at the limit. Zero: the priority's default.
	ProcessingLimit time.Duration
	// Prefetch is how many messages the client buffers ahead of the
	// handlers until their pace is known (with MaxPrefetch 0, always). The
	// ack clock starts when the server delivers a message into the buffer,
	// not when a handler picks it up, so a buffer slow handlers cannot
	// empty within the ack timeout turns waiting messages into
	// redeliveries. The default, 1, is safe however slow the handlers are.
	// Zero: the priority's default.
	Prefetch int
	// MaxPrefetch, when set, lets the runtime size the buffer to the
	// handlers' measured pace: as many messages as the workers finish
	// within half the ack timeout (BackOff[0]), between 1 and MaxPrefetch.
	// Fast handlers get a deep buffer and the throughput that comes with
	// it; slow ones a shallow buffer, so nothing waits out its ack timeout
	// in it. Zero with Prefetch set keeps the buffer at Prefetch (a fixed
	// buffer); zero with Prefetch zero too takes the priority's default, as
	// a policy that says nothing about the buffer.
	MaxPrefetch int
	// MaxAckPending bounds unacknowledged messages across all instances of
	// the agent at this priority. Zero: the priority's default, 1000 (the
	// server's default too).
	MaxAckPending int
}

func seconds(s ...int) []time.Duration {
	d := make([]time.Duration, len(s))
	for i, v := range s {
		d[i] = time.Duration(v) * time.Second
	}
	return d
}

// DefaultPolicies returns the default delivery policy of every priority:
//
//	priority  BackOff (ack timeout per attempt)  MaxDeliver  ProcessingLimit
//	critical  2s 4s 8s 16s 32s                   5           1m
//	high      5s 10s 20s 40s                     4           5m
//	normal    10s 20s 40s                        3           10m
//	low       30s 30s                            2           10m
//	batch     60s 60s                            2           30m
//
// high, normal and low follow the specified table (initial timeout, retries,
// 2x or no backoff); critical and batch extend it. Every priority buffers
// one message (Prefetch 1) until its handlers' pace is known, then sizes
// the buffer to that pace up to MaxPrefetch 512. Each call returns a
// new map.
func DefaultPolicies() map[wire.Priority]DeliveryPolicy {
	return map[wire.Priority]DeliveryPolicy{
		wire.PriorityCritical: {BackOff: seconds(2, 4, 8, 16, 32), MaxDeliver: 5, ProcessingLimit: time.Minute, Prefetch: 1, MaxPrefetch: 512, MaxAckPending: 1000},
		wire.PriorityHigh:     {BackOff: seconds(5, 10, 20, 40), MaxDeliver: 4, ProcessingLimit: 5 * time.Minute, Prefetch: 1, MaxPrefetch: 512, MaxAckPending: 1000},
		wire.PriorityNormal:   {BackOff: seconds(10, 20, 40), MaxDeliver: 3, ProcessingLimit: 10 * time.Minute, Prefetch: 1, MaxPrefetch: 512, MaxAckPending: 1000},
		wire.PriorityLow:      {BackOff: seconds(30, 30), MaxDeliver: 2, ProcessingLimit: 10 * time.Minute, Prefetch: 1, MaxPrefetch: 512, MaxAckPending: 1000},
		wire.PriorityBatch:    {BackOff: seconds(60, 60), MaxDeliver: 2, ProcessingLimit: 30 * time.Minute, Prefetch: 1, MaxPrefetch: 512, MaxAckPending: 1000},
	}
}

// withDefaults fills the fields of p left zero from the default policy of
// prio; negative values stay for validate to reject. The BackOff it
// returns is never shared with the caller's or the defaults'.
func (p DeliveryPolicy) withDefaults(prio wire.Priority) DeliveryPolicy {
	d := DefaultPolicies()[prio]
	if len(p.BackOff) == 0 {
		p.BackOff = d.BackOff
	} else {
		p.BackOff = slices.Clone(p.BackOff)
	}
	if p.MaxDeliver == 0 {
		p.MaxDeliver = max(d.MaxDeliver, len(p.BackOff))
	}
	if p.ProcessingLimit == 0 {
		p.ProcessingLimit = d.ProcessingLimit
	}
	if p.Prefetch == 0 {
		p.Prefetch = d.Prefetch
		if p.MaxPrefetch == 0 {
			p.MaxPrefetch = d.MaxPrefetch
		}
	}
	if p.MaxAckPending == 0 {
		p.MaxAckPending = d.MaxAckPending
	}
	return p
}

func (p DeliveryPolicy) validate(prio wire.Priority) error {
	switch {
	case len(p.BackOff) == 0:
		return fmt.Errorf("%w: %s policy: BackOff is empty", ErrInvalidOption, prio)
	case p.MaxDeliver < len(p.BackOff):
		return fmt.Errorf("%w: %s policy: MaxDeliver %d is less than len(BackOff) %d", ErrInvalidOption, prio, p.MaxDeliver, len(p.BackOff))
	case p.ProcessingLimit <= 0:
		return fmt.Errorf("%w: %s policy: ProcessingLimit must be positive", ErrInvalidOption, prio)
	case p.Prefetch < 1:
		return fmt.Errorf("%w: %s policy: Prefetch must be at least 1", ErrInvalidOption, prio)
	case p.MaxPrefetch < 0:
		return fmt.Errorf("%w: %s policy: MaxPrefetch must not be negative", ErrInvalidOption, prio)
	case p.MaxAckPending < 1:
		return fmt.Errorf("%w: %s policy: MaxAckPending must be at least 1", ErrInvalidOption, prio)
	}
	for i, d := range p.BackOff {
		if d < time.Millisecond {
			return fmt.Errorf("%w: %s policy: BackOff[%d] = %v is below 1ms", ErrInvalidOption, prio, i, d)
		}
	}
	return nil
}

// retryDelay is the NakWithDelay delay after the given delivery attempt
// (1-based) failed: the attempt's slot in BackOff, the last value repeating.
func (p DeliveryPolicy) retryDelay(delivery uint64) time.Duration {
	i := int(delivery) - 1
	if i < 0 {
		i = 0
	}
	return p.BackOff[min(i, len(p.BackOff)-1)]
}

// Bounds of a priority's pull expiry (DeliveryPolicy.pullExpiry).
const (
	minPullExpiry = 2 * time.Second
	maxPullExpiry = 10 * time.Second
)

// pullExpiry is how long each of the priority's pull requests lives at
// the server: twice its first ack timeout, between 2s and 10s (critical
// 4s, the others 10s). It bounds how long the priority can stall when a
// consumer's leader changes while a pull request is on its way (the new
// leader never learns of it): nats.go pulls again once two heartbeats,
// each half the expiry, are missing. With nats.go's default of 30s, a
// step-down stalled an agent for 30s; with 10s for all, a critical
// message could still wait five of its ack timeouts. An idle consumer
// pays with a pull request per expiry and a heartbeat per half.
func (p DeliveryPolicy) pullExpiry() time.Duration {
	return min(max(2*p.BackOff[0], minPullExpiry), maxPullExpiry)
}

// progressInterval is how often InProgress is sent while a handler runs:
// a quarter of the shortest ack timeout. The scanner looks every half
// interval, so two InProgress are at most 3/8 of the timeout apart: one
// may be lost, or the process stall for 5/8 of the timeout (a loaded
// machine stalls whole processes for hundreds of milliseconds), and the
// broker still sees the message alive.
func (p DeliveryPolicy) progressInterval() time.Duration {
	shortest := p.BackOff[0]
	for _, d := range p.BackOff {
		shortest = min(shortest, d)
	}
	return shortest / 4
}
