package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/auth"
	"github.com/agentmesh-io/agentmesh/internal/natstest"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// The hostile-peer harness: an embedded server with the per-agent
// authorization auth generates, provisioned by its admin; agents on their
// own connections and credentials; the consumer events (TERM, NAK,
// MAX_DELIVERIES advisories and ack metrics) of the message stream,
// captured by the admin; and a ledger of what the handlers saw.

// hostileMesh is the server, its authorization and the admin's view.
type hostileMesh struct {
	t       *testing.T
	s       *server.Server
	b       *auth.Bundle
	admin   *nats.Conn
	adminJS jetstream.JetStream
	events  *hostileEvents
}

// newHostileMesh starts a server with the authorization of specs
// (payload store rights on) and provisions the stream, every agent's
// consumers with policies, and the payload store.
func newHostileMesh(t *testing.T, specs []auth.AgentSpec, policies map[wire.Priority]agentkit.DeliveryPolicy) *hostileMesh {
	t.Helper()
	b, err := auth.Generate(specs, auth.Options{Payloads: true})
	if err != nil {
		t.Fatalf("auth.Generate: %v", err)
	}
	s := natstest.RunServer(t, func(o *server.Options) {
		if err := o.ProcessConfigString(b.ServerConfig()); err != nil {
			t.Fatalf("server config: %v", err)
		}
	})
	m := &hostileMesh{t: t, s: s, b: b}
	m.admin = m.connect(b.Admin().Name)
	if m.adminJS, err = jetstream.New(m.admin); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := auth.Provision(ctx, m.adminJS, b.Options.Scheme, b.Specs(), auth.ProvisionOptions{Policies: policies, Payloads: true}); err != nil {
		t.Fatalf("Provision: %v", err)
	}
	m.events = m.watchEvents()
	return m
}

// connect connects as user name with its own credentials.
func (m *hostileMesh) connect(name string, extra ...nats.Option) *nats.Conn {
	m.t.Helper()
	u, ok := m.b.User(name)
	if !ok {
		m.t.Fatalf("no user %q", name)
	}
	opts, err := u.Credentials.Options()
	if err != nil {
		m.t.Fatal(err)
	}
	return natstest.Connect(m.t, m.s, append(opts, extra...)...)
}

// consumerIdle reports whether consumer name has nothing pending and
// nothing waiting for an ack, and its info.
func (m *hostileMesh) consumerInfo(ctx context.Context, name string) (*jetstream.ConsumerInfo, error) {
	c, err := m.adminJS.Consumer(ctx, subjects.Default.Stream(), name)
	if err != nil {
		return nil, err
	}
	return c.Info(ctx)
}

// hostileEvent is one consumer event of the message stream.
type hostileEvent struct {
	Kind       subjects.EventKind
	Consumer   string
	StreamSeq  uint64 `json:"stream_seq"`
	Deliveries uint64 `json:"deliveries"`
	Reason     string `json:"reason"`
}

// hostileEvents records the events, indexed by consumer and stream sequence.
type hostileEvents struct {
	mu    sync.Mutex
	n     int
	byKey map[hostileDelivery][]hostileEvent
}

// hostileDelivery is one message (by stream sequence) at one consumer.
type hostileDelivery struct {
	consumer string
	seq      uint64
}

func (m *hostileMesh) watchEvents() *hostileEvents {
	m.t.Helper()
	ev := &hostileEvents{byKey: map[hostileDelivery][]hostileEvent{}}
	for _, subj := range subjects.Default.EventFilters() {
		if _, err := m.admin.Subscribe(subj, func(msg *nats.Msg) {
			e, err := subjects.ParseEvent(msg.Subject)
			if err != nil {
				return
			}
			var h hostileEvent
			if err := json.Unmarshal(msg.Data, &h); err != nil {
				return
			}
			h.Kind, h.Consumer = e.Kind, e.Consumer
			ev.mu.Lock()
			ev.n++
			k := hostileDelivery{h.Consumer, h.StreamSeq}
			ev.byKey[k] = append(ev.byKey[k], h)
			ev.mu.Unlock()
		}); err != nil {
			m.t.Fatal(err)
		}
	}
	if err := m.admin.Flush(); err != nil {
		m.t.Fatal(err)
	}
	return ev
}

// of returns the events of one delivery.
func (e *hostileEvents) of(d hostileDelivery) []hostileEvent {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.byKey[d])
}

