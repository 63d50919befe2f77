package conformance

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
)

// The test actions an agent under test implements (PROTOCOL.md,
// "Conformance kit").
const (
	// ActionEcho answers a request with a response of action
	// conformance.echo whose payload is the request's payload; a
	// notification is acked with no answer.
	ActionEcho = "conformance.echo"
	// ActionReject rejects the message (not retryable) with the code and
	// message of its payload {"code": "<CODE>", "message": "<text>"}.
	ActionReject = "conformance.reject"
)

// Config says which agent to check and how to reach it.
type Config struct {
	// Conn is the connection the kit uses. When nil the kit connects to
	// URL with Options and closes the connection at the end.
	Conn    *nats.Conn
	URL     string
	Options []nats.Option
	// AgentID is the id of the agent under test.
	AgentID string
	// Prefix is the mesh's subject prefix. Default: "mesh".
	Prefix string
	// KitID is the agent id the kit sends as. Default: "conformance-kit-"
	// and a random suffix, so two runs never read each other's replies.
	KitID string
	// Timeout bounds each wait for an answer or an advisory. Default: 10s.
	Timeout time.Duration
	// StartTimeout bounds the wait for the agent's consumers and registry
	// record before the checks start. Default: 30s.
	StartTimeout time.Duration
	// HeartbeatTimeout bounds the wait for a registry renewal: more than
	// the agent's heartbeat interval. Default: 20s (agentkit beats every 5s).
	HeartbeatTimeout time.Duration
}

var (
	tokenRE  = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)
	prefixRE = regexp.MustCompile(`^[a-z][a-z0-9_]{0,31}$`)
)

func (c *Config) fill() error {
	if c.Prefix == "" {
		c.Prefix = "mesh"
	}
	if c.KitID == "" {
		c.KitID = "conformance-kit-" + nuid.Next()
	}
	if c.Timeout <= 0 {
		c.Timeout = 10 * time.Second
	}
	if c.StartTimeout <= 0 {
		c.StartTimeout = 30 * time.Second
	}
	if c.HeartbeatTimeout <= 0 {
		c.HeartbeatTimeout = 20 * time.Second
	}
	if !prefixRE.MatchString(c.Prefix) {
		return fmt.Errorf("conformance: invalid prefix %q", c.Prefix)
	}
	for _, id := range []string{c.AgentID, c.KitID} {
		if !tokenRE.MatchString(id) {
			return fmt.Errorf("conformance: invalid agent id %q", id)
		}
	}
	if c.AgentID == c.KitID {
		return errors.New("conformance: the kit's id must differ from the agent's")
	}
	if c.Conn == nil && c.URL == "" {
		return errors.New("conformance: neither Conn nor URL set")
	}
	return nil
}

// priorities are the priority tokens, highest first (PROTOCOL.md §2).
var priorities = []string{"critical", "high", "normal", "low", "batch"}

// Run checks the agent cfg.AgentID, one subtest per behaviour. The agent
// must be running (Run waits cfg.StartTimeout for its consumers and
// registry record).
func Run(t *testing.T, cfg Config) {
	t.Helper()
	if err := cfg.fill(); err != nil {
		t.Fatal(err)
	}
	nc := cfg.Conn
	if nc == nil {
		var err error
		nc, err = nats.Connect(cfg.URL, cfg.Options...)
		if err != nil {
			t.Fatalf("conformance: connect to %s: %v", cfg.URL, err)
		}
		t.Cleanup(nc.Close)
	}
	p, err := newPeer(nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.close)
	if err := p.awaitAgent(t.Context()); err != nil {
		t.Fatal(err)
	}

	t.Run("checks", func(t *testing.T) {
		for _, c := range checks {
			t.Run(c.name, func(t *testing.T) {
				t.Parallel()
				c.run(t, p)
			})
		}
	})
	// Last, when every other check has had its answers: nothing may have
	// answered what must go unanswered.
	t.Run("Unanswered", func(t *testing.T) { checkUnanswered(t, p) })
}

// peer is the kit's side of the mesh: its connection, what it watches
// and the names it uses.
type peer struct {
	cfg    Config
	nc     *nats.Conn
	js     jetstream.JetStream
	stream string
	sent   *collector // every direct message the agent sends
	events *events    // TERM, NAK, MAX_DELIVERIES advisories and ack metrics of the agent's consumers
	mute   *muteList  // messages that must not be answered, or only in one way
}

func newPeer(nc *nats.Conn, cfg Config) (*peer, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("conformance: jetstream: %w", err)
	}
	p := &peer{cfg: cfg, nc: nc, js: js, stream: strings.ToUpper(cfg.Prefix), mute: &muteList{}}
	p.events, err = watchEvents(nc, p.stream, cfg.AgentID)
	if err != nil {
		return nil, err
	}
	return p, nil
}

// awaitAgent waits until the agent's five direct consumers exist, then
// starts reading what the agent sends (the stream exists by then).
func (p *peer) awaitAgent(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.StartTimeout)
	defer cancel()
	for _, prio := range priorities {
		name := p.consumer(prio)
		if err := poll(ctx, func() bool {
			_, err := p.js.Consumer(ctx, p.stream, name)
			return err == nil
		}); err != nil {
			return fmt.Errorf("conformance: agent %s: consumer %s on stream %s did not appear within %v", p.cfg.AgentID, name, p.stream, p.cfg.StartTimeout)
		}
	}
	var err error
	p.sent, err = watchSent(ctx, p.js, p.stream, p.cfg.Prefix+".agent.*.*."+p.cfg.AgentID)
	return err
}

func (p *peer) close() {
	if p.sent != nil {
		p.sent.stop()
	}
	p.events.stop()
}

// consumer returns the agent's direct consumer at prio.
func (p *peer) consumer(prio string) string { return p.cfg.AgentID + "_" + prio }

// direct returns the subject of a direct message from sender to receiver.
func (p *peer) direct(receiver, prio, sender string) string {
	return p.cfg.Prefix + ".agent." + receiver + "." + prio + "." + sender
}

// toAgent returns the subject of the kit's direct message to the agent.
func (p *peer) toAgent(prio string) string { return p.direct(p.cfg.AgentID, prio, p.cfg.KitID) }

// poll calls cond every 25ms until it holds or ctx ends.
func poll(ctx context.Context, cond func() bool) error {
	tick := time.NewTicker(25 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
	return nil
}
