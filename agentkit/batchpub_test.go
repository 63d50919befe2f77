package agentkit_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// batchWire records, from a connection of its own, what goes over the wire
// for SendBatch: the mesh messages published as part of a fast batch, and
// the stream's replies to fast batches (on the default _INBOX prefix).
type batchWire struct {
	nc *nats.Conn
	ch chan *nats.Msg // every subscription's: nats.go fills it as it reads
	// fast counts mesh messages published with a fast batch reply subject.
	fast int
	// acks are the counts of the batch acks, in arrival order.
	acks []int
	// errCodes are the JetStream error codes of error replies.
	errCodes []int
}

func (m *mesh) watchBatches() *batchWire {
	m.t.Helper()
	w := &batchWire{nc: m.conn(), ch: make(chan *nats.Msg, 1<<14)}
	for _, subject := range append(subjects.Default.StreamSubjects(), "_INBOX.>") {
		if _, err := w.nc.ChanSubscribe(subject, w.ch); err != nil {
			m.t.Fatal(err)
		}
	}
	if err := w.nc.Flush(); err != nil {
		m.t.Fatal(err)
	}
	return w
}

// seen returns what the wire carried up to now: everything the server
// sent this connection before it answered a flush, which nats.go has put
// in the channel by then.
func (w *batchWire) seen(t *testing.T) (fast int, acks, errCodes []int) {
	t.Helper()
	if err := w.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	for {
		select {
		case msg := <-w.ch:
			w.record(msg)
		default:
			return w.fast, slices.Clone(w.acks), slices.Clone(w.errCodes)
		}
	}
}

func (w *batchWire) record(msg *nats.Msg) {
	if !strings.HasPrefix(msg.Subject, "_INBOX.") {
		if strings.HasSuffix(msg.Reply, ".$FI") {
			w.fast++
		}
		return
	}
	var r struct {
		Type  string              `json:"type"`
		Batch string              `json:"batch"`
		Count int                 `json:"count"`
		Error *jetstream.APIError `json:"error"`
	}
	switch {
	case json.Unmarshal(msg.Data, &r) != nil || r.Type != "":
		// not a JetStream reply, or fast batch flow control
	case r.Error != nil:
		w.errCodes = append(w.errCodes, int(r.Error.ErrorCode))
	case r.Batch != "":
		w.acks = append(w.acks, r.Count)
	}
}

// requests returns n requests from sender to "recv", with payload.
func requests(t *testing.T, sender *agentkit.Agent, n int, payload any) []*wire.Envelope {
	t.Helper()
	envs := make([]*wire.Envelope, n)
	for i := range envs {
		e, err := sender.NewRequest(ctx(t), "recv", "work", payload)
		if err != nil {
			t.Fatal(err)
		}
		envs[i] = e
	}
	return envs
}

// storedMsgs returns how many messages the MESH stream holds.
func (m *mesh) storedMsgs() uint64 {
	m.t.Helper()
	js, err := jetstream.New(m.conn())
	if err != nil {
		m.t.Fatal(err)
	}
	s, err := js.Stream(ctx(m.t), subjects.Default.Stream())
	if err != nil {
		m.t.Fatal(err)
	}
	info, err := s.Info(ctx(m.t))
	if err != nil {
		m.t.Fatal(err)
	}
	return info.State.Msgs
}

// createStream creates the MESH stream ahead of the agents, as an
// administrator would: agentkit's configuration, changed by edit.
func (m *mesh) createStream(edit func(*jetstream.StreamConfig)) {
	m.t.Helper()
	js, err := jetstream.New(m.conn())
	if err != nil {
		m.t.Fatal(err)
	}
	cfg := agentkit.StreamConfig(subjects.Default, 1)
	edit(&cfg)
	if _, err := js.CreateStream(ctx(m.t), cfg); err != nil {
		m.t.Fatal(err)
	}
}

// handledOnce waits until rec has handled every one of envs and checks it
// handled each exactly once and nothing else.
func handledOnce(t *testing.T, rec *recorder, envs []*wire.Envelope) {
	t.Helper()
	eventually(t, 10*time.Second, "every message handled", func() bool { return rec.count() >= len(envs) })
	ids := rec.ids()
	for _, e := range envs {
		if ids[e.MessageID] != 1 {
			t.Fatalf("message %s handled %d times, want once", e.MessageID, ids[e.MessageID])
		}
	}
	if len(ids) != len(envs) || rec.count() != len(envs) {
		t.Fatalf("handled %d messages (%d distinct), want %d", rec.count(), len(ids), len(envs))
	}
}