// count returns how many events arrived (a progress measure).
func (e *hostileEvents) count() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.n
}

// deliveriesOf returns every delivery with an event of seq.
func (e *hostileEvents) deliveriesOf(seq uint64) []hostileDelivery {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []hostileDelivery
	for k := range e.byKey {
		if k.seq == seq {
			out = append(out, k)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].consumer < out[j].consumer })
	return out
}

// terms counts the TERM advisories whose reason starts with prefix, over
// the consumers in names.
func (e *hostileEvents) terms(prefix string, names map[string]bool) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for k, evs := range e.byKey {
		if !names[k.consumer] {
			continue
		}
		for _, ev := range evs {
			if ev.Kind == subjects.EventTerminated && strings.HasPrefix(ev.Reason, prefix) {
				n++
			}
		}
	}
	return n
}

// hostileLedger records what the handlers saw: good messages by receiver
// and message id, every handled message by receiver and stream sequence,
// and handler calls with an envelope the runtime should not have passed.
type hostileLedger struct {
	mu         sync.Mutex
	good       map[string]int            // "<receiver>/<message id>"
	seqs       map[string]map[uint64]int // receiver → stream sequence → calls
	violations []string
	calls      atomic.Int64
}

func newHostileLedger() *hostileLedger {
	return &hostileLedger{good: map[string]int{}, seqs: map[string]map[uint64]int{}}
}

// handler returns the "work" handler of agent self, which accepts
// envelopes up to maxEnvelope bytes.
func (l *hostileLedger) handler(self string, maxEnvelope int, hostile string) agentkit.HandlerFunc {
	return func(_ context.Context, m *agentkit.Message) error {
		problem := hostileEnvelopeProblem(self, m, maxEnvelope)
		l.mu.Lock()
		defer l.mu.Unlock()
		l.calls.Add(1)
		if problem != "" {
			l.violations = append(l.violations, fmt.Sprintf("%s handled stream seq %d on %s: %s", self, m.StreamSeq, clipText(m.Subject, 80), problem))
		}
		if l.seqs[self] == nil {
			l.seqs[self] = map[uint64]int{}
		}
		l.seqs[self][m.StreamSeq]++
		if m.SenderID != hostile {
			l.good[self+"/"+m.MessageID]++
		}
		return nil
	}
}

// handledSeq returns how often receiver's handler ran for stream seq.
func (l *hostileLedger) handledSeq(receiver string, seq uint64) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.seqs[receiver][seq]
}

func (l *hostileLedger) goodCount(key string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.good[key]
}

func (l *hostileLedger) snapshot() (good map[string]int, violations []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	good = make(map[string]int, len(l.good))
	for k, v := range l.good {
		good[k] = v
	}
	return good, slices.Clone(l.violations)
}

// hostileEnvelopeProblem returns what is wrong with a message a handler
// of self received, or "": the runtime promises a valid envelope whose
// sender, priority and receiver (or topic) agree with its subject, no
// larger than the agent's limit.
func hostileEnvelopeProblem(self string, m *agentkit.Message, maxEnvelope int) string {
	if m.Envelope == nil {
		return "nil envelope"
	}
	if err := m.Envelope.Validate(); err != nil {
		return "invalid envelope: " + clipText(err.Error(), 200)
	}
	sub, err := subjects.Default.Parse(m.Subject)
	if err != nil {
		return "subject: " + clipText(err.Error(), 200)
	}
	switch {
	case sub.Sender != m.SenderID:
		return fmt.Sprintf("sender_id %q on a subject of %q", clipText(m.SenderID, 80), sub.Sender)
	case sub.Priority != string(m.Priority):
		return fmt.Sprintf("priority %q on a subject of %q", m.Priority, sub.Priority)
	}
	switch sub.Kind {
	case subjects.KindDirect:
		if m.ReceiverID != self || sub.Receiver != self {
			return fmt.Sprintf("receiver_id %q on subject receiver %q", clipText(m.ReceiverID, 80), sub.Receiver)
		}
	case subjects.KindTopic:
		if m.Topic != sub.Topic {
			return fmt.Sprintf("topic %q on subject topic %q", clipText(m.Topic, 80), sub.Topic)
		}
	case subjects.KindBroadcast:
		if m.ReceiverID != "" || m.Topic != "" {
			return "a broadcast naming a receiver or topic"
		}
	default:
		return "subject kind " + string(sub.Kind)
	}
	data, err := m.Envelope.Encode()
	if err != nil {
		return "does not encode: " + clipText(err.Error(), 200)
	}
	if len(data) > maxEnvelope {
		return fmt.Sprintf("envelope of %d bytes above the agent's %d byte limit", len(data), maxEnvelope)
	}
	return ""
}

