package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"

	"github.com/agentmesh-io/agentmesh/agentkit/permission"
)

// watchDenials returns ctx cancelled, with the *permission.Error as its
// cause, as soon as the server reports a permissions violation on nc.
// The server drops a refused publish and says so only asynchronously, so
// a JetStream API call the credentials may not make would otherwise wait
// out its timeout and end as one; and nats.go's default handler would
// print the violation too, beside the command's own error. Other
// asynchronous errors still go to the handler nc had.
func watchDenials(ctx context.Context, nc *nats.Conn) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(ctx)
	prev := nc.Opts.AsyncErrorCB
	nc.SetErrorHandler(func(c *nats.Conn, sub *nats.Subscription, err error) {
		if pe, ok := permission.Parse(err); ok {
			cancel(pe)
			return
		}
		if prev != nil {
			prev(c, sub, err)
		}
	})
	return ctx, func() { cancel(context.Canceled) }
}

// denied returns the permissions violation that cancelled ctx (see
// [watchDenials]) in place of err, which then only says the operation
// was cancelled; otherwise err. hint, when set, says what would be
// allowed.
func denied(ctx context.Context, err error, hint string) error {
	var pe *permission.Error
	if err == nil || !errors.As(context.Cause(ctx), &pe) {
		return err
	}
	if hint != "" {
		return fmt.Errorf("%w: %s", pe, hint)
	}
	return pe
}
