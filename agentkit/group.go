package agentkit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// Group is the direct delivery that the agents one process hosts share:
// one durable consumer per priority ("<group>_group-<priority>") whose
// filters list the direct subjects of every agent that joined, read by one
// goroutine per priority that hands each message to its receiver's
// runtime. A server's work per stored message and per idle pull grows
// with its consumers, so a process hosting hundreds of agents costs the
// server five consumers instead of five per agent.
//
// An agent joins with [WithGroup]: its Start adds its direct subjects to
// the group's consumers, and from then on the group delivers its direct
// messages. Broadcasts and topic messages stay on the agent's own fan-out
// consumers. Membership is durable, like a consumer: an agent that stops
// stays in the filters, and its messages arriving while it is not running
// in this process are held (kept alive) for one ack timeout of their
// priority, then given back (NAK, delayed by that timeout) for another
// instance of the group; every instance of a group should host the same
// agents. Messages an agent was sent before it first joined are delivered
// by its own consumer "<agent>_<priority>", which catches up to the point
// where the group took over and is then deleted.
//
// Members that register leave their liveness to the group: it renews one
// registry record per heartbeat for all of them ([registry.Host]), and a
// member renews its own record only every ten heartbeats.
//
// The feeds pull only while the members hold fewer than the group's
// buffer of received messages waiting for a worker ([WithGroupBuffer]):
// a backlog stays in the stream. Agents of a group share their direct
// consumers' ack timeouts, attempts, ack-pending window and that buffer:
// they must use the same delivery policies, and a backlog of one member
// held by the runtime counts against those of all. Create it with
// [NewGroup]; close it with [Group.Close] after its agents have stopped.
type Group struct {
	name          string
	js            jetstream.JetStream
	scheme        subjects.Scheme
	maxAckPending int
	buffer        int // see WithGroupBuffer
	logger        *slog.Logger
	onError       func(error)

	// held counts the messages in the members' inboxes, which the feeds
	// keep below buffer (see room); every routed message changes it, so
	// it takes no lock.
	held atomic.Int64

	joinMu sync.Mutex // one filter update at a time

	mu         sync.Mutex
	stream     jetstream.Stream                 // set once the group has loaded
	filters    map[wire.Priority][]string       // the member ids in each consumer's filters
	own        map[string]bool                  // the names of agents' own direct consumers
	policies   map[wire.Priority]DeliveryPolicy // the members' shared policies
	members    map[string]*member               // the agents started in this process
	joining    []*joinReq                       // the joins the next round takes
	feeds      map[wire.Priority]*feed
	parked     map[*parkedMsg]struct{} // messages for agents not running here
	closed     bool
	roomSignal chan struct{} // wakes feeds waiting for room
	done       chan struct{} // closed by Close: ends the park keeper
	host       hosting       // the members' registry liveness
	keeper     sync.WaitGroup
}

// member is one started agent of the group: its receiver's inbox per
// priority, and per priority the last stream sequence its catch-up
// delivers, which the group acks unread.
type member struct {
	inboxes map[wire.Priority]*inbox
	skip    map[wire.Priority]uint64
}

// GroupOption configures a [Group].
type GroupOption func(*Group) error

// WithGroupScheme sets the naming scheme of the group's consumers; its
// agents must use the same (see [WithScheme]). The default is
// [subjects.Default].
func WithGroupScheme(s subjects.Scheme) GroupOption {
	return func(g *Group) error { g.scheme = s; return nil }
}

// WithGroupMaxAckPending sets how many messages the group's consumer of a
// priority may have delivered and unacknowledged at once, across its
// agents. The default is 10,000.
func WithGroupMaxAckPending(n int) GroupOption {
	return func(g *Group) error {
		if n < 1 {
			return fmt.Errorf("%w: group max ack pending %d is below 1", ErrInvalidOption, n)
		}
		g.maxAckPending = n
		return nil
	}
}

// WithGroupBuffer sets how many messages the group's agents may hold in
// their inboxes, received and waiting for a worker, before its feeds stop
// pulling more: the server keeps the rest. The default is 1,024.
func WithGroupBuffer(n int) GroupOption {
	return func(g *Group) error {
		if n < 1 {
			return fmt.Errorf("%w: group buffer %d is below 1", ErrInvalidOption, n)
		}
		g.buffer = n
		return nil
	}
}