// hostileVictim is an agent under attack, with what happened to its
// connection.
type hostileVictim struct {
	id    string
	nc    *nats.Conn
	agent *agentkit.Agent

	mu          sync.Mutex
	connEvents  []string // disconnects and closes, with the error
	asyncErrors []string
}

func (v *hostileVictim) note(list *[]string, s string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if len(*list) < 50 {
		*list = append(*list, clipText(s, 300))
	}
}

func (v *hostileVictim) connProblems() []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return slices.Clone(v.connEvents)
}

// connOptions record v's disconnects and closes.
func (v *hostileVictim) connOptions() []nats.Option {
	return []nats.Option{
		nats.DisconnectErrHandler(func(nc *nats.Conn, err error) {
			v.note(&v.connEvents, fmt.Sprintf("disconnected: %v (last error %v)", err, nc.LastError()))
		}),
		nats.ClosedHandler(func(nc *nats.Conn) {
			v.note(&v.connEvents, fmt.Sprintf("closed (last error %v)", nc.LastError()))
		}),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			v.note(&v.asyncErrors, err.Error())
		}),
	}
}

// alive returns why v no longer holds its connection or consumes, or "".
func (v *hostileVictim) alive() string {
	var why []string
	if !v.nc.IsConnected() {
		why = append(why, "connection "+v.nc.Status().String())
	}
	if n := v.nc.Stats().Reconnects; n > 0 {
		why = append(why, fmt.Sprintf("%d reconnects", n))
	}
	select {
	case <-v.agent.Closed():
		why = append(why, "agent stopped (Closed fired)")
	default:
	}
	if err := v.agent.Err(); err != nil {
		why = append(why, "Err(): "+clipText(err.Error(), 200))
	}
	if ev := v.connProblems(); len(ev) > 0 {
		why = append(why, "connection events: "+strings.Join(ev, "; "))
	}
	return strings.Join(why, ", ")
}

// hostileFilterMatch reports whether a consumer filter matches subject,
// taking the subject's tokens literally.
func hostileFilterMatch(filter, subject string) bool {
	f, s := strings.Split(filter, "."), strings.Split(subject, ".")
	for i, tok := range f {
		if tok == ">" {
			return len(s) > i
		}
		if i >= len(s) || tok != "*" && tok != s[i] {
			return false
		}
	}
	return len(f) == len(s)
}

// clipText shortens s for a table or a message.
func clipText(s string, n int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	s = strings.NewReplacer("\r", `\r`, "\n", `\n`, "\t", `\t`).Replace(s)
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !isRuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + fmt.Sprintf("…(%d bytes)", len(s))
}

func isRuneStart(b byte) bool { return b&0xC0 != 0x80 }

// hostileWait polls cond until it returns "" (done), the budget is spent,
// or progress has not changed for stall; it returns cond's last answer.
// Each poll is a real check of the broker's or the ledger's state; the
// ticker only paces them.
func hostileWait(budget, stall time.Duration, progress func() string, cond func() string) string {
	deadline := time.Now().Add(budget)
	last, lastChange := progress(), time.Now()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		why := cond()
		if why == "" {
			return ""
		}
		now := time.Now()
		if p := progress(); p != last {
			last, lastChange = p, now
		}
		switch {
		case now.After(deadline):
			return fmt.Sprintf("budget of %v spent: %s", budget, why)
		case now.Sub(lastChange) > stall:
			return fmt.Sprintf("no progress for %v: %s", stall, why)
		}
		<-tick.C
	}
}

// publishOutcome classifies a refused publish.
func publishRefusal(err error) string {
	var apiErr *jetstream.APIError
	switch {
	case errors.Is(err, auth.ErrPermissionDenied):
		var pe *auth.PermissionError
		if errors.As(err, &pe) {
			return "permissions (" + clipText(pe.Subject, 60) + ")"
		}
		return "permissions"
	case errors.As(err, &apiErr):
		return fmt.Sprintf("stream: %s (%d)", apiErr.Description, apiErr.ErrorCode)
	case errors.Is(err, nats.ErrMaxPayload):
		return "client: maximum payload exceeded"
	default:
		return "error: " + clipText(err.Error(), 120)
	}
}
