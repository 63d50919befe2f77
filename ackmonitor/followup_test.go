package ackmonitor_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/ackmonitor"
	"github.com/agentmesh-io/agentmesh/ackmonitor/store"
	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/dlq"
	"github.com/agentmesh-io/agentmesh/internal/metricstest"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// TestFollowUp_RetriesUntilTheDLQTakesIt takes the dead-letter stream's
// subjects away, so the copy of a rejected message finds no stream: each
// failed try is counted in ackmonitor_follow_up_failures_total and the row
// stays pending. Once the subjects are back, the next try stores the copy,
// once.
func TestFollowUp_RetriesUntilTheDLQTakesIt(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	st := openStore(t, sqliteStore)
	ctx := testCtx(t)
	mon := startMonitor(t, m.s, fastConfig(st))
	metrics := httptest.NewServer(mon.Handler())
	t.Cleanup(metrics.Close)
	failures := func() float64 {
		v, err := metricstest.Value(metrics.URL+"/metrics", "ackmonitor_follow_up_failures_total")
		if err != nil {
			t.Fatal(err)
		}
		return v
	}

	js := m.jetstream()
	dlqStream, err := js.Stream(ctx, subjects.Default.DLQStream())
	if err != nil {
		t.Fatal(err)
	}
	cfg := dlqStream.CachedInfo().Config
	dlqSubjects := slices.Clone(cfg.Subjects)
	cfg.Subjects = []string{"parked.dlq"}
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}

	m.agent("worker", map[string]agentkit.HandlerFunc{"reject": func(context.Context, *agentkit.Message) error {
		return agentkit.Reject(wire.CodeRejected, "never")
	}})
	env, err := m.agent("client", nil).Send(ctx, "worker", "reject", nil)
	if err != nil {
		t.Fatal(err)
	}
	deadLettered := func() []store.Record {
		recs, err := st.Messages(ctx, store.Query{DeadLetter: true})
		if err != nil {
			t.Fatal(err)
		}
		return recs
	}
	eventually(t, 20*time.Second, "two failed tries", func() bool { return failures() >= 2 })
	if recs := deadLettered(); len(recs) != 0 {
		t.Fatalf("rows recording a dead letter while the DLQ took none: %+v", recs)
	}

	cfg.Subjects = dlqSubjects
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	// The row's send fields come from the sends intake, which runs apart
	// from the events and may lag under load.
	eventually(t, 20*time.Second, "the row recording its dead letter and its send", func() bool {
		recs := deadLettered()
		return len(recs) == 1 && !recs[0].SentAt.IsZero()
	})
	recs := deadLettered()
	info, err := dlqStream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if recs[0].MessageID != env.MessageID || recs[0].DLQSeq != 1 || info.State.Msgs != 1 {
		t.Errorf("row %s with DLQ seq %d, DLQ holding %d; want %s, 1 and 1", recs[0].MessageID, recs[0].DLQSeq, info.State.Msgs, env.MessageID)
	}
	msg, err := dlqStream.GetMsg(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if got := msg.Header.Get(dlq.HeaderOriginalID); got != env.MessageID {
		t.Errorf("the dead letter's original id is %q; want %q", got, env.MessageID)
	}
}

