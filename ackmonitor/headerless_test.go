package ackmonitor_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agentmesh-io/agentmesh/ackmonitor/store"
	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
)

// A sender that mirrors no header loses no ledger data: the intake reads
// the bodies of its sends (the sends consumer delivers headers only) for
// the message id, type, action, correlation, workflow and in_reply_to.
func TestIntake_SendWithoutHeadersReadFromBody(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	st, db := openBreakableStore(t, sqliteStore)
	ctx := testCtx(t)
	m.agent("worker", map[string]agentkit.HandlerFunc{"work": func(context.Context, *agentkit.Message) error { return nil }})
	m.agent("client", nil)
	mon := startMonitor(t, m.s, fastConfig(st))
	eventually(t, 20*time.Second, "the monitor active", mon.Active)

	js := m.jetstream()
	bare := func(e *wire.Envelope) uint64 {
		t.Helper()
		body, err := e.Encode()
		if err != nil {
			t.Fatal(err)
		}
		subject := "mesh.agent." + e.ReceiverID + "." + string(e.Priority) + "." + e.SenderID
		ack, err := js.PublishMsg(ctx, &nats.Msg{Subject: subject, Data: body}) // no header at all
		if err != nil {
			t.Fatal(err)
		}
		return ack.Sequence
	}
	req := wire.NewEnvelope(wire.TypeRequest, "client", "work")
	req.ReceiverID, req.Correlation, req.WorkflowID = "worker", "corr-bare", "wf-bare"
	reqSeq := bare(req)
	resp := req.NewResponse("worker", "work_done", nil)
	respSeq := bare(resp)

	var r store.Record
	eventually(t, 20*time.Second, "the request's row with its send and ack", func() bool {
		var err error
		r, err = st.Get(ctx, store.Key{StreamSeq: reqSeq, Consumer: "worker_normal"})
		return err == nil && !r.SentAt.IsZero() && r.Status == store.StatusACK
	})
	if r.MessageID != req.MessageID || r.Correlation != "corr-bare" || r.Workflow != "wf-bare" || r.Sender != "client" {
		t.Errorf("request row: message id %q, correlation %q, workflow %q, sender %q; want %q, corr-bare, wf-bare, client",
			r.MessageID, r.Correlation, r.Workflow, r.Sender, req.MessageID)
	}
	type send struct{ id, typ, action, corr, wf, inReplyTo string }
	sendAt := func(seq uint64) (s send) {
		t.Helper()
		err := db.QueryRowContext(ctx, `SELECT message_id, message_type, action, correlation_id, workflow_execution_id, in_reply_to
			FROM message_sends WHERE stream_seq = ?`, int64(seq)).Scan(&s.id, &s.typ, &s.action, &s.corr, &s.wf, &s.inReplyTo)
		if err != nil {
			t.Fatalf("send %d: %v", seq, err)
		}
		return s
	}
	if got, want := sendAt(reqSeq), (send{req.MessageID, "request", "work", "corr-bare", "wf-bare", ""}); got != want {
		t.Errorf("request's send %+v, want %+v", got, want)
	}
	eventually(t, 20*time.Second, "the response's send", func() bool {
		var n int
		return db.QueryRowContext(ctx, `SELECT count(*) FROM message_sends WHERE stream_seq = ?`, int64(respSeq)).Scan(&n) == nil && n == 1
	})
	if got, want := sendAt(respSeq), (send{resp.MessageID, "response", "work_done", "corr-bare", "wf-bare", req.MessageID}); got != want {
		t.Errorf("response's send %+v, want %+v", got, want)
	}
}
