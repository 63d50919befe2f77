package subjects_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/internal/natstest"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// TestAPI checks the JetStream API subjects built with API against the
// server's own templates (server/jetstream_api.go).
func TestAPI(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ got, want string }{
		{subjects.APIPrefix, server.JSApiPrefix},
		{subjects.API("INFO"), server.JSApiAccountInfo},
		{subjects.API("STREAM", "CREATE", "S"), fmt.Sprintf(server.JSApiStreamCreateT, "S")},
		{subjects.API("STREAM", "UPDATE", "S"), fmt.Sprintf(server.JSApiStreamUpdateT, "S")},
		{subjects.API("STREAM", "INFO", "S"), fmt.Sprintf(server.JSApiStreamInfoT, "S")},
		{subjects.API("STREAM", "PURGE", "S"), fmt.Sprintf(server.JSApiStreamPurgeT, "S")},
		{subjects.API("STREAM", "MSG", "GET", "S"), fmt.Sprintf(server.JSApiMsgGetT, "S")},
		{subjects.API("DIRECT", "GET", "S"), fmt.Sprintf(server.JSDirectMsgGetT, "S")},
		{subjects.API("CONSUMER", "CREATE", "S", "C", "F"), fmt.Sprintf(server.JSApiConsumerCreateExT, "S", "C", "F")},
		{subjects.API("CONSUMER", "INFO", "S", "C"), fmt.Sprintf(server.JSApiConsumerInfoT, "S", "C")},
		{subjects.API("CONSUMER", "DELETE", "S", "C"), fmt.Sprintf(server.JSApiConsumerDeleteT, "S", "C")},
		{subjects.API("CONSUMER", "MSG", "NEXT", "S", "C"), fmt.Sprintf(server.JSApiRequestNextT, "S", "C")},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, server says %q", tc.got, tc.want)
		}
	}
}

// TestAckAndFlowControlFilters checks the filters against subjects in
// both formats the server writes (consumer.go: ackReplyT, fcPre), and
// that they leave other consumers' and streams' subjects out.
func TestAckAndFlowControlFilters(t *testing.T) {
	t.Parallel()
	matchesAny := func(subject string, filters []string) bool {
		for _, f := range filters {
			if server.SubjectMatchesFilter(subject, f) {
				return true
			}
		}
		return false
	}
	acks := subjects.AckFilters("MESH", "a1_high")
	for _, tc := range []struct {
		subject string
		want    bool
	}{
		{"$JS.ACK.MESH.a1_high.1.42.7.1620086713306484000.0", true},               // v1
		{"$JS.ACK.hub.ACCHASH.MESH.a1_high.1.42.7.1620086713306484000.0.x", true}, // v2
		{"$JS.ACK.MESH.a1_low.1.42.7.1620086713306484000.0", false},
		{"$JS.ACK.hub.ACCHASH.MESH.a2_high.1.42.7.1620086713306484000.0.x", false},
		{"$JS.ACK.OTHER.a1_high.1.42.7.1620086713306484000.0", false},
	} {
		if got := matchesAny(tc.subject, acks); got != tc.want {
			t.Errorf("AckFilters %q match %s: %v, want %v", acks, tc.subject, got, tc.want)
		}
	}
	if any := subjects.AckFilters("MESH", "*"); !matchesAny("$JS.ACK.MESH.a1_high.1.42.7.1620086713306484000.0", any) {
		t.Errorf("AckFilters %q miss a consumer of MESH", any)
	}
	fc := subjects.FlowControlFilters("KV_b")
	for _, tc := range []struct {
		subject string
		want    bool
	}{
		{"$JS.FC.KV_b.cons.1", true},
		{"$JS.FC.hub.ACCHASH.KV_b.cons.1", true},
		{"$JS.FC.KV_c.cons.1", false},
	} {
		if got := matchesAny(tc.subject, fc); got != tc.want {
			t.Errorf("FlowControlFilters %q match %s: %v, want %v", fc, tc.subject, got, tc.want)
		}
	}
}

