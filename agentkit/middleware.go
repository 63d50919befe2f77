package agentkit

import "fmt"

// Middleware wraps a [Handler] with behaviour of its own (authorisation,
// logging, rate limiting, a recovered panic turned into [Reject], ...).
// It returns the handler the runtime calls in place of next; to go on, it
// calls next.Handle, and it may also answer without calling next.
//
// Middleware sees only messages that reached a handler: the runtime has
// already dropped redeliveries it finished, decoded and checked the
// envelope (messages that are not valid for the agent are terminated as
// INVALID), settled expired messages, replies and the agent's own
// broadcasts, and started the handle span and the processing limit on
// ctx. A message whose action has no handler is terminated with
// CAPABILITY_MISSING without reaching middleware. What the outermost
// middleware returns is what the runtime settles (see [Handler]), and a
// panic anywhere in the chain is recovered like a handler's.
type Middleware func(next Handler) Handler

// WithMiddleware wraps every handler registered with [Agent.Handle] in mw:
// the first is the outermost, so WithMiddleware(a, b) runs a, then b, then
// the handler. Several WithMiddleware options add to the chain in order.
// Default: none.
func WithMiddleware(mw ...Middleware) Option {
	return optionFunc(func(o *options) error {
		for _, m := range mw {
			if m == nil {
				return fmt.Errorf("%w: nil Middleware", ErrInvalidOption)
			}
		}
		o.middleware = append(o.middleware, mw...)
		return nil
	})
}

// chain wraps h in mws, the first outermost.
func chain(h Handler, mws []Middleware) Handler {
	for i := len(mws) - 1; i >= 0; i-- {
		h = mws[i](h)
	}
	return h
}