// WithGroupLogger sets the logger of the group's background errors (see
// [WithGroupErrorHandler]); by default, as an agent's, it discards them.
func WithGroupLogger(l *slog.Logger) GroupOption {
	return func(g *Group) error {
		if l == nil {
			return fmt.Errorf("%w: nil logger", ErrInvalidOption)
		}
		g.logger = l
		return nil
	}
}

// WithGroupErrorHandler sets the function told of the group's background
// errors (a consumer the server turns away, a failed InProgress); by
// default they are logged (see [WithGroupLogger]).
func WithGroupErrorHandler(f func(error)) GroupOption {
	return func(g *Group) error { g.onError = f; return nil }
}

// NewGroup returns the group name (a subject token, like an agent id)
// over nc. It never dials and starts no goroutine until an agent joins.
func NewGroup(nc *nats.Conn, name string, opts ...GroupOption) (*Group, error) {
	if nc == nil {
		return nil, fmt.Errorf("%w: nil *nats.Conn", ErrInvalidOption)
	}
	if err := subjects.ValidateToken("group", name); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidID, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("agentkit: jetstream: %w", err)
	}
	g := &Group{name: name, js: js, scheme: subjects.Default, maxAckPending: 10_000, buffer: 1024, logger: slog.New(slog.DiscardHandler),
		filters: map[wire.Priority][]string{}, own: map[string]bool{}, policies: map[wire.Priority]DeliveryPolicy{},
		members: map[string]*member{}, feeds: map[wire.Priority]*feed{}, parked: map[*parkedMsg]struct{}{},
		roomSignal: make(chan struct{}, len(subjects.Priorities)), done: make(chan struct{}), host: hosting{instance: nuid.Next()}}
	for _, opt := range opts {
		if err := opt(g); err != nil {
			return nil, err
		}
	}
	if g.onError == nil {
		g.onError = func(err error) { g.logger.Warn("agentkit group background error", "group", name, "err", err) }
	}
	return g, nil
}

// Name returns the group's name.
func (g *Group) Name() string { return g.name }

// ErrGroupClosed is returned by an agent's Start when its group was
// closed.
var ErrGroupClosed = errors.New("agentkit: group closed")

// consumerConfig returns the group's consumer of priority p with filters
// for ids.
func (g *Group) consumerConfig(p wire.Priority, policy DeliveryPolicy, sample string, ids []string) (jetstream.ConsumerConfig, error) {
	name, err := g.scheme.GroupConsumer(g.name, string(p))
	if err != nil {
		return jetstream.ConsumerConfig{}, fmt.Errorf("%w: %w", ErrInvalidID, err)
	}
	cfg := agentConsumer(name, policy)
	cfg.Description = fmt.Sprintf("agentmesh group %s, %s priority", g.name, p)
	cfg.MaxAckPending = g.maxAckPending
	cfg.SampleFrequency = sample
	cfg.DeliverPolicy = jetstream.DeliverNewPolicy // what came before is each member's catch-up
	for _, id := range ids {
		f, err := g.scheme.DirectFilter(id, string(p))
		if err != nil {
			return jetstream.ConsumerConfig{}, fmt.Errorf("%w: %w", ErrInvalidID, err)
		}
		cfg.FilterSubjects = append(cfg.FilterSubjects, f)
	}
	return cfg, nil
}

// load reads, once, which agents the group's consumers filter and which
// agents have consumers of their own: those it must catch up through.
func (g *Group) load(ctx context.Context) error {
	if g.stream != nil {
		return nil
	}
	stream, err := g.js.Stream(ctx, g.scheme.Stream())
	if err != nil {
		return fmt.Errorf("agentkit: group %s: stream %s: %w", g.name, g.scheme.Stream(), err)
	}
	filters := map[wire.Priority][]string{}
	own := map[string]bool{}
	infos := stream.ListConsumers(ctx)
	for ci := range infos.Info() {
		c, err := g.scheme.ParseConsumerName(ci.Name)
		switch {
		case err != nil:
		case c.Group == g.name:
			p := wire.Priority(c.Priority)
			for _, f := range ci.Config.FilterSubjects {
				if sub, err := g.scheme.Parse(strings.TrimSuffix(f, "*") + "x"); err == nil && sub.Kind == subjects.KindDirect {
					filters[p] = append(filters[p], sub.Receiver)
				}
			}
		case c.Agent != "" && c.Priority != "":
			own[ci.Name] = true
		}
	}
	if err := infos.Err(); err != nil {
		return fmt.Errorf("agentkit: group %s: list consumers: %w", g.name, err)
	}
	g.mu.Lock()
	g.stream, g.filters, g.own = stream, filters, own
	g.mu.Unlock()
	return nil
}

