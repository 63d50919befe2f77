package agentkit

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/sony/gobreaker"
)

// BreakerSettings configure the circuit breaker an agent keeps for each
// agent it sends to (seed 000 "Circuit Breaker Integration", seed 004 §5.3).
type BreakerSettings struct {
	// FailureThreshold consecutive timeouts open the circuit. Default 5.
	FailureThreshold uint32
	// OpenTimeout is how long the circuit stays open before letting trial
	// messages through (half-open). Default 60s.
	OpenTimeout time.Duration
	// HalfOpenRequests trial messages may be in flight while half-open;
	// they are sent at low priority. Default 3.
	HalfOpenRequests uint32
	// NackThreshold consecutive NACKs (error replies) mark the destination
	// degraded in the registry. Default 3.
	NackThreshold int
}

// DefaultBreakerSettings returns the seed values: open after 5 consecutive
// timeouts, half-open after 60s with 3 trial messages, degraded after 3
// consecutive NACKs.
func DefaultBreakerSettings() BreakerSettings {
	return BreakerSettings{FailureThreshold: 5, OpenTimeout: 60 * time.Second, HalfOpenRequests: 3, NackThreshold: 3}
}

// BreakerState is the state of the circuit to one destination.
type BreakerState string

// The circuit states.
const (
	BreakerClosed   BreakerState = "closed"
	BreakerOpen     BreakerState = "open"
	BreakerHalfOpen BreakerState = "half-open"
)

// CircuitOpenError is returned, without sending, while the circuit to
// Agent is open (or half-open with every trial slot taken). It matches
// errors.Is(err, ErrCircuitOpen).
type CircuitOpenError struct {
	Agent string
	State BreakerState
}

func (e *CircuitOpenError) Error() string {
	return fmt.Sprintf("agentkit: circuit to %s is %s", e.Agent, e.State)
}

// Is reports whether target is [ErrCircuitOpen].
func (e *CircuitOpenError) Is(target error) bool { return target == ErrCircuitOpen }

// breakers holds one breaker per destination.
type breakers struct {
	mu       sync.Mutex
	m        map[string]*breaker
	nacks    map[string]int
	settings BreakerSettings
	onChange func(to string, st BreakerState) // set once in New
}

type breaker struct {
	cb *gobreaker.TwoStepCircuitBreaker
}

func (b *breakers) get(to string) *breaker {
	s, onChange := b.settings, b.onChange
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.m == nil {
		b.m, b.nacks = map[string]*breaker{}, map[string]int{}
	}
	br := b.m[to]
	if br == nil {
		br = &breaker{cb: gobreaker.NewTwoStepCircuitBreaker(gobreaker.Settings{
			Name:        to,
			MaxRequests: s.HalfOpenRequests,
			Timeout:     s.OpenTimeout,
			ReadyToTrip: func(c gobreaker.Counts) bool { return c.ConsecutiveFailures >= s.FailureThreshold },
			OnStateChange: func(to string, _, st gobreaker.State) {
				if onChange != nil {
					onChange(to, stateOf(st))
				}
			},
		})}
		b.m[to] = br
	}
	return br
}

func stateOf(s gobreaker.State) BreakerState {
	switch s {
	case gobreaker.StateOpen:
		return BreakerOpen
	case gobreaker.StateHalfOpen:
		return BreakerHalfOpen
	}
	return BreakerClosed
}

// BreakerState returns the state of the circuit to agent to.
func (a *Agent) BreakerState(to string) BreakerState {
	return stateOf(a.breakers.get(to).cb.State())
}

// Breakers returns the state of every circuit the agent has used.
func (a *Agent) Breakers() map[string]BreakerState {
	a.breakers.mu.Lock()
	defer a.breakers.mu.Unlock()
	out := make(map[string]BreakerState, len(a.breakers.m))
	for to, br := range a.breakers.m {
		out[to] = stateOf(br.cb.State())
	}
	return out
}

// allow asks the breaker of to for permission to send; half-open means the
// message is a trial. done must be called with the outcome.
func (a *Agent) allow(to string) (done func(error), trial bool, err error) {
	br := a.breakers.get(to)
	state := br.cb.State()
	finish, err := br.cb.Allow()
	if err != nil {
		return nil, false, &CircuitOpenError{Agent: to, State: stateOf(br.cb.State())}
	}
	return func(err error) {
		// Only silence counts against the destination: an answer, even a
		// NACK, proves it is alive.
		finish(!errors.Is(err, ErrTimeout))
		a.countNack(to, err)
	}, state == gobreaker.StateHalfOpen, nil
}

// countNack tracks consecutive NACKs from to; at the threshold the
// destination is marked degraded in the registry, and the mark is cleared
// by the next success.
func (a *Agent) countNack(to string, err error) {
	nack := IsRemote(err)
	if !nack && err != nil {
		return // a timeout or local failure says nothing about NACKs
	}
	a.breakers.mu.Lock()
	before := a.breakers.nacks[to]
	if nack {
		a.breakers.nacks[to]++
	} else {
		a.breakers.nacks[to] = 0
	}
	n := a.breakers.nacks[to]
	a.breakers.mu.Unlock()
	reg := a.Registry()
	if reg == nil {
		return
	}
	switch {
	case nack && n == a.opts.breaker.NackThreshold:
		a.markDegraded(reg, to, fmt.Sprintf("%d consecutive NACKs, last: %v", n, err), true)
	case !nack && before >= a.opts.breaker.NackThreshold:
		a.markDegraded(reg, to, "", false)
	}
}

func (a *Agent) breakerChanged(to string, s BreakerState) {
	a.opts.logger.Info("circuit state changed", "agent", a.id, "to", to, "state", s)
	a.observeBreaker(to, s)
}
