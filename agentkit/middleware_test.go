package agentkit_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/agentmesh-io/agentmesh/agentkit"
)

// Middleware runs around every handler, the first option's first
// middleware outermost, and a panic in it is recovered like a handler's.
func TestMiddleware_OrderAndPanic(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	var mu sync.Mutex
	var trail []string
	note := func(s string) { mu.Lock(); trail = append(trail, s); mu.Unlock() }
	named := func(name string) agentkit.Middleware {
		return func(next agentkit.Handler) agentkit.Handler {
			return agentkit.HandlerFunc(func(ctx context.Context, msg *agentkit.Message) error {
				note(name + ">")
				err := next.Handle(ctx, msg)
				note("<" + name)
				return err
			})
		}
	}
	panicky := func(next agentkit.Handler) agentkit.Handler {
		return agentkit.HandlerFunc(func(ctx context.Context, msg *agentkit.Message) error {
			if msg.Action == "boom" {
				panic("middleware panic")
			}
			return next.Handle(ctx, msg)
		})
	}
	worker := m.started("worker", map[string]agentkit.HandlerFunc{
		"work": func(context.Context, *agentkit.Message) error { note("handler"); return nil },
		"boom": func(context.Context, *agentkit.Message) error { return nil },
	}, agentkit.WithMiddleware(named("a"), named("b")), agentkit.WithMiddleware(named("c"), panicky))
	orch := m.started("orch", nil)
	if _, err := orch.SendAndWait(ctx(t), "worker", "work", nil); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	got := slices.Clone(trail)
	mu.Unlock()
	if want := []string{"a>", "b>", "c>", "handler", "<c", "<b", "<a"}; !slices.Equal(got, want) {
		t.Fatalf("trail %v, want %v", got, want)
	}
	if _, err := orch.Send(ctx(t), "worker", "boom", nil); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "panic counted", func() bool { return worker.Stats().Outcomes[agentkit.OutcomePanic] == 1 })
}

func TestMiddleware_Nil(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	if _, err := agentkit.New(m.conn(), "worker", agentkit.WithMiddleware(nil)); !errors.Is(err, agentkit.ErrInvalidOption) {
		t.Fatalf("WithMiddleware(nil): %v, want ErrInvalidOption", err)
	}
	a := m.agent("worker", agentkit.WithMiddleware(func(agentkit.Handler) agentkit.Handler { return nil }))
	if err := a.HandleFunc("work", func(context.Context, *agentkit.Message) error { return nil }); !errors.Is(err, agentkit.ErrInvalidOption) {
		t.Fatalf("Handle with a middleware returning nil: %v, want ErrInvalidOption", err)
	}
}