// catchUp says that an agent's own consumer delivers its messages up to
// until, after which the group's consumer took over.
type catchUp struct {
	priority wire.Priority
	cons     jetstream.Consumer
	until    uint64
}

// joinReq is one agent's join, which the next join round takes with the
// others waiting (see Group.join).
type joinReq struct {
	id       string
	inboxes  map[wire.Priority]*inbox
	policies map[wire.Priority]DeliveryPolicy
	sample   string

	done     chan struct{} // closed once the round took it
	catchUps []catchUp
	err      error
}

// join adds agent id, whose receiver reads the inboxes, to the group:
// the group's consumers filter its direct subjects from now on, and the
// feeds hand its messages to inboxes. It returns the catch-ups the agent
// must read for messages stored before the group took over. Agents that
// start together join in one round: one update of each consumer for all
// of them.
func (g *Group) join(ctx context.Context, id string, inboxes map[wire.Priority]*inbox, policies map[wire.Priority]DeliveryPolicy, sample string) ([]catchUp, error) {
	req := &joinReq{id: id, inboxes: inboxes, policies: policies, sample: sample, done: make(chan struct{})}
	g.mu.Lock()
	err := g.admit(req)
	g.mu.Unlock()
	if err != nil {
		return nil, err
	}
	g.joinMu.Lock()
	defer g.joinMu.Unlock()
	select {
	case <-req.done: // an earlier round took it
	default:
		g.mu.Lock()
		batch := g.joining
		g.joining = nil
		g.mu.Unlock()
		g.round(ctx, batch)
	}
	return req.catchUps, req.err
}

// admit checks req against the group and queues it for the next round.
// g.mu is held.
func (g *Group) admit(req *joinReq) error {
	if g.closed {
		return ErrGroupClosed
	}
	if _, ok := g.members[req.id]; ok || slices.ContainsFunc(g.joining, func(o *joinReq) bool { return o.id == req.id }) {
		return fmt.Errorf("%w: agent %s runs in group %s already", ErrAlreadyStarted, req.id, g.name)
	}
	for p, pol := range req.policies {
		if have, ok := g.policies[p]; ok && !sameConsumerPolicy(have, pol) {
			return fmt.Errorf("%w: agent %s's %s policy differs from group %s's", ErrInvalidOption, req.id, p, g.name)
		}
	}
	for p, pol := range req.policies {
		g.policies[p] = pol
	}
	g.joining = append(g.joining, req)
	return nil
}

// round joins batch. Until an agent is a member, the feeds hold its
// messages (see park); it becomes one once it is known which of them the
// group delivers (see take).
func (g *Group) round(ctx context.Context, batch []*joinReq) {
	defer func() {
		for _, req := range batch {
			close(req.done)
		}
	}()
	fail := func(err error) {
		for _, req := range batch {
			req.err = err
		}
	}
	if err := g.load(ctx); err != nil {
		fail(err)
		return
	}
	joined, until, err := g.take(ctx, batch)
	if err != nil {
		fail(err)
		return
	}
	// Each agent's catch-ups take a round trip or two: asked for at once.
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for _, req := range batch {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			req.catchUps, req.err = g.catchUps(ctx, req, joined[req.id], until)
		})
	}
	wg.Wait()
	for _, req := range batch {
		if req.err != nil {
			continue
		}
		skip := map[wire.Priority]uint64{}
		for _, cu := range req.catchUps {
			skip[cu.priority] = cu.until
		}
		for _, b := range req.inboxes {
			b.countWith(g.took)
		}
		g.mu.Lock()
		g.members[req.id] = &member{inboxes: req.inboxes, skip: skip}
		g.mu.Unlock()
	}
}

