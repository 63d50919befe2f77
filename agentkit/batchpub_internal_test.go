package agentkit

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/internal/natstest"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// TestFastBatchResult reads each kind of reply a fast batch can get.
func TestFastBatchResult(t *testing.T) {
	reply := func(v any) *nats.Msg {
		data, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return &nats.Msg{Data: data}
	}
	status := func(code, text string) *nats.Msg {
		return &nats.Msg{Header: nats.Header{"Status": {code}, "Description": {text}}}
	}
	for _, tc := range []struct {
		name    string
		msg     *nats.Msg
		stored  int
		wantErr bool
		is      error // if set, the error must match it
	}{
		{"commit ack", reply(fastBatchReply{Batch: "b1", Count: 7}), 7, false, nil},
		{"flow control", reply(fastBatchReply{Type: "ack"}), -1, false, nil},
		{"another batch's ack", reply(fastBatchReply{Batch: "b2", Count: 7}), 0, true, errFastBatchUnsupported},
		{"batch publish disabled", reply(fastBatchReply{Error: &jetstream.APIError{ErrorCode: jsBatchPublishDisabled}}), 0, true, errFastBatchUnsupported},
		{"stream error", reply(fastBatchReply{Error: &jetstream.APIError{Code: 503, ErrorCode: 10077}}), 0, true, &jetstream.APIError{ErrorCode: 10077}},
		{"no responders", status("503", ""), 0, true, nats.ErrNoResponders},
		{"other status", status("408", "Request Timeout"), 0, true, nil},
		{"not JSON", &nats.Msg{Data: []byte("?")}, 0, true, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stored, err := fastBatchResult(tc.msg, "b1")
			if stored != tc.stored {
				t.Errorf("stored %d, want %d", stored, tc.stored)
			}
			if (err != nil) != tc.wantErr || (tc.is != nil && !errors.Is(err, tc.is)) {
				t.Errorf("err = %v, want error %v (matching %v)", err, tc.wantErr, tc.is)
			}
		})
	}
}

// Fast batches in flight at once share the agent's one reply
// subscription, and each gets its own ack.
func TestFastBatches_ConcurrentBatchesGetTheirOwnAcks(t *testing.T) {
	a, stream := streamAgent(t, true)
	const batches, size = 4, 50
	var wg sync.WaitGroup
	for b := range batches {
		wg.Go(func() {
			envs := make([]*wire.Envelope, size)
			for i := range envs {
				var err error
				if envs[i], err = a.NewRequest(context.Background(), "receiver", "work", map[string]int{"b": b, "i": i}); err != nil {
					t.Error(err)
					return
				}
			}
			if err := a.SendBatch(context.Background(), envs); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	st := a.Stats()
	if st.FastBatched != batches*size || st.FastBatchFallbacks != 0 {
		t.Errorf("FastBatched %d, fallbacks %d; want %d and 0", st.FastBatched, st.FastBatchFallbacks, batches*size)
	}
	info, err := stream.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != batches*size {
		t.Errorf("stream holds %d messages, want %d", info.State.Msgs, batches*size)
	}
	a.send.fast.mu.Lock()
	defer a.send.fast.mu.Unlock()
	if len(a.send.fast.waiting) != 0 {
		t.Errorf("%d batches still registered", len(a.send.fast.waiting))
	}
}

// A stopped agent's SendBatch publishes nothing: a fast batch would
// subscribe again to its replies, and nothing would drop that
// subscription (nor its goroutine) before the connection closes.
func TestFastBatches_NoSubscriptionAfterStop(t *testing.T) {
	a, stream := streamAgent(t, true)
	a.Stop()
	envs := make([]*wire.Envelope, 3)
	for i := range envs {
		var err error
		if envs[i], err = a.NewRequest(context.Background(), "receiver", "work", map[string]int{"i": i}); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.SendBatch(context.Background(), envs); !errors.Is(err, ErrClosed) {
		t.Fatalf("SendBatch after Stop: %v, want ErrClosed", err)
	}
	a.send.fast.mu.Lock()
	sub := a.send.fast.sub
	a.send.fast.mu.Unlock()
	if sub != nil {
		t.Errorf("a fast batch reply subscription after Stop (valid: %v)", sub.IsValid())
	}
	if st := a.Stats(); st.FastBatched != 0 {
		t.Errorf("FastBatched = %d after Stop", st.FastBatched)
	}
	info, err := stream.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 0 {
		t.Errorf("stream holds %d messages, want none", info.State.Msgs)
	}
}

// streamAgent returns a sender (with opts) on a fresh stream that takes
// fast batches or not, and the stream.
func streamAgent(t *testing.T, fast bool, opts ...Option) (*Agent, jetstream.Stream) {
	t.Helper()
	s := natstest.RunServer(t)
	nc := natstest.Connect(t, s)
	scheme, _ := subjects.New("fast")
	a, err := New(nc, "sender", append([]Option{WithScheme(scheme), WithRegistration(false)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Stop)
	js, _ := jetstream.New(nc)
	cfg := StreamConfig(scheme, 1)
	cfg.AllowBatchPublish = fast
	stream, err := js.CreateStream(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return a, stream
}