// TestFollowUp_RetriedAfterItsCopyStoresEachOnce fails the ledger write
// that completes a follow-up, after its dead-letter copy and escalation
// were stored: an instance dying at that point, or a lost publish ack. The
// retries skip the copy the row records and publish the escalation again
// under its message id, and the streams keep one of each.
func TestFollowUp_RetriedAfterItsCopyStoresEachOnce(t *testing.T) {
	t.Parallel()
	m, st, dir, twoDeliveries := takeoverMesh(t)
	ctx := testCtx(t)
	busyWorker(m, twoDeliveries)
	failing := &failingCompletions{Store: st}
	failing.left.Store(2)
	mon := startMonitor(t, m.s, fastConfig(failing))
	metrics := httptest.NewServer(mon.Handler())
	t.Cleanup(metrics.Close)

	env, err := m.agent("client", nil).Send(ctx, "worker", "never", nil)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the row completing its follow-up", func() bool {
		recs, err := st.Messages(ctx, store.Query{DeadLetter: true})
		return err == nil && len(recs) == 1 && !recs[0].HandledAt.IsZero()
	})
	if left := failing.left.Load(); left > 0 {
		t.Fatalf("%d failed completions left; the follow-up was not retried", left)
	}
	js := m.jetstream()
	dlqStream, err := js.Stream(ctx, subjects.Default.DLQStream())
	if err != nil {
		t.Fatal(err)
	}
	dlqInfo, err := dlqStream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	toDirector, err := subjects.Default.DirectFilter("director", string(wire.PriorityHigh))
	if err != nil {
		t.Fatal(err)
	}
	mesh, err := js.Stream(ctx, subjects.Default.Stream())
	if err != nil {
		t.Fatal(err)
	}
	meshInfo, err := mesh.Info(ctx, jetstream.WithSubjectFilter(toDirector))
	if err != nil {
		t.Fatal(err)
	}
	escalations := uint64(0)
	for _, n := range meshInfo.State.Subjects {
		escalations += n
	}
	deadLetters, err := metricstest.Value(metrics.URL+"/metrics", `ackmonitor_dead_letters_total{agent="worker",priority="normal"}`)
	if err != nil {
		t.Fatal(err)
	}
	if dlqInfo.State.Msgs != 1 || escalations != 1 || deadLetters != 1 {
		t.Fatalf("after 3 tries: %d dead letters stored, %d escalations, %v counted; want one of each", dlqInfo.State.Msgs, escalations, deadLetters)
	}
	eventually(t, 20*time.Second, "the escalation", func() bool { return len(dir.list()) > 0 })
	if esc := dir.list()[0]; esc.MessageID != env.MessageID {
		t.Fatalf("escalation of %s, want %s", esc.MessageID, env.MessageID)
	}
}

// failingCompletions fails the first left CompleteFollowUps calls.
type failingCompletions struct {
	store.Store
	left atomic.Int32
}

func (s *failingCompletions) CompleteFollowUps(ctx context.Context, fs []store.FollowUp) error {
	if s.left.Add(-1) >= 0 {
		return errors.New("instance dying")
	}
	return s.Store.CompleteFollowUps(ctx, fs)
}

// TestFollowUp_FailingRowsDoNotHoldUpOthers: a full page of rows whose
// follow-up keeps failing (their sender has no director) must not keep
// the rows behind it from being escalated.
func TestFollowUp_FailingRowsDoNotHoldUpOthers(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	st := openStore(t, sqliteStore)
	ctx := testCtx(t)
	dir := &escalations{}
	m.agent("director", map[string]agentkit.HandlerFunc{ackmonitor.ActionEscalation: dir.handler})
	cfg := fastConfig(st)
	cfg.EscalateTerminated = true
	cfg.Directors = ackmonitor.DirectorFunc(func(_ context.Context, sender string) (string, error) {
		if sender == "orphan" {
			return "", errors.New("no director for orphan")
		}
		return "director", nil
	})
	startMonitor(t, m.s, cfg)
	m.agent("worker", map[string]agentkit.HandlerFunc{"reject": func(context.Context, *agentkit.Message) error {
		return agentkit.Reject(wire.CodeRejected, "never")
	}})
	orphan := m.agent("orphan", nil)
	const page = 64 // the follow-up loop's page
	for range page {
		if _, err := orphan.Send(ctx, "worker", "reject", nil); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 30*time.Second, "the orphan's rows terminated", func() bool {
		return rateOf(t, st, "worker", "normal").Nacked == page
	})
	env, err := m.agent("client", nil).Send(ctx, "worker", "reject", nil)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the client's row escalated", func() bool {
		esc := dir.list()
		return len(esc) == 1 && esc[0].MessageID == env.MessageID
	})
}