// take has the group's consumers deliver the messages of the agents of
// batch: it returns, per agent, the priorities whose consumer's filters
// it joined, and the stream's last sequence once they had. A consumer
// whose filters gain an agent delivers that agent's messages past its
// cursor, which the server moves only as it looks for messages and does
// not report when it passes messages not for the consumer. So a
// catch-up delivers every message of a joining agent up to that last
// sequence (until), and the group acks unread those it is given (skip).
func (g *Group) take(ctx context.Context, batch []*joinReq) (joined map[string][]wire.Priority, until uint64, _ error) {
	joined = map[string][]wire.Priority{}
	type update struct {
		p   wire.Priority
		pol DeliveryPolicy
		cfg jetstream.ConsumerConfig
		ids []string
	}
	var updates []update
	for _, p := range priorities() {
		pol := batch[0].policies[p]
		g.mu.Lock()
		ids := slices.Clone(g.filters[p])
		running := g.feeds[p] != nil
		g.mu.Unlock()
		grew := false
		for _, req := range batch {
			if !slices.Contains(ids, req.id) {
				ids = append(ids, req.id)
				joined[req.id] = append(joined[req.id], p)
				grew = true
			}
		}
		if !grew && running {
			continue
		}
		cfg, err := g.consumerConfig(p, pol, batch[0].sample, ids)
		if err != nil {
			return nil, 0, err
		}
		updates = append(updates, update{p, pol, cfg, ids})
	}
	// The five consumers are updated at once: a round trip, not five.
	errs := make([]error, len(updates))
	var wg sync.WaitGroup
	for i, u := range updates {
		wg.Go(func() {
			cons, err := g.js.CreateOrUpdateConsumer(ctx, g.scheme.Stream(), u.cfg)
			if err != nil {
				errs[i] = fmt.Errorf("agentkit: group consumer %s: %w", u.cfg.Durable, err)
				return
			}
			g.mu.Lock()
			g.filters[u.p] = u.ids
			g.mu.Unlock()
			g.startFeed(u.p, u.pol, cons)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, 0, err
	}
	if len(joined) > 0 {
		info, err := g.stream.Info(ctx)
		if err != nil {
			return nil, 0, fmt.Errorf("agentkit: group %s: stream: %w", g.name, err)
		}
		until = info.State.LastSeq
	}
	return joined, until, nil
}

// catchUps returns the catch-ups of req's agent: for the priorities whose
// filters it joined (joined) up to until, when it has a consumer of its
// own or stored messages; for the others, any an earlier run left
// unfinished.
func (g *Group) catchUps(ctx context.Context, req *joinReq, joined []wire.Priority, until uint64) ([]catchUp, error) {
	var out []catchUp
	earlier := g.earlier(ctx, req.id)
	for _, p := range priorities() {
		own, _ := g.scheme.Consumer(req.id, string(p)) // the id was validated by New
		var cu *catchUp
		var err error
		switch {
		case slices.Contains(joined, p):
			if g.hasOwn(own) || earlier(p, until) {
				cu, err = g.startCatchUp(ctx, req.id, p, req.policies[p], until)
			}
		case g.hasOwn(own):
			cu, err = g.resumeCatchUp(ctx, own, p)
		}
		if err != nil {
			return nil, err
		}
		if cu != nil {
			out = append(out, *cu)
		}
	}
	return out, nil
}

// earlier returns a test of whether the stream holds a message for agent
// id at a priority at or below a sequence. It asks the server once for
// the first message of id at any priority, then, if that comes early
// enough, once per priority asked about.
func (g *Group) earlier(ctx context.Context, id string) func(p wire.Priority, until uint64) bool {
	var first uint64
	known := false
	return func(p wire.Priority, until uint64) bool {
		if !known {
			known = true
			all := g.scheme.Prefix() + ".agent." + id + ".*.*"
			if msg, err := g.stream.GetMsg(ctx, 1, jetstream.WithGetMsgSubject(all)); err == nil {
				first = msg.Sequence
			} else if !errors.Is(err, jetstream.ErrMsgNotFound) {
				first = 1 // unknown: look per priority
			}
		}
		if first == 0 || first > until {
			return false
		}
		filter, _ := g.scheme.DirectFilter(id, string(p))
		msg, err := g.stream.GetMsg(ctx, first, jetstream.WithGetMsgSubject(filter))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return false
		}
		return err != nil || msg.Sequence <= until // unknown: a catch-up that finds nothing ends at once
	}
}

// sameConsumerPolicy reports whether two policies give a consumer the same
// configuration.
func sameConsumerPolicy(a, b DeliveryPolicy) bool {
	return slices.Equal(a.BackOff, b.BackOff) && a.MaxDeliver == b.MaxDeliver
}

// priorities returns the five priorities, highest first.
func priorities() []wire.Priority {
	out := make([]wire.Priority, 0, len(subjects.Priorities))
	for _, p := range subjects.Priorities {
		out = append(out, wire.Priority(p))
	}
	return out
}

// hasOwn reports whether the agent consumer name existed when the group
// loaded, or was made since as a catch-up.
func (g *Group) hasOwn(name string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.own[name]
}

// startCatchUp returns the catch-up of agent id at priority p up to
// until: the agent's own consumer, created if it has none (then from the
// stream's start), or continuing where it stood.
func (g *Group) startCatchUp(ctx context.Context, id string, p wire.Priority, pol DeliveryPolicy, until uint64) (*catchUp, error) {
	cfg, err := ConsumerConfig(g.scheme, id, p, pol)
	if err != nil {
		return nil, err
	}
	cfg.SampleFrequency = "" // acks of what the group delivers are no ack events
	cfg.Metadata = map[string]string{subjects.CatchUpKey: strconv.FormatUint(until, 10)}
	var cons jetstream.Consumer
	if old, err := g.stream.Consumer(ctx, cfg.Durable); err == nil {
		cfg.DeliverPolicy, cfg.OptStartSeq = old.CachedInfo().Config.DeliverPolicy, old.CachedInfo().Config.OptStartSeq
		cfg.OptStartTime = old.CachedInfo().Config.OptStartTime
		cons, err = g.stream.UpdateConsumer(ctx, cfg)
		if err != nil {
			return nil, fmt.Errorf("agentkit: catch-up consumer %s: %w", cfg.Durable, err)
		}
	} else {
		cons, err = g.stream.CreateOrUpdateConsumer(ctx, cfg)
		if err != nil {
			return nil, fmt.Errorf("agentkit: catch-up consumer %s: %w", cfg.Durable, err)
		}
	}
	g.mu.Lock()
	g.own[cfg.Durable] = true
	g.mu.Unlock()
	return &catchUp{priority: p, cons: cons, until: until}, nil
}

// resumeCatchUp returns the catch-up an earlier run left unfinished; a
// consumer of the agent's own without the group's mark predates the
// group and is left alone (nil).
func (g *Group) resumeCatchUp(ctx context.Context, name string, p wire.Priority) (*catchUp, error) {
	cons, err := g.stream.Consumer(ctx, name)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		g.catchUpDone(name)
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("agentkit: catch-up consumer %s: %w", name, err)
	}
	mark, ok := cons.CachedInfo().Config.Metadata[subjects.CatchUpKey]
	if !ok {
		return nil, nil
	}
	until, err := strconv.ParseUint(mark, 10, 64)
	if err != nil {
		return nil, fmt.Errorf("agentkit: catch-up consumer %s: bad %s %q: %w", name, subjects.CatchUpKey, mark, err)
	}
	return &catchUp{priority: p, cons: cons, until: until}, nil
}