// SendBatch stores a batch with fast batch publish, in batches of at most
// 1,000 each confirmed by one ack, and a batch sent again is deduplicated.
func TestSendBatch_FastBatch(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	rec := &recorder{}
	m.started("recv", map[string]agentkit.HandlerFunc{"work": rec.handle(nil)})
	wire := m.watchBatches()
	reg := prometheus.NewRegistry()
	sender := m.agent("sender", withMetrics(t, reg))
	envs := requests(t, sender, 1200, map[string]int{"n": 1})
	if err := sender.SendBatch(ctx(t), envs); err != nil {
		t.Fatal(err)
	}
	fast, acks, errCodes := wire.seen(t)
	if fast != 1200 || !slices.Equal(acks, []int{1000, 200}) || len(errCodes) != 0 {
		t.Fatalf("on the wire: %d fast batch messages, batch acks %v, errors %v; want 1200, [1000 200], none", fast, acks, errCodes)
	}
	if err := sender.SendBatch(ctx(t), envs); err != nil {
		t.Fatal(err)
	}
	if _, acks, _ := wire.seen(t); !slices.Equal(acks, []int{1000, 200, 1000, 200}) {
		t.Fatalf("batch acks %v, want [1000 200 1000 200]", acks)
	}
	if n := m.storedMsgs(); n != 1200 {
		t.Fatalf("stream holds %d messages, want 1200", n)
	}
	if st := sender.Stats(); st.FastBatched != 2400 || st.FastBatchFallbacks != 0 {
		t.Errorf("%d messages stored in fast batches and %d fell back to one-by-one publishing, want 2,400 and none", st.FastBatched, st.FastBatchFallbacks)
	}
	checkBatchMetric(t, reg, 2400, 0)
	handledOnce(t, rec, envs)
}

// On a stream without fast batch publish (one created before agentkit
// enabled it, which Start leaves as it is), SendBatch stores every message
// one by one, and after the first refusal stops trying.
func TestSendBatch_StreamWithoutFastBatch(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	m.createStream(func(c *jetstream.StreamConfig) { c.AllowBatchPublish = false })
	rec := &recorder{}
	m.started("recv", map[string]agentkit.HandlerFunc{"work": rec.handle(nil)})
	wire := m.watchBatches()
	reg := prometheus.NewRegistry()
	sender := m.agent("sender", withMetrics(t, reg))
	first := requests(t, sender, 10, nil)
	if err := sender.SendBatch(ctx(t), first); err != nil {
		t.Fatal(err)
	}
	tried, acks, errCodes := wire.seen(t)
	if tried == 0 || len(acks) != 0 || len(errCodes) == 0 || slices.ContainsFunc(errCodes, func(c int) bool { return c != 10205 }) {
		t.Fatalf("first batch: %d fast batch messages, acks %v, errors %v; want some, none, only 10205 (batch publish disabled)", tried, acks, errCodes)
	}
	second := requests(t, sender, 10, nil)
	if err := sender.SendBatch(ctx(t), second); err != nil {
		t.Fatal(err)
	}
	if fast, _, _ := wire.seen(t); fast != tried {
		t.Fatalf("second batch sent %d fast batch messages, want none", fast-tried)
	}
	if st := sender.Stats(); st.FastBatched != 0 || st.FastBatchFallbacks != uint64(len(first)) {
		t.Errorf("%d messages stored in fast batches and %d fell back to one-by-one publishing, want none and the first batch's %d",
			st.FastBatched, st.FastBatchFallbacks, len(first))
	}
	checkBatchMetric(t, reg, 0, 20)
	if n := m.storedMsgs(); n != 20 {
		t.Fatalf("stream holds %d messages, want 20", n)
	}
	handledOnce(t, rec, append(first, second...))
}

// A message the stream refuses in the middle of a batch fails alone: the
// batch error names it, and every other message is stored once, whether
// or not the stream takes fast batches.
func TestSendBatch_ReportsEachFailure(t *testing.T) {
	t.Parallel()
	for _, fastBatch := range []bool{true, false} {
		t.Run(map[bool]string{true: "fast", false: "one by one"}[fastBatch], func(t *testing.T) {
			t.Parallel()
			m := newMesh(t)
			m.createStream(func(c *jetstream.StreamConfig) { c.AllowBatchPublish, c.MaxMsgSize = fastBatch, 2048 })
			rec := &recorder{}
			m.started("recv", map[string]agentkit.HandlerFunc{"work": rec.handle(nil)})
			wire := m.watchBatches()
			sender := m.agent("sender")
			envs := requests(t, sender, 8, map[string]string{"text": "small"})
			tooBig, err := sender.NewRequest(ctx(t), "recv", "work", map[string]string{"text": strings.Repeat("x", 4096)})
			if err != nil {
				t.Fatal(err)
			}
			envs[3] = tooBig
			if failed := failedItems(t, sender, envs); !slices.Equal(failed, []int{3}) {
				t.Errorf("items %v failed, want [3]", failed)
			}
			if fast, _, _ := wire.seen(t); fastBatch && fast != len(envs) {
				t.Errorf("%d fast batch messages on the wire, want %d", fast, len(envs))
			}
			if n := m.storedMsgs(); n != 7 {
				t.Fatalf("stream holds %d messages, want 7", n)
			}
			handledOnce(t, rec, slices.Delete(envs, 3, 4))
		})
	}
}

