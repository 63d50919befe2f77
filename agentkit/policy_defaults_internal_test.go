package agentkit

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/agentmesh-io/agentmesh/agentkit/wire"
)

// applyPolicy returns the policy WithPolicy(p, pol) leaves in the options.
func applyPolicy(t *testing.T, p wire.Priority, pol DeliveryPolicy) DeliveryPolicy {
	t.Helper()
	o := defaultOptions()
	o.policies = map[wire.Priority]DeliveryPolicy{}
	if err := WithPolicy(p, pol).apply(&o); err != nil {
		t.Fatalf("WithPolicy(%s, %+v): %v", p, pol, err)
	}
	return o.policies[p]
}

func samePolicy(a, b DeliveryPolicy) bool {
	return slices.Equal(a.BackOff, b.BackOff) && a.MaxDeliver == b.MaxDeliver && a.ProcessingLimit == b.ProcessingLimit &&
		a.Prefetch == b.Prefetch && a.MaxPrefetch == b.MaxPrefetch && a.MaxAckPending == b.MaxAckPending
}

// Each field left zero takes the priority's default, the others stay as
// given; a zero policy is the default policy.
func TestWithPolicy_ZeroFieldTakesPriorityDefault(t *testing.T) {
	full := DeliveryPolicy{BackOff: []time.Duration{time.Second, 3 * time.Second}, MaxDeliver: 6,
		ProcessingLimit: 2 * time.Minute, Prefetch: 4, MaxPrefetch: 64, MaxAckPending: 50}
	for _, p := range wire.Priorities {
		d := DefaultPolicies()[p]
		for _, tc := range []struct {
			field string
			zero  func(*DeliveryPolicy)
			want  func(*DeliveryPolicy) // the default the zero field takes
		}{
			{"BackOff", func(q *DeliveryPolicy) { q.BackOff = nil }, func(q *DeliveryPolicy) { q.BackOff = d.BackOff }},
			{"MaxDeliver", func(q *DeliveryPolicy) { q.MaxDeliver = 0 }, func(q *DeliveryPolicy) { q.MaxDeliver = d.MaxDeliver }},
			{"ProcessingLimit", func(q *DeliveryPolicy) { q.ProcessingLimit = 0 }, func(q *DeliveryPolicy) { q.ProcessingLimit = d.ProcessingLimit }},
			{"Prefetch", func(q *DeliveryPolicy) { q.Prefetch = 0 }, func(q *DeliveryPolicy) { q.Prefetch = d.Prefetch }},
			// With Prefetch set, MaxPrefetch zero is the fixed buffer.
			{"MaxPrefetch", func(q *DeliveryPolicy) { q.MaxPrefetch = 0 }, func(q *DeliveryPolicy) { q.MaxPrefetch = 0 }},
			{"Prefetch and MaxPrefetch", func(q *DeliveryPolicy) { q.Prefetch, q.MaxPrefetch = 0, 0 },
				func(q *DeliveryPolicy) { q.Prefetch, q.MaxPrefetch = d.Prefetch, d.MaxPrefetch }},
			{"MaxAckPending", func(q *DeliveryPolicy) { q.MaxAckPending = 0 }, func(q *DeliveryPolicy) { q.MaxAckPending = d.MaxAckPending }},
			{"all", func(q *DeliveryPolicy) { *q = DeliveryPolicy{} }, func(q *DeliveryPolicy) { *q = d }},
		} {
			in, want := full, full
			in.BackOff, want.BackOff = slices.Clone(full.BackOff), slices.Clone(full.BackOff)
			tc.zero(&in)
			tc.want(&want)
			if got := applyPolicy(t, p, in); !samePolicy(got, want) {
				t.Errorf("%s, %s zero: %+v, want %+v", p, tc.field, got, want)
			}
		}
	}
}

// MaxDeliver left zero covers a BackOff longer than the default's
// attempts, so the policy stays valid.
func TestWithPolicy_ZeroMaxDeliverCoversBackOff(t *testing.T) {
	backoff := []time.Duration{time.Second, time.Second, time.Second, time.Second, time.Second, time.Second, time.Second}
	got := applyPolicy(t, wire.PriorityLow, DeliveryPolicy{BackOff: backoff})
	if got.MaxDeliver != len(backoff) {
		t.Fatalf("MaxDeliver = %d, want %d", got.MaxDeliver, len(backoff))
	}
}

// Negative values are not zero: they are still rejected. The policy's
// BackOff is copied, not shared with the caller's.
func TestWithPolicy_NegativeRejectedBackOffCopied(t *testing.T) {
	o := defaultOptions()
	for _, pol := range []DeliveryPolicy{{MaxDeliver: -1}, {ProcessingLimit: -time.Second}, {Prefetch: -1}, {MaxPrefetch: -1}, {MaxAckPending: -1}} {
		if err := WithPolicy(wire.PriorityNormal, pol).apply(&o); !errors.Is(err, ErrInvalidOption) {
			t.Errorf("WithPolicy(%+v) = %v, want ErrInvalidOption", pol, err)
		}
	}
	backoff := []time.Duration{time.Second}
	got := applyPolicy(t, wire.PriorityNormal, DeliveryPolicy{BackOff: backoff})
	backoff[0] = time.Hour
	if got.BackOff[0] != time.Second {
		t.Fatal("the policy shares the caller's BackOff")
	}
}