// TestFollowUp_RetryDoesNotCopyAgain: when a follow-up fails after its
// dead-letter copy is stored (here the director lookup), its retries do
// not store the copy again, also past the DLQ's duplicate window.
func TestFollowUp_RetryDoesNotCopyAgain(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	st := openStore(t, sqliteStore)
	ctx := testCtx(t)
	js := m.jetstream()
	dlqStream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: subjects.Default.DLQStream(), Subjects: subjects.Default.DLQSubjects(),
		Duplicates: 100 * time.Millisecond}) // shorter than the retries' spacing
	if err != nil {
		t.Fatal(err)
	}
	dir := &escalations{}
	m.agent("director", map[string]agentkit.HandlerFunc{ackmonitor.ActionEscalation: dir.handler})
	var lookups atomic.Int32
	cfg := fastConfig(st)
	cfg.EscalateTerminated = true
	cfg.Directors = ackmonitor.DirectorFunc(func(context.Context, string) (string, error) {
		if lookups.Add(1) <= 2 {
			return "", errors.New("registry has no leader")
		}
		return "director", nil
	})
	startMonitor(t, m.s, cfg)
	m.agent("worker", map[string]agentkit.HandlerFunc{"reject": func(context.Context, *agentkit.Message) error {
		return agentkit.Reject(wire.CodeRejected, "never")
	}})
	if _, err := m.agent("client", nil).Send(ctx, "worker", "reject", nil); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the escalation after two failed tries", func() bool { return len(dir.list()) == 1 })
	info, err := dlqStream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if lookups.Load() != 3 || info.State.Msgs != 1 {
		t.Fatalf("%d director lookups, %d dead-letter copies; want 3 and 1", lookups.Load(), info.State.Msgs)
	}
}

// TestFollowUp_DeadLettersOfMessagesWithoutIDs: messages published without
// a Nats-Msg-Id (no message id of their own) are each dead-lettered, and
// each row records its own copy: a copy's id comes from the row (stream
// sequence and consumer), not from anything the sender sets.
func TestFollowUp_DeadLettersOfMessagesWithoutIDs(t *testing.T) {
	t.Parallel()
	const n = 40
	m := newMesh(t)
	st := openStore(t, sqliteStore)
	ctx := testCtx(t)
	startMonitor(t, m.s, fastConfig(st))
	m.agent("worker", map[string]agentkit.HandlerFunc{"ok": func(context.Context, *agentkit.Message) error { return nil }})
	nc := m.conn()
	for range n {
		// Core NATS: the stream stores it, with no id to deduplicate it by.
		if err := nc.Publish("mesh.agent.worker.normal.client", []byte("not an envelope")); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 30*time.Second, "every row recording its dead letter", func() bool {
		recs, err := st.Messages(ctx, store.Query{DeadLetter: true, Limit: n + 1})
		return err == nil && len(recs) == n
	})
	js := m.jetstream()
	dlqStream, err := js.Stream(ctx, subjects.Default.DLQStream())
	if err != nil {
		t.Fatal(err)
	}
	info, err := dlqStream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != n {
		t.Fatalf("the DLQ holds %d copies of %d terminated messages", info.State.Msgs, n)
	}
	recs, err := st.Messages(ctx, store.Query{DeadLetter: true, Limit: n + 1})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		msg, err := dlqStream.GetMsg(ctx, r.DLQSeq)
		if err != nil {
			t.Fatal(err)
		}
		if got := msg.Header.Get(dlq.HeaderStreamSeq); got != strconv.FormatUint(r.StreamSeq, 10) {
			t.Errorf("row %d/%s records dead letter %d, the copy of stream seq %s", r.StreamSeq, r.Consumer, r.DLQSeq, got)
		}
	}
}

// givenUp returns the rows given up, via the API, and the count in
// ackmonitor_follow_ups_given_up_total for worker/normal.
func givenUp(t *testing.T, url string) ([]store.Record, float64) {
	t.Helper()
	res, err := http.Get(url + "/api/v1/messages?status=given_up")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var body struct{ Messages []store.Record }
	if res.StatusCode != http.StatusOK {
		t.Fatalf("given_up: %s", res.Status)
	}
	if err := json.NewDecoder(res.Body).Decode(&body); err != nil {
		t.Fatal(err)
	}
	n, err := metricstest.Value(url+"/metrics", `ackmonitor_follow_ups_given_up_total{agent="worker",priority="normal"}`)
	if err != nil {
		t.Fatal(err)
	}
	return body.Messages, n
}