// When a fast batch fills the stream, its ack counts the messages stored,
// and SendBatch reports each one after those as failed.
func TestSendBatch_StreamFullMidBatch(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	m.createStream(func(c *jetstream.StreamConfig) { c.MaxMsgs, c.Discard = 5, jetstream.DiscardNew })
	wire := m.watchBatches()
	reg := prometheus.NewRegistry()
	sender := m.agent("sender", withMetrics(t, reg))
	// The stream refuses with a retryable 503: retries end with the context.
	if failed := failedItems(t, sender, requests(t, sender, 8, nil)); !slices.Equal(failed, []int{5, 6, 7}) {
		t.Errorf("items %v failed, want [5 6 7]", failed)
	}
	if _, acks, _ := wire.seen(t); !slices.Equal(acks, []int{5}) {
		t.Errorf("batch acks %v, want [5]", acks)
	}
	if st := sender.Stats(); st.FastBatched != 5 || st.FastBatchFallbacks != 3 {
		t.Errorf("%d messages stored in fast batches and %d fell back to one-by-one publishing, want 5 and 3", st.FastBatched, st.FastBatchFallbacks)
	}
	checkBatchMetric(t, reg, 5, 0) // the three that failed are not stored
	if n := m.storedMsgs(); n != 5 {
		t.Fatalf("stream holds %d messages, want 5", n)
	}
}

// Without a stream nothing is stored, and SendBatch says so for every
// message: the server's no-responders replies confirm nothing.
func TestSendBatch_NoStream(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	sender := m.agent("sender")
	if failed := failedItems(t, sender, requests(t, sender, 4, nil)); !slices.Equal(failed, []int{0, 1, 2, 3}) {
		t.Errorf("items %v failed, want all 4", failed)
	}
}

// Without a stream, a Send retries until its deadline (a stream without a
// leader answers the same way for a moment) and then says why its
// attempts failed, not only that the time ran out. An attempt still
// waiting for its answer at the deadline (a busy machine) leaves the
// outcome open, ErrPublishUnconfirmed; otherwise it is ErrPublish.
func TestSend_NoStreamSaysWhy(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	sender := m.agent("sender")
	sendCtx, cancel := context.WithTimeout(ctx(t), time.Second)
	defer cancel()
	_, err := sender.Send(sendCtx, "receiver", "work", nil)
	failed := errors.Is(err, agentkit.ErrPublish) || errors.Is(err, agentkit.ErrPublishUnconfirmed)
	if !failed || !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, jetstream.ErrNoStreamResponse) {
		t.Fatalf("Send = %v, want a failed publish at the deadline, naming the stream's silence", err)
	}
}

// failedItems sends envs with SendBatch under a 1s deadline (retryable
// refusals are retried until then) and returns the items it reports
// failed. The error must be a *BatchError matching ErrPublish, and each
// failure must name its message.
func failedItems(t *testing.T, sender *agentkit.Agent, envs []*wire.Envelope) []int {
	t.Helper()
	sendCtx, cancel := context.WithTimeout(ctx(t), time.Second)
	defer cancel()
	err := sender.SendBatch(sendCtx, envs)
	var batchErr *agentkit.BatchError
	if !errors.As(err, &batchErr) || !errors.Is(err, agentkit.ErrPublish) {
		t.Fatalf("SendBatch = %v, want a *BatchError matching ErrPublish", err)
	}
	var failed []int
	for i, err := range batchErr.Errs {
		if err != nil {
			failed = append(failed, i)
			if !strings.Contains(err.Error(), envs[i].MessageID) {
				t.Errorf("item %d's error %q does not name its message", i, err)
			}
		}
	}
	return failed
}

// checkBatchMetric checks agent_batch_messages_total of the sender
// registered on reg: fast and single messages stored.
func checkBatchMetric(t *testing.T, reg *prometheus.Registry, fast, single float64) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "agent_batch_messages_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "publish" {
					got[l.GetValue()] += m.GetCounter().GetValue()
				}
			}
		}
	}
	if got["fast"] != fast || got["single"] != single {
		t.Errorf("agent_batch_messages_total: fast %v, single %v; want %v and %v", got["fast"], got["single"], fast, single)
	}
}