// TestAckReply checks that a NAK on AckReply, sent from a connection that
// never received the message, hands a pending message back at once, and
// that the server ignores one for a message that is not pending.
func TestAckReply(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := natstest.RunServer(t)
	js, err := jetstream.New(natstest.Connect(t, srv))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ACKS", Subjects: []string{"acks.>"}}); err != nil {
		t.Fatal(err)
	}
	cons, err := js.CreateConsumer(ctx, "ACKS", jetstream.ConsumerConfig{Durable: "c", AckPolicy: jetstream.AckExplicitPolicy,
		AckWait: time.Hour, FilterSubject: "acks.a"})
	if err != nil {
		t.Fatal(err)
	}
	for _, subj := range []string{"acks.a", "acks.b", "acks.a"} {
		if _, err := js.Publish(ctx, subj, nil); err != nil {
			t.Fatal(err)
		}
	}
	batch, err := cons.Fetch(2, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var held []jetstream.Msg
	for m := range batch.Messages() {
		held = append(held, m)
	}
	if len(held) != 2 {
		t.Fatalf("fetched %d messages, want 2 (%v)", len(held), batch.Error())
	}
	if err := held[0].Ack(); err != nil { // seq 1 acked, seq 3 pending
		t.Fatal(err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	other := natstest.Connect(t, srv)
	for seq := info.AckFloor.Stream + 1; seq <= info.Delivered.Stream; seq++ {
		if err := other.Publish(subjects.AckReply("ACKS", "c", seq, info.Delivered.Consumer), []byte("-NAK")); err != nil {
			t.Fatal(err)
		}
	}
	if err := other.Flush(); err != nil {
		t.Fatal(err)
	}
	again, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	m, ok := <-again.Messages()
	if !ok {
		t.Fatalf("the NAKed message did not come back within 5s of its hour's ack wait: %v", again.Error())
	}
	md, err := m.Metadata()
	if err != nil {
		t.Fatal(err)
	}
	if md.Sequence.Stream != 3 || md.NumDelivered != 2 {
		t.Errorf("redelivered stream seq %d, delivery %d; want 3, 2", md.Sequence.Stream, md.NumDelivered)
	}
	if info, err = cons.Info(ctx); err != nil {
		t.Fatal(err)
	}
	if info.NumAckPending != 1 || info.NumRedelivered != 1 {
		t.Errorf("after the hand-back: %d pending, %d redelivered; want 1, 1 (the acked message untouched)", info.NumAckPending, info.NumRedelivered)
	}
}

// TestBucketStreams checks KVStream, ObjectStream and ObjectFilter against
// the streams nats.go creates for a KV bucket and an object store.
func TestBucketStreams(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	js, err := jetstream.New(natstest.Connect(t, natstest.RunServer(t)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "kvb"}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Stream(ctx, subjects.KVStream("kvb")); err != nil {
		t.Errorf("KVStream(kvb) = %s: %v", subjects.KVStream("kvb"), err)
	}
	if _, err := js.CreateObjectStore(ctx, jetstream.ObjectStoreConfig{Bucket: "objb"}); err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(ctx, subjects.ObjectStream("objb"))
	if err != nil {
		t.Fatalf("ObjectStream(objb) = %s: %v", subjects.ObjectStream("objb"), err)
	}
	for _, s := range st.CachedInfo().Config.Subjects {
		if !server.SubjectMatchesFilter(s, subjects.ObjectFilter("objb")) {
			t.Errorf("the object store's subjects %s are not under ObjectFilter %s", s, subjects.ObjectFilter("objb"))
		}
	}
}

// TestAppendFastBatchReply checks the reply subject's tokens against the
// server's constants for the protocol (server/stream.go getFastBatch).
func TestAppendFastBatchReply(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		op   subjects.FastBatchOp
		want int
	}{
		{subjects.FastBatchStart, server.FastBatchOpStart},
		{subjects.FastBatchAppend, server.FastBatchOpAppend},
		{subjects.FastBatchCommit, server.FastBatchOpCommit},
	} {
		if got := int(tc.op - '0'); got != tc.want {
			t.Errorf("op %q is %d, server says %d", tc.op, got, tc.want)
		}
	}
	buf := []byte("kept")
	got := string(subjects.AppendFastBatchReply(buf, "_INBOX.abc", 500, 12, subjects.FastBatchCommit))
	want := "kept_INBOX.abc.500." + server.FastBatchGapFail + ".12.2" + server.FastBatchSuffix
	if got != want {
		t.Errorf("AppendFastBatchReply = %q, want %q", got, want)
	}
}