// TestFollowUp_GivenUpWhenTheCopyIsRefused: a copy the DLQ stream refuses
// as such (here: above its maximum message size) can never be stored, so
// its row is given up at the first failure, with the reason, and is no
// longer due; the rows behind it are dead-lettered.
func TestFollowUp_GivenUpWhenTheCopyIsRefused(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	st := openStore(t, sqliteStore)
	ctx := testCtx(t)
	js := m.jetstream()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: subjects.Default.DLQStream(), Subjects: subjects.Default.DLQSubjects(),
		MaxMsgSize: 4096}); err != nil {
		t.Fatal(err)
	}
	termAll(t, js, func(jetstream.Msg) string { return "REJECTED: no" })
	mon := startMonitor(t, m.s, fastConfig(st))
	api := httptest.NewServer(mon.Handler())
	t.Cleanup(api.Close)
	for _, size := range []int{8000, 10} {
		if _, err := js.Publish(ctx, "mesh.agent.worker.normal.client", make([]byte, size)); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 30*time.Second, "the small one dead-lettered", func() bool {
		r, err := st.Get(ctx, store.Key{StreamSeq: 2, Consumer: "worker_normal"})
		return err == nil && r.DLQSeq != 0
	})
	eventually(t, 30*time.Second, "the large one given up", func() bool {
		rows, _ := givenUp(t, api.URL)
		return len(rows) == 1
	})
	rows, n := givenUp(t, api.URL)
	r := rows[0]
	if r.StreamSeq != 1 || r.FollowUpAttempts != 1 || r.GivenUpAt.IsZero() || r.DLQSeq != 0 ||
		!strings.Contains(r.FollowUpError, "maximum") || n != 1 {
		t.Fatalf("given up: %+v, counted %v; want row 1 after one try, with the stream's reason", r, n)
	}
	if due, err := st.PendingFollowUps(ctx, store.Key{}, 10); err != nil || len(due) != 0 {
		t.Fatalf("due: %+v, %v", due, err)
	}
}

// TestFollowUp_GivenUpAfterItsAttempts: a follow-up that keeps failing (no
// director for its sender) is given up after FollowUpAttempts tries, with
// the last error; its dead letter, stored by the first try, stays.
func TestFollowUp_GivenUpAfterItsAttempts(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	st := openStore(t, sqliteStore)
	ctx := testCtx(t)
	js := m.jetstream()
	termAll(t, js, func(jetstream.Msg) string { return "REJECTED: no" })
	var lookups atomic.Int32
	cfg := fastConfig(st)
	cfg.EscalateTerminated, cfg.FollowUpAttempts = true, 3
	cfg.Directors = ackmonitor.DirectorFunc(func(context.Context, string) (string, error) {
		lookups.Add(1)
		return "", errors.New("no director for client")
	})
	mon := startMonitor(t, m.s, cfg)
	api := httptest.NewServer(mon.Handler())
	t.Cleanup(api.Close)
	if _, err := js.Publish(ctx, "mesh.agent.worker.normal.client", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the row given up", func() bool {
		rows, _ := givenUp(t, api.URL)
		return len(rows) == 1
	})
	rows, n := givenUp(t, api.URL)
	r := rows[0]
	if r.FollowUpAttempts != 3 || r.FollowUpError != "no director for client" || r.DLQSeq == 0 || !r.EscalatedAt.IsZero() || n != 1 {
		t.Fatalf("given up: %+v, counted %v; want 3 tries, the director's error, the dead letter kept", r, n)
	}
	if got := lookups.Load(); got != 3 {
		t.Fatalf("%d director lookups, want 3", got)
	}
	failures, err := metricstest.Value(api.URL+"/metrics", "ackmonitor_follow_up_failures_total")
	if err != nil || failures != 3 {
		t.Fatalf("failures %v, %v; want 3", failures, err)
	}
}