// catchUpDone forgets the catch-up consumer name, deleted.
func (g *Group) catchUpDone(name string) {
	g.mu.Lock()
	delete(g.own, name)
	g.mu.Unlock()
}

// leave takes agent id out of this process's members: messages for it
// from now on are held, then given back (see Group). Its filters stay.
func (g *Group) leave(id string) {
	g.unhostMember(id)
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.members, id)
}

// feed returns the running feed of p, or nil.
func (g *Group) feed(p wire.Priority) *feed {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.feeds[p]
}

// startFeed starts reading the group's consumer of p, unless it runs.
// cons may be nil when the consumer exists unchanged.
func (g *Group) startFeed(p wire.Priority, pol DeliveryPolicy, cons jetstream.Consumer) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.feeds[p] != nil || g.closed {
		return
	}
	name, _ := g.scheme.GroupConsumer(g.name, string(p))
	f := &feed{g: g, priority: p, policy: pol, name: name, cons: cons, stopped: make(chan struct{})}
	f.ctx, f.cancel = context.WithCancel(context.Background())
	g.feeds[p] = f
	f.wg.Go(f.run)
	if len(g.feeds) == 1 {
		g.startKeeper()
	}
}

// route hands msg to the inbox of the agent its subject names, or holds it
// while that agent does not run here.
func (g *Group) route(p wire.Priority, msg jetstream.Msg) {
	if !g.deliver(p, msg) {
		g.park(p, msg)
	}
}

