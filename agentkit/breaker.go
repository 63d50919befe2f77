package agentkit

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/sony/gobreaker/v2"

	"github.com/agentmesh-io/agentmesh/agentkit/wire"
)

// BreakerSettings configure the circuit breaker an agent keeps for each
// agent it sends to.
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
	// TimeoutThreshold consecutive timeouts mark the destination
	// UNAVAILABLE in the registry, until it answers this sender
	// again or OpenTimeout passes. Default 3.
	TimeoutThreshold int
}

// DefaultBreakerSettings returns the specified defaults: open after 5 consecutive
// timeouts, half-open after 60s with 3 trial messages, degraded after 3
// consecutive NACKs, unavailable after 3 consecutive timeouts.
func DefaultBreakerSettings() BreakerSettings {
	return BreakerSettings{FailureThreshold: 5, OpenTimeout: 60 * time.Second, HalfOpenRequests: 3, NackThreshold: 3, TimeoutThreshold: 3}
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
	nacks    map[string]int // consecutive NACKs per destination
	timeouts map[string]int // consecutive timeouts per destination
	settings BreakerSettings
	onChange func(to string, st BreakerState) // set once in New
}

type breaker struct {
	cb *gobreaker.TwoStepCircuitBreaker[struct{}]
}

func (b *breakers) get(to string) *breaker {
	s, onChange := b.settings, b.onChange
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.m == nil {
		b.m, b.nacks, b.timeouts = map[string]*breaker{}, map[string]int{}, map[string]int{}
	}
	br := b.m[to]
	if br == nil {
		br = &breaker{cb: gobreaker.NewTwoStepCircuitBreaker[struct{}](gobreaker.Settings{
			Name:         to,
			MaxRequests:  s.HalfOpenRequests,
			Timeout:      s.OpenTimeout,
			ReadyToTrip:  func(c gobreaker.Counts) bool { return c.ConsecutiveFailures >= s.FailureThreshold },
			IsSuccessful: answered,
			IsExcluded:   local,
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
	return stateOf(a.send.breakers.get(to).cb.State())
}

// Breakers returns the state of every circuit the agent has used.
func (a *Agent) Breakers() map[string]BreakerState {
	a.send.breakers.mu.Lock()
	defer a.send.breakers.mu.Unlock()
	out := make(map[string]BreakerState, len(a.send.breakers.m))
	for to, br := range a.send.breakers.m {
		out[to] = stateOf(br.cb.State())
	}
	return out
}

// allow asks the breaker of to for permission to send; half-open means the
// message is a trial. done must be called with the outcome.
func (s *sender) allow(to string) (done func(error), trial bool, err error) {
	br := s.breakers.get(to)
	state := br.cb.State()
	finish, err := br.cb.Allow()
	if err != nil {
		return nil, false, &CircuitOpenError{Agent: to, State: stateOf(br.cb.State())}
	}
	return finish, state == gobreaker.StateHalfOpen, nil
}

// answered reports whether err (the outcome of a request) is an answer:
// nil or an error reply. Only silence counts against the destination: an
// answer, even a NACK, proves it is alive.
func answered(err error) bool { return !errors.Is(err, ErrTimeout) }

// local reports whether err is a failure on this side (the publish, a
// cancelled context, a stopped agent), which says nothing about the
// destination: the breaker counts it neither way, and a trial it ended
// frees its slot.
func local(err error) bool { return err != nil && !wire.IsRemote(err) && !errors.Is(err, ErrTimeout) }

// healthMarks is the request hook, installed on every agent ahead of the
// hooks of [WithHooks], that keeps the registry's health marks (see
// trackHealth): the request path reports each request's end to the hooks
// only, and the marks follow from those events.
type healthMarks struct{ a *Agent }

// OnRequest tracks the health of the destination of a request that was
// sent; one the breaker refused (nothing sent) says nothing about it.
func (h healthMarks) OnRequest(ev RequestEvent) {
	if !ev.Refused {
		h.a.trackHealth(ev.To, ev.Err)
	}
}

// trackHealth counts consecutive NACKs and timeouts from to and marks it in
// the registry at the thresholds: degraded after NackThreshold NACKs,
// UNAVAILABLE after TimeoutThreshold timeouts. An answer
// clears the timeout mark, a success clears both. Local failures say
// nothing about to.
func (a *Agent) trackHealth(to string, err error) {
	if local(err) {
		return
	}
	nack, timeout := wire.IsRemote(err), errors.Is(err, ErrTimeout)
	b := &a.send.breakers
	b.mu.Lock()
	nacksBefore, timeoutsBefore := b.nacks[to], b.timeouts[to]
	b.nacks[to] = consecutive(b.nacks[to], nack, timeout)
	b.timeouts[to] = consecutive(b.timeouts[to], timeout, false)
	nacks, timeouts := b.nacks[to], b.timeouts[to]
	b.mu.Unlock()
	reg := a.Registry()
	if reg == nil {
		return
	}
	s := a.opts.breaker
	switch {
	case nack && (nacks == s.NackThreshold || nacks > s.NackThreshold && !reg.Degraded(to)):
		// Also again past the threshold: another sender's success may
		// have cleared the mark since.
		a.markHealth(reg, to, markDegraded, fmt.Sprintf("%d consecutive NACKs, last: %v", nacks, err))
	case err == nil && (nacksBefore >= s.NackThreshold || reg.Degraded(to)):
		a.markHealth(reg, to, markDegraded, "") // any sender's success clears it
	}
	switch {
	case timeout && timeouts >= s.TimeoutThreshold: // each further timeout renews the mark's TTL
		a.markHealth(reg, to, markUnavailable, fmt.Sprintf("%d consecutive timeouts", timeouts))
	case !timeout && timeoutsBefore >= s.TimeoutThreshold:
		a.markHealth(reg, to, markUnavailable, "")
	}
}

// consecutive advances a count of events in a row: up on hit, kept on
// keep, else back to zero.
func consecutive(n int, hit, keep bool) int {
	switch {
	case hit:
		return n + 1
	case keep:
		return n
	}
	return 0
}

func (a *Agent) breakerChanged(to string, s BreakerState) {
	a.opts.logger.Info("circuit state changed", "agent", a.id, "to", to, "state", s)
	for _, h := range a.opts.hooks.breaker {
		h.OnBreakerChange(BreakerEvent{Agent: a.id, To: to, State: s})
	}
}
