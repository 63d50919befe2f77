package agentkit_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// publishBare publishes e to its receiver's direct subject the way a
// sender that mirrors no header does: the body alone, not even a
// Nats-Msg-Id. It returns the stream sequence.
func publishBare(ctx context.Context, js jetstream.JetStream, e *wire.Envelope) (uint64, error) {
	body, err := e.Encode()
	if err != nil {
		return 0, err
	}
	subject, err := subjects.Default.Direct(e.ReceiverID, string(e.Priority), e.SenderID)
	if err != nil {
		return 0, err
	}
	ack, err := js.PublishMsg(ctx, &nats.Msg{Subject: subject, Data: body})
	if err != nil {
		return 0, err
	}
	return ack.Sequence, nil
}

// mustPublishBare is publishBare for the test's goroutine.
func mustPublishBare(t *testing.T, js jetstream.JetStream, e *wire.Envelope) uint64 {
	t.Helper()
	seq, err := publishBare(ctx(t), js, e)
	if err != nil {
		t.Fatal(err)
	}
	return seq
}

// A task's messages from a sender that mirrors no header are handled one
// at a time in stream order, as with Mesh-Task-Id: the reader takes the
// task from the envelope.
func TestHeaderless_TaskMessagesRunInOrder(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	const n = 4
	var mu sync.Mutex
	running, overlap := 0, false
	var order []int
	recv := m.started("recv", map[string]agentkit.HandlerFunc{"step": func(ctx context.Context, msg *agentkit.Message) error {
		var step struct{ N int }
		if err := msg.DecodePayload(&step); err != nil {
			return agentkit.Reject(wire.CodeInvalid, err.Error())
		}
		mu.Lock()
		running++
		overlap = overlap || running > 1
		mu.Unlock()
		time.Sleep(20 * time.Millisecond) // the work: long enough for another worker to start the next message
		mu.Lock()
		running--
		order = append(order, step.N)
		mu.Unlock()
		return nil
	}}, agentkit.WithConcurrency(4))
	js, err := jetstream.New(m.conn())
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		e := wire.NewEnvelope(wire.TypeNotification, "sender", "step")
		e.ReceiverID, e.TaskID = "recv", "t1"
		e.Payload = json.RawMessage(fmt.Sprintf(`{"N":%d}`, i))
		mustPublishBare(t, js, e)
	}
	eventually(t, 10*time.Second, "all steps acked", func() bool { return recv.Stats().Outcomes[agentkit.OutcomeAck] == n })
	mu.Lock()
	defer mu.Unlock()
	if overlap {
		t.Fatal("two messages of task t1 ran at the same time")
	}
	for i, got := range order {
		if got != i {
			t.Fatalf("handled steps %v, want 0..%d in order", order, n-1)
		}
	}
}

// A request from a sender that mirrors no header is answered, and the
// reply is matched by a caller waiting for it though it carries no
// Mesh-In-Reply-To either: here the caller waits inside a handler on the
// agent's only worker.
func TestHeaderless_ReplyMatchedWithoutHeaders(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	js, err := jetstream.New(m.conn())
	if err != nil {
		t.Fatal(err)
	}
	// "peer" answers by hand, without headers.
	m.started("peer", map[string]agentkit.HandlerFunc{"ask": func(ctx context.Context, msg *agentkit.Message) error {
		_, err := publishBare(ctx, js, msg.NewResponse("peer", "answer", json.RawMessage(`{"ok":true}`)))
		return err
	}})
	got := make(chan error, 1)
	var caller *agentkit.Agent
	caller = m.started("caller", map[string]agentkit.HandlerFunc{"go": func(ctx context.Context, msg *agentkit.Message) error {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		reply, err := caller.Request(rctx, "peer", "ask", nil)
		if err == nil && string(reply.Payload) != `{"ok":true}` {
			err = &wire.Error{Code: wire.CodeInternal, Message: "payload " + string(reply.Payload)}
		}
		got <- err
		return nil
	}}, agentkit.WithConcurrency(1))
	e := wire.NewEnvelope(wire.TypeNotification, "sender", "go")
	e.ReceiverID = "caller"
	mustPublishBare(t, js, e)
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("Request inside the handler: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the handler's Request never returned")
	}
}

// WorkflowStatus reads the messages of a sender that mirrors no header
// from their bodies.
func TestHeaderless_WorkflowStatusReadsBodies(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	recv := m.started("recv", map[string]agentkit.HandlerFunc{"work": func(context.Context, *agentkit.Message) error { return nil }})
	js, err := jetstream.New(m.conn())
	if err != nil {
		t.Fatal(err)
	}
	req := wire.NewEnvelope(wire.TypeRequest, "sender", "work")
	req.ReceiverID, req.Correlation, req.WorkflowID = "recv", "corr-bare", "wf-bare"
	mustPublishBare(t, js, req)
	resp := req.NewResponse("recv", "work_done", nil)
	mustPublishBare(t, js, resp)
	other := wire.NewEnvelope(wire.TypeNotification, "sender", "work")
	other.ReceiverID, other.Correlation = "recv", "corr-other"
	mustPublishBare(t, js, other)
	w, err := recv.WorkflowStatus(ctx(t), "corr-bare")
	if err != nil {
		t.Fatal(err)
	}
	if len(w.Messages) != 2 {
		t.Fatalf("workflow has %d messages %+v, want the request and its response", len(w.Messages), w.Messages)
	}
	r, a := w.Messages[0], w.Messages[1]
	if r.MessageID != req.MessageID || r.Type != wire.TypeRequest || r.Action != "work" || r.Sender != "sender" || r.Receiver != "recv" || r.Outcome != "answered" {
		t.Fatalf("request read as %+v", r)
	}
	if a.MessageID != resp.MessageID || a.Type != wire.TypeResponse || a.InReplyTo != req.MessageID || a.Status != wire.StatusSuccess {
		t.Fatalf("response read as %+v", a)
	}
	if w.Outcome != agentkit.WorkflowCompleted {
		t.Fatalf("outcome %q, want %q", w.Outcome, agentkit.WorkflowCompleted)
	}
}

// A message without trace headers is handled in the trace its envelope's
// trace member names.
func TestHeaderless_TraceFromBody(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	_, exp, opts := traced(t)
	recv := m.started("recv", map[string]agentkit.HandlerFunc{"work": func(context.Context, *agentkit.Message) error { return nil }}, opts...)
	js, err := jetstream.New(m.conn())
	if err != nil {
		t.Fatal(err)
	}
	const traceID, spanID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	e := wire.NewEnvelope(wire.TypeNotification, "sender", "work")
	e.ReceiverID, e.Trace = "recv", &wire.Trace{TraceID: traceID, SpanID: spanID}
	mustPublishBare(t, js, e)
	eventually(t, 10*time.Second, "acked", func() bool { return recv.Stats().Outcomes[agentkit.OutcomeAck] == 1 })
	eventually(t, 5*time.Second, "handle span exported", func() bool { return len(exp.GetSpans()) > 0 })
	var found bool
	for _, s := range exp.GetSpans() {
		if s.Name != "handle work" {
			continue
		}
		found = true
		if got := s.SpanContext.TraceID().String(); got != traceID {
			t.Errorf("handle span in trace %s, want %s", got, traceID)
		}
		if got := s.Parent.SpanID().String(); got != spanID || !s.Parent.IsRemote() {
			t.Errorf("handle span's parent %s (remote %v), want the sender's %s", got, s.Parent.IsRemote(), spanID)
		}
	}
	if !found {
		t.Fatalf("no handle span among %d", len(exp.GetSpans()))
	}
}