// deliver hands msg to its agent's inbox; false if that agent does not
// run here.
func (g *Group) deliver(p wire.Priority, msg jetstream.Msg) bool {
	id := receiverToken(g.scheme, msg.Subject())
	g.mu.Lock()
	m := g.members[id]
	g.mu.Unlock()
	if m == nil {
		return false
	}
	if last := m.skip[p]; last > 0 {
		if md, err := msg.Metadata(); err == nil && md.Sequence.Stream <= last {
			// The catch-up's: the ack only moves the group's consumer on.
			if err := msg.Ack(); err != nil {
				g.onError(fmt.Errorf("agentkit: group %s: ack a message of %s's catch-up: %w", g.name, id, err))
			}
			return true
		}
	}
	if !m.inboxes[p].push(msg) {
		return false
	}
	g.held.Add(1)
	return true
}

// room waits until the members' inboxes hold fewer than the group's
// buffer of messages and returns how many more a feed may pull; false
// once stopped is closed.
func (g *Group) room(stopped <-chan struct{}) (int, bool) {
	for {
		if n := g.buffer - int(g.held.Load()); n > 0 {
			return n, true
		}
		select {
		case <-g.roomSignal:
		case <-stopped:
			return 0, false
		}
	}
}

// took counts n messages out of the members' inboxes, waking the feeds
// waiting for room.
func (g *Group) took(n int) {
	if left := g.held.Add(-int64(n)); left+int64(n) >= int64(g.buffer) {
		g.roomChanged()
	}
}

// roomChanged wakes the feeds waiting for room (see room).
func (g *Group) roomChanged() {
	for range len(priorities()) {
		select {
		case g.roomSignal <- struct{}{}:
		default:
		}
	}
}

// receiverToken returns the receiver token of a direct subject, unchecked:
// the group's filters name only members, and the member's runtime checks
// the whole subject.
func receiverToken(s subjects.Scheme, subject string) string {
	rest, ok := strings.CutPrefix(subject, s.Prefix()+".agent.")
	if !ok {
		return ""
	}
	id, _, _ := strings.Cut(rest, ".")
	return id
}

// Close stops the group's feeds and gives back the messages it holds, or
// has received, for agents not running here. Stop or drain the group's
// agents first: their inboxes are theirs to hand back.
func (g *Group) Close() {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return
	}
	g.closed = true
	feeds := g.feeds
	g.feeds = map[wire.Priority]*feed{}
	g.mu.Unlock()
	for _, f := range feeds {
		f.stop()
	}
	g.roomChanged() // a feed waiting for room sees it stopped
	for _, f := range feeds {
		f.wg.Wait()
	}
	close(g.done)
	g.keeper.Wait()
	g.mu.Lock()
	parked := g.parked
	g.parked = map[*parkedMsg]struct{}{}
	g.mu.Unlock()
	for pm := range parked {
		if err := pm.msg.Nak(); err != nil {
			g.onError(fmt.Errorf("agentkit: group %s: give back a held message: %w", g.name, err))
		}
	}
	g.closeHost()
}

// feed reads the group's consumer of one priority and routes each message
// (see Group.route). It pulls only as many messages as the group has room
// for (see Group.room): the server keeps the rest, where no ack clock
// runs, rather than the agents' inboxes, where each would need keeping
// alive.
type feed struct {
	g        *Group
	priority wire.Priority
	policy   DeliveryPolicy
	name     string
	cons     jetstream.Consumer // nil: bind a fresh handle

	ctx     context.Context // ends when the feed stops: a pull under way returns
	cancel  context.CancelFunc
	stopped chan struct{}
	once    sync.Once
	wg      sync.WaitGroup
}

// groupPull is the most messages a feed asks for at once.
const groupPull = 256

