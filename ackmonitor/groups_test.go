package ackmonitor_test

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/ackmonitor"
	"github.com/agentmesh-io/agentmesh/ackmonitor/store"
	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/internal/metricstest"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// groupPolicy delivers each message twice at most, half a second apart,
// so a message left unacked is exhausted within a test.
var groupPolicy = agentkit.DeliveryPolicy{BackOff: []time.Duration{500 * time.Millisecond}, MaxDeliver: 2}

// directConsumer creates agent id's own direct consumer at normal
// priority, as agentkit does, with sampling (SampleFrequency) sample.
func directConsumer(t *testing.T, js jetstream.JetStream, id, sample string) jetstream.Consumer {
	t.Helper()
	cfg, err := agentkit.ConsumerConfig(subjects.Default, id, wire.PriorityNormal, groupPolicy)
	if err != nil {
		t.Fatal(err)
	}
	cfg.SampleFrequency = sample
	c, err := js.CreateOrUpdateConsumer(testCtx(t), subjects.Default.Stream(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// groupConsumer creates or updates group's consumer at normal priority
// for the agents ids as agentkit's Group does: an agent's direct
// consumer's configuration, with their direct filters, delivering only
// what is stored after it is made.
func groupConsumer(t *testing.T, js jetstream.JetStream, group, sample string, ids ...string) jetstream.Consumer {
	t.Helper()
	s := subjects.Default
	cfg, err := agentkit.ConsumerConfig(s, ids[0], wire.PriorityNormal, groupPolicy)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Durable, err = s.GroupConsumer(group, "normal"); err != nil {
		t.Fatal(err)
	}
	cfg.Description, cfg.FilterSubject, cfg.SampleFrequency = "agentmesh group "+group, "", sample
	cfg.DeliverPolicy = jetstream.DeliverNewPolicy
	for _, id := range ids {
		f, err := s.DirectFilter(id, "normal")
		if err != nil {
			t.Fatal(err)
		}
		cfg.FilterSubjects = append(cfg.FilterSubjects, f)
	}
	c, err := js.CreateOrUpdateConsumer(testCtx(t), s.Stream(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// handling is what a receiver does with each delivery of a message.
type handling string

const (
	handleAck     handling = "ack"      // acks the first delivery
	handleNakOnce handling = "nak-once" // NAKs the first delivery, acks the second
	handleTerm    handling = "term"     // terminates it with a reason
	handleIgnore  handling = "ignore"   // lets every delivery time out
	handleNakAll  handling = "nak-all"  // NAKs every delivery
)

// receive pulls from consumers until ctx is done, handling each message
// as plan says (by message id; unplanned messages are acked).
func receive(ctx context.Context, t *testing.T, plan map[string]handling, consumers ...jetstream.Consumer) {
	for ctx.Err() == nil {
		for _, c := range consumers {
			batch, err := c.Fetch(20, jetstream.FetchMaxWait(100*time.Millisecond))
			if err != nil {
				continue
			}
			for msg := range batch.Messages() {
				md, err := msg.Metadata()
				if err != nil {
					t.Errorf("metadata: %v", err)
					continue
				}
				switch plan[msg.Headers().Get(wire.HeaderMsgID)] {
				case handleNakOnce:
					if md.NumDelivered == 1 {
						_ = msg.Nak()
					} else {
						_ = msg.DoubleAck(ctx)
					}
				case handleTerm:
					_ = msg.TermWithReason("NOT_FOUND: no such order")
				case handleIgnore:
				case handleNakAll:
					_ = msg.Nak()
				default:
					_ = msg.DoubleAck(ctx)
				}
			}
		}
	}
}

// normalized is what must be the same of a message's row whichever
// consumer delivered it.
type normalized struct {
	Consumer, Receiver, Priority, Sender, Status, NackReason string
	Deliveries, RetryCount, Naks, Timeouts                   int
	NakExhausted, Acknowledged, AckTime, Sent                bool
	History                                                  []store.EventKind
}

func normalize(r store.Record, receiver string) normalized {
	n := normalized{Consumer: r.Consumer, Receiver: r.Receiver, Priority: r.Priority, Sender: r.Sender, Status: r.Status,
		NackReason: r.NackReason, Deliveries: r.Deliveries, RetryCount: r.RetryCount, Naks: r.Naks, Timeouts: r.Timeouts,
		NakExhausted: r.NakExhausted, Acknowledged: !r.AcknowledgedAt.IsZero(), AckTime: r.ProcessingTime > 0, Sent: !r.SentAt.IsZero()}
	for _, e := range r.History {
		n.History = append(n.History, e.Kind)
	}
	// The comparison is of one message sent to a group member and to an
	// agent with its own consumer: the receiver's name is the difference.
	if n.Receiver == receiver {
		n.Receiver, n.Consumer = "R", "R_"+r.Priority
	}
	return n
}

// TestGroups_EventsAttributedToReceivers runs the same messages through a
// group consumer of three agents and through three agents' own
// consumers: the ledger rows of the group's members (receiver, priority,
// outcome, deliveries, NAKs, ack time) are those of the agents with their
// own consumer, the group has no row, no member is listed as a receiver
// without a consumer, and events the group's filters do not cover are
// attributed to nobody.
func TestGroups_EventsAttributedToReceivers(t *testing.T) {
	t.Parallel()
	for _, kind := range []storeKind{sqliteStore, postgresStore} {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			testGroupAttribution(t, kind)
		})
	}
}

func testGroupAttribution(t *testing.T, kind storeKind) {
	m := newMesh(t)
	st := openStore(t, kind)
	ctx := testCtx(t)
	mon := startMonitor(t, m.s, fastConfig(st))
	api := httptest.NewServer(mon.Handler())
	t.Cleanup(api.Close)
	js := m.jetstream()
	group := groupConsumer(t, js, "host", "100", "g1", "g2", "g3")
	own := []jetstream.Consumer{directConsumer(t, js, "o1", "100"), directConsumer(t, js, "o2", "100"), directConsumer(t, js, "o3", "100")}

	// No agent runs for g1..g3 or o1..o3: the client only sends.
	client := m.agent("client", nil)
	type message struct {
		to, peer string // a member and the agent with its own consumer
		h        handling
	}
	messages := []message{
		{"g1", "o1", handleAck}, {"g2", "o2", handleAck}, {"g1", "o1", handleNakOnce},
		{"g3", "o3", handleTerm}, {"g2", "o2", handleIgnore}, {"g3", "o3", handleNakAll},
	}
	plan := map[string]handling{}
	type sent struct {
		seq     uint64
		to, msg string
	}
	var members, peers []sent
	seqOf := func(env *wire.Envelope) uint64 { return lastSentTo(t, ctx, js, env.ReceiverID) }
	for _, msg := range messages {
		for _, to := range []string{msg.to, msg.peer} {
			env, err := client.Send(ctx, to, "work", nil)
			if err != nil {
				t.Fatal(err)
			}
			plan[env.MessageID] = msg.h
			s := sent{seqOf(env), to, env.MessageID}
			if to == msg.to {
				members = append(members, s)
			} else {
				peers = append(peers, s)
			}
		}
	}
	rctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { receive(rctx, t, plan, append(own, group)...) })
	t.Cleanup(func() { stop(); wg.Wait() })

	var rows [2][]store.Record
	eventually(t, 30*time.Second, "every row final", func() bool {
		for k, list := range [2][]sent{members, peers} {
			rows[k] = rows[k][:0]
			for _, s := range list {
				r, err := st.Get(ctx, store.Key{StreamSeq: s.seq, Consumer: s.to + "_normal"})
				if err != nil || r.Status == "" || r.SentAt.IsZero() {
					return false
				}
				rows[k] = append(rows[k], r)
			}
		}
		return true
	})
	for i := range messages {
		g, o := normalize(rows[0][i], members[i].to), normalize(rows[1][i], peers[i].to)
		gj, _ := json.Marshal(g)
		oj, _ := json.Marshal(o)
		if string(gj) != string(oj) {
			t.Errorf("message %d (%s): the member's row\n%s\ndiffers from the own consumer's\n%s", i, messages[i].h, gj, oj)
		}
	}
	want := map[handling]string{handleAck: store.StatusACK, handleNakOnce: store.StatusACK, handleTerm: store.StatusNACK,
		handleIgnore: store.StatusTimeout, handleNakAll: store.StatusTimeout}
	for i, r := range rows[0] {
		if r.Receiver != members[i].to || r.Priority != "normal" || r.Status != want[messages[i].h] {
			t.Errorf("member row %d/%s: receiver %q priority %q status %q; want %s, normal, %s",
				r.StreamSeq, r.Consumer, r.Receiver, r.Priority, r.Status, members[i].to, want[messages[i].h])
		}
		if r.Status == store.StatusACK && r.ProcessingTime <= 0 {
			t.Errorf("member row %d/%s: acked without an ack time", r.StreamSeq, r.Consumer)
		}
	}
	if r := rows[0][5]; !r.NakExhausted || r.Naks != 2 {
		t.Errorf("the member's NAK-exhausted row: %+v", r)
	}
	for _, g := range []string{"g1", "g2", "g3"} {
		rate := rateOf(t, st, g, "normal")
		if rate.Pending != 0 || rate.Resolved() == 0 {
			t.Errorf("%s: %+v; want its messages resolved", g, rate)
		}
	}

	// Events of the group about a message to an agent it does not host,
	// about a broadcast and about no message at all are ignored.
	ignored := func() float64 {
		v, err := metricstest.Value(api.URL+"/metrics", `ackmonitor_events_processed_total{kind="ignored"}`)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	before := ignored()
	outsider, err := client.Send(ctx, "outsider", "work", nil)
	if err != nil {
		t.Fatal(err)
	}
	outsiderSeq := seqOf(outsider)
	if _, err := client.Broadcast(ctx, "news", nil); err != nil {
		t.Fatal(err)
	}
	info, err := js.Stream(ctx, subjects.Default.Stream())
	if err != nil {
		t.Fatal(err)
	}
	last := info.CachedInfo().State.LastSeq
	for i, seq := range []uint64{outsiderSeq, last, last + 1000} {
		forgeEvent(t, js, subjects.EventTerminated, "host_group-normal", seq, "forged-"+string(rune('a'+i)))
	}
	eventually(t, 20*time.Second, "the forged events ignored", func() bool { return ignored() >= before+3 })
	// The members are no receivers without a consumer; the outsider,
	// whose message was sent after theirs and is checked after them, is.
	var unknown struct {
		Receivers []ackmonitor.UnknownReceiver `json:"unknown_receivers"`
	}
	eventually(t, 20*time.Second, "the outsider listed as a receiver without a consumer", func() bool {
		getJSON(t, api.URL+"/api/v1/unknown_receivers", &unknown)
		for _, u := range unknown.Receivers {
			if u.Receiver == "outsider" {
				return true
			}
		}
		return false
	})
	for _, u := range unknown.Receivers {
		if u.Receiver != "outsider" && u.Receiver != "director" { // the escalations' default director
			t.Errorf("%s listed as a receiver without a consumer", u.Receiver)
		}
	}
	r, err := st.Get(ctx, store.Key{StreamSeq: outsiderSeq, Consumer: "outsider_normal"})
	if err != nil || r.Status != "" || len(r.History) != 0 {
		t.Errorf("the outsider's row: %+v, %v; want pending without events", r, err)
	}
	if recs, err := st.Messages(ctx, store.Query{Receiver: "", Status: store.StatusNACK, Limit: 100}); err != nil {
		t.Fatal(err)
	} else {
		for _, r := range recs {
			if r.Consumer == "host_group-normal" || r.Receiver == "" || r.Receiver == "outsider" {
				t.Errorf("a row of no member: %+v", r)
			}
		}
	}
}

// forgeEvent publishes a consumer event of kind from consumer about the
// message at seq of the mesh stream, as the server would.
func forgeEvent(t *testing.T, js jetstream.JetStream, kind subjects.EventKind, consumer string, seq uint64, id string) {
	t.Helper()
	subj, err := subjects.EventSubject(kind, subjects.Default.Stream(), consumer)
	if err != nil {
		t.Fatal(err)
	}
	data, _ := json.Marshal(map[string]any{"id": id, "timestamp": time.Now().UTC(), "stream": subjects.Default.Stream(),
		"consumer": consumer, "stream_seq": seq, "deliveries": 1, "reason": "NOT_FOUND: forged"})
	if _, err := js.Publish(testCtx(t), subj, data); err != nil {
		t.Fatal(err)
	}
}

// TestGroups_AckFloorOfTheGroup: with ack sampling off, the ACKs of a
// group's members are inferred from the group consumer's ack floor, while
// a member's own (catch-up) consumer, which delivers what was stored
// before the member joined, still exists its floor is the one read: the
// group's is past the messages it has yet to deliver.
func TestGroups_AckFloorOfTheGroup(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	st := openStore(t, sqliteStore)
	ctx := testCtx(t)
	startMonitor(t, m.s, fastConfig(st))
	js := m.jetstream()
	client := m.agent("client", nil)
	send := func(to string) uint64 {
		t.Helper()
		env, err := client.Send(ctx, to, "work", nil)
		if err != nil {
			t.Fatal(err)
		}
		return lastSentTo(t, ctx, js, env.ReceiverID)
	}
	fetchAck := func(c jetstream.Consumer, n int) []uint64 {
		t.Helper()
		batch, err := c.FetchNoWait(n)
		if err != nil {
			t.Fatal(err)
		}
		var seqs []uint64
		for msg := range batch.Messages() {
			md, _ := msg.Metadata()
			seqs = append(seqs, md.Sequence.Stream)
			if err := msg.DoubleAck(ctx); err != nil {
				t.Fatal(err)
			}
		}
		return seqs
	}
	inferred := func(seq uint64, consumer string) bool {
		r, err := st.Get(ctx, store.Key{StreamSeq: seq, Consumer: consumer})
		return err == nil && r.InferredAck() && r.ProcessingTime == 0 && !r.SentAt.IsZero()
	}

	// c1 joins the group once the group is past its first message, which
	// its catch-up consumer delivers.
	group := groupConsumer(t, js, "host", "", "a1")
	catchUp := directConsumer(t, js, "c1", "")
	before, first := send("c1"), send("a1")
	deliveries := func(n int) []uint64 {
		t.Helper()
		var got []uint64
		eventually(t, 10*time.Second, "the group's deliveries", func() bool {
			got = append(got, fetchAck(group, 10)...)
			return len(got) >= n
		})
		return got
	}
	if got := deliveries(1); len(got) != 1 || got[0] != first {
		t.Fatalf("the group delivered %v; want %d", got, first)
	}
	groupConsumer(t, js, "host", "", "a1", "c1")
	after, member := send("c1"), send("a1")
	if got := deliveries(2); len(got) != 2 || got[0] != after || got[1] != member {
		t.Fatalf("the group delivered %v; want %d and %d", got, after, member)
	}
	eventually(t, 20*time.Second, "a1's ACK inferred from the group's floor", func() bool { return inferred(member, "a1_normal") })
	if r, err := st.Get(ctx, store.Key{StreamSeq: after, Consumer: "c1_normal"}); err != nil || r.Status != "" {
		t.Errorf("c1's message the group acked, while c1's catch-up consumer is behind: %+v, %v; want pending", r, err)
	}
	if got := fetchAck(catchUp, 1); len(got) != 1 || got[0] != before {
		t.Fatalf("the catch-up consumer delivered %v; want %d", got, before)
	}
	if err := js.DeleteConsumer(ctx, subjects.Default.Stream(), "c1_normal"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "c1's ACKs inferred", func() bool {
		return inferred(before, "c1_normal") && inferred(after, "c1_normal")
	})
	for _, agent := range []string{"a1", "c1"} {
		if r := rateOf(t, st, agent, "normal"); r.Pending != 0 || r.Acked == 0 || r.Nacked+r.TimedOut != 0 {
			t.Errorf("%s: %+v; want only ACKs", agent, r)
		}
	}
}

// TestGroups_CatchUpsMessagesAreNotTheGroups: when an agent joins a group,
// the group's consumer may be given messages the agent's catch-up
// consumer delivers (up to the sequence in its metadata), which the
// group acks unread. Those events are not the message's outcome: the
// catch-up's TERM stays the row's, while the group's events about later
// messages are the member's.
func TestGroups_CatchUpsMessagesAreNotTheGroups(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	st := openStore(t, sqliteStore)
	ctx := testCtx(t)
	startMonitor(t, m.s, fastConfig(st))
	js := m.jetstream()
	client := m.agent("client", nil)
	send := func() uint64 {
		t.Helper()
		if _, err := client.Send(ctx, "late", "work", nil); err != nil {
			t.Fatal(err)
		}
		mesh, err := js.Stream(ctx, subjects.Default.Stream())
		if err != nil {
			t.Fatal(err)
		}
		return mesh.CachedInfo().State.LastSeq
	}
	fetchOne := func(c jetstream.Consumer) jetstream.Msg {
		t.Helper()
		batch, err := c.Fetch(1, jetstream.FetchMaxWait(10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for msg := range batch.Messages() {
			return msg
		}
		t.Fatalf("%s delivered nothing: %v", c.CachedInfo().Name, batch.Error())
		return nil
	}
	row := func(seq uint64) store.Record {
		r, _ := st.Get(ctx, store.Key{StreamSeq: seq, Consumer: "late_normal"})
		return r
	}

	groupConsumer(t, js, "host", "100", "g1")
	early := send()
	// late joins as agentkit has it: the group's filters first, then its
	// catch-up up to the stream's last sequence.
	group := groupConsumer(t, js, "host", "100", "g1", "late")
	cfg, err := agentkit.ConsumerConfig(subjects.Default, "late", wire.PriorityNormal, groupPolicy)
	if err != nil {
		t.Fatal(err)
	}
	cfg.SampleFrequency, cfg.Metadata = "", map[string]string{subjects.CatchUpKey: strconv.FormatUint(early, 10)}
	catchUp, err := js.CreateOrUpdateConsumer(ctx, subjects.Default.Stream(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := fetchOne(catchUp).TermWithReason("NOT_FOUND: no such order"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "the catch-up's TERM written", func() bool { return row(early).Status == store.StatusNACK })
	// The group is given the catch-up's message too and acks it unread.
	if msg := fetchOne(group); streamSeqOf(t, msg) != early {
		t.Fatalf("the group delivered %d first, want %d", streamSeqOf(t, msg), early)
	} else if err := msg.DoubleAck(ctx); err != nil {
		t.Fatal(err)
	}
	later := send()
	if msg := fetchOne(group); streamSeqOf(t, msg) != later {
		t.Fatalf("the group delivered %d, want %d", streamSeqOf(t, msg), later)
	} else if err := msg.DoubleAck(ctx); err != nil {
		t.Fatal(err)
	}
	// The group's events are written in order: its ACK of early first.
	eventually(t, 20*time.Second, "the group's ACK of the later message", func() bool {
		r := row(later)
		return r.Status == store.StatusACK && r.ProcessingTime > 0
	})
	r := row(early)
	if r.Status != store.StatusNACK || len(r.History) != 1 || r.History[0].Kind != store.EventTerm {
		t.Errorf("the catch-up's message: status %s, history %+v; want the catch-up's TERM alone", r.Status, r.History)
	}
}

// streamSeqOf returns msg's sequence in its stream.
func streamSeqOf(t *testing.T, msg jetstream.Msg) uint64 {
	t.Helper()
	md, err := msg.Metadata()
	if err != nil {
		t.Fatal(err)
	}
	return md.Sequence.Stream
}

// TestGroups_AgentkitGroup runs agents in agentkit's Group, one of which
// was sent messages before it joined (its catch-up delivers them): every
// row is its receiver's, with the handler's outcome, and no member is a
// receiver without a consumer.
func TestGroups_AgentkitGroup(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	st := openStore(t, sqliteStore)
	ctx := testCtx(t)
	mon := startMonitor(t, m.s, fastConfig(st))
	api := httptest.NewServer(mon.Handler())
	t.Cleanup(api.Close)
	client := m.agent("client", nil)
	g, err := agentkit.NewGroup(m.conn(), "proc")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Close) // after the agents' Stop, registered later
	handlers := map[string]agentkit.HandlerFunc{
		"ok":     func(context.Context, *agentkit.Message) error { return nil },
		"reject": func(context.Context, *agentkit.Message) error { return agentkit.Reject(wire.CodeRejected, "no") },
	}
	send := func(to, action string, n int) {
		t.Helper()
		for range n {
			if _, err := client.Send(ctx, to, action, nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	m.agent("w1", handlers, agentkit.WithGroup(g))
	m.agent("w2", handlers, agentkit.WithGroup(g))
	send("w3", "ok", 3) // before w3 joins: its catch-up's
	send("w3", "reject", 1)
	m.agent("w3", handlers, agentkit.WithGroup(g))
	send("w1", "ok", 3)
	send("w2", "reject", 2)
	send("w3", "ok", 2)
	send("outsider", "ok", 1) // checked after the members' sends

	// ACKs and NACKs of each member.
	want := map[string][2]int64{"w1": {3, 0}, "w2": {0, 2}, "w3": {5, 1}}
	eventually(t, 30*time.Second, "every member's rows resolved", func() bool {
		for id, w := range want {
			r := rateOf(t, st, id, "normal")
			if r.Acked != w[0] || r.Nacked != w[1] || r.Pending != 0 {
				return false
			}
		}
		return true
	})
	for id, w := range want {
		if r := rateOf(t, st, id, "normal"); r.TimedOut+r.Invalid != 0 || r.Sent != w[0]+w[1] {
			t.Errorf("%s: %+v; want %d sent, %d ACKs and %d NACKs", id, r, w[0]+w[1], w[0], w[1])
		}
		recs, err := st.Messages(ctx, store.Query{Receiver: id, Limit: 100})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range recs {
			if r.Consumer != id+"_normal" {
				t.Errorf("%s's row %d is keyed by %s", id, r.StreamSeq, r.Consumer)
			}
		}
	}
	var unknown struct {
		Receivers []ackmonitor.UnknownReceiver `json:"unknown_receivers"`
	}
	eventually(t, 20*time.Second, "the outsider listed", func() bool {
		getJSON(t, api.URL+"/api/v1/unknown_receivers", &unknown)
		return slices.ContainsFunc(unknown.Receivers, func(u ackmonitor.UnknownReceiver) bool { return u.Receiver == "outsider" })
	})
	for _, u := range unknown.Receivers {
		// w3 had no consumer when it was first sent messages: listed or
		// not, depending on when it joined.
		if u.Receiver == "w1" || u.Receiver == "w2" {
			t.Errorf("member %s listed as a receiver without a consumer", u.Receiver)
		}
	}
}

// lastSentTo returns the stream sequence of the last normal-priority
// direct message "client" sent to receiver.
func lastSentTo(t *testing.T, ctx context.Context, js jetstream.JetStream, receiver string) uint64 {
	t.Helper()
	mesh, err := js.Stream(ctx, subjects.Default.Stream())
	if err != nil {
		t.Fatal(err)
	}
	subj, _ := subjects.Default.Direct(receiver, "normal", "client")
	msg, err := mesh.GetLastMsgForSubject(ctx, subj)
	if err != nil {
		t.Fatal(err)
	}
	return msg.Sequence
}
