package agentkit_test

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/internal/natstest"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// fastPolicy is a short delivery policy so redelivery tests finish quickly.
func fastPolicy(backoff ...time.Duration) agentkit.DeliveryPolicy {
	return agentkit.DeliveryPolicy{BackOff: backoff, MaxDeliver: len(backoff), ProcessingLimit: 10 * time.Second, Prefetch: 16, MaxAckPending: 1000}
}

// mesh is one embedded JetStream server with helpers to run agents on it.
type mesh struct {
	t *testing.T
	s *server.Server
}

func newMesh(t *testing.T) *mesh {
	t.Helper()
	return &mesh{t: t, s: natstest.RunServer(t)}
}

func (m *mesh) conn() *nats.Conn { return natstest.Connect(m.t, m.s) }

// agent creates an agent on its own connection; register handlers, then start.
func (m *mesh) agent(id string, opts ...agentkit.Option) *agentkit.Agent {
	m.t.Helper()
	a, err := agentkit.New(m.conn(), id, opts...)
	if err != nil {
		m.t.Fatalf("New(%q): %v", id, err)
	}
	m.t.Cleanup(a.Stop)
	return a
}

// started creates an agent with handlers and starts it.
func (m *mesh) started(id string, handlers map[string]agentkit.HandlerFunc, opts ...agentkit.Option) *agentkit.Agent {
	m.t.Helper()
	a := m.agent(id, opts...)
	for action, h := range handlers {
		if err := a.Handle(action, h); err != nil {
			m.t.Fatal(err)
		}
	}
	if err := a.Start(ctx(m.t)); err != nil {
		m.t.Fatalf("Start(%q): %v", id, err)
	}
	return a
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

// eventually polls cond until it holds or d passes.
var eventually = natstest.Eventually

// advisory is a consumer advisory captured from the server.
type advisory struct {
	Kind       subjects.EventKind
	Consumer   string
	StreamSeq  uint64 `json:"stream_seq"`
	Deliveries uint64 `json:"deliveries"`
	Reason     string `json:"reason"`
}

// advisories records the NAK, TERM and MAX_DELIVERIES advisories and ack
// metrics of the MESH stream's consumers.
type advisories struct {
	mu  sync.Mutex
	got []advisory
}

func (m *mesh) watchAdvisories() *advisories {
	m.t.Helper()
	a := &advisories{}
	nc := m.conn()
	for _, subj := range subjects.Default.EventsSubjects() {
		_, err := nc.Subscribe(subj, func(msg *nats.Msg) {
			ev, err := subjects.ParseEvent(msg.Subject)
			if err != nil {
				return
			}
			var adv advisory
			if err := json.Unmarshal(msg.Data, &adv); err != nil {
				m.t.Errorf("advisory %s: %v", msg.Subject, err)
				return
			}
			adv.Kind, adv.Consumer = ev.Kind, ev.Consumer
			a.mu.Lock()
			a.got = append(a.got, adv)
			a.mu.Unlock()
		})
		if err != nil {
			m.t.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		m.t.Fatal(err)
	}
	return a
}

// of returns the advisories of kind for stream sequence seq (0: any).
func (a *advisories) of(kind subjects.EventKind, seq uint64) []advisory {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []advisory
	for _, adv := range a.got {
		if adv.Kind == kind && (seq == 0 || adv.StreamSeq == seq) {
			out = append(out, adv)
		}
	}
	return out
}

// recorder is a handler that records what it handled.
type recorder struct {
	mu   sync.Mutex
	msgs []*agentkit.Message
	at   []time.Time
}

func (r *recorder) handle(err error) agentkit.HandlerFunc {
	return func(_ context.Context, m *agentkit.Message) error {
		r.mu.Lock()
		r.msgs = append(r.msgs, m)
		r.at = append(r.at, time.Now())
		r.mu.Unlock()
		return err
	}
}

func (r *recorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.msgs)
}

func (r *recorder) ids() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	ids := map[string]int{}
	for _, m := range r.msgs {
		ids[m.MessageID]++
	}
	return ids
}