func (f *feed) run() {
	retry := reopenBackOff()
	for {
		n, ok := f.g.room(f.stopped)
		if !ok {
			return
		}
		if f.cons == nil {
			ctx, cancel := context.WithTimeout(f.ctx, 5*time.Second)
			cons, err := f.g.js.Consumer(ctx, f.g.scheme.Stream(), f.name)
			cancel()
			if err != nil {
				if f.failed(err, retry) {
					continue
				}
				return
			}
			f.cons = cons
		}
		if !f.pull(min(n, groupPull), retry) {
			return
		}
	}
}

// pull asks for up to n messages, waiting at most the policy's pull expiry
// for them, and routes what comes; false once the feed is stopped.
func (f *feed) pull(n int, retry backoff.BackOff) bool {
	ctx, cancel := context.WithTimeout(f.ctx, f.policy.pullExpiry())
	defer cancel()
	batch, err := f.cons.Fetch(n, jetstream.FetchContext(ctx))
	if err != nil {
		return f.failed(err, retry)
	}
	for msg := range batch.Messages() {
		if msg.Headers().Get(headerPinID) != "" {
			// A forged pin id would have nats.go send it with every later
			// pull: the next pull goes on a fresh handle.
			f.cons = nil
		}
		f.g.route(f.priority, msg)
	}
	switch err := batch.Error(); {
	case err == nil, ctx.Err() != nil, errors.Is(err, nats.ErrTimeout):
		retry.Reset()
		return f.ctx.Err() == nil
	default:
		return f.failed(err, retry)
	}
}

// failed reports err and pauses for retry's next interval; false once the
// feed is stopped.
func (f *feed) failed(err error, retry backoff.BackOff) bool {
	if f.ctx.Err() != nil {
		return false
	}
	f.g.onError(fmt.Errorf("agentkit: group consumer %s: %w", f.name, err))
	t := time.NewTimer(retry.NextBackOff())
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-f.stopped:
		return false
	}
}

// stop ends the feed: a pull under way returns, and what it had received
// is still routed (the group holds what is for agents no longer running,
// and Close gives it back).
func (f *feed) stop() {
	f.once.Do(func() {
		close(f.stopped)
		f.cancel()
	})
}

// parkedMsg is a message for an agent of the group that does not run in
// this process.
type parkedMsg struct {
	msg          jetstream.Msg
	priority     wire.Priority
	since        time.Time
	lastProgress time.Time
}

// park holds msg for the agent it is for, which does not run here.
func (g *Group) park(p wire.Priority, msg jetstream.Msg) {
	now := time.Now()
	g.mu.Lock()
	defer g.mu.Unlock()
	g.parked[&parkedMsg{msg: msg, priority: p, since: now, lastProgress: now}] = struct{}{}
}

// startKeeper starts the goroutine that looks after held messages: each
// goes to its agent once that agent runs here, is kept alive meanwhile,
// and goes back to the server after an ack timeout of its priority.
func (g *Group) startKeeper() {
	g.keeper.Go(func() {
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-g.done:
				return
			case now := <-t.C:
				g.keepParked(now)
			}
		}
	})
}

func (g *Group) keepParked(now time.Time) {
	type due struct {
		pm    *parkedMsg
		delay time.Duration
	}
	var deliver []*parkedMsg
	var giveBack []due
	var progress []*parkedMsg
	g.mu.Lock()
	for pm := range g.parked {
		pol := g.policies[pm.priority]
		switch {
		case g.members[receiverToken(g.scheme, pm.msg.Subject())] != nil:
			deliver = append(deliver, pm)
		case now.Sub(pm.since) >= pol.BackOff[0]:
			giveBack = append(giveBack, due{pm, pol.BackOff[0]})
			delete(g.parked, pm)
		case now.Sub(pm.lastProgress) >= pol.progressInterval():
			pm.lastProgress = now
			progress = append(progress, pm)
		}
	}
	g.mu.Unlock()
	for _, pm := range deliver {
		if g.deliver(pm.priority, pm.msg) {
			g.mu.Lock()
			delete(g.parked, pm)
			g.mu.Unlock()
		}
	}
	for _, d := range giveBack {
		if err := d.pm.msg.NakWithDelay(d.delay); err != nil {
			g.onError(fmt.Errorf("agentkit: group %s: give back a message for an agent not running here: %w", g.name, err))
		}
	}
	for _, pm := range progress {
		if err := pm.msg.InProgress(); err != nil {
			g.onError(fmt.Errorf("agentkit: group %s: keep a held message alive: %w", g.name, err))
		}
	}
}
