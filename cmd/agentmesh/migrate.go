package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/registry"
	"github.com/agentmesh-io/agentmesh/subjects"
)

func (a *app) migrateCmd() *cobra.Command {
	var dryRun bool
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Move a mesh created by an older agentmesh to the current delivery topology",
		Long: `migrate brings the message stream, the agents' consumers and the registry
bucket of a mesh created by an older agentmesh to the current delivery
topology. It is idempotent: what is current already is left alone, and a mesh
that is current is "nothing to do".

  stream     its subjects become exactly the direct, topic and broadcast
             subjects with the five priority tokens (mesh.agent.*.<priority>.*,
             mesh.topic.*.<priority>.*, mesh.broadcast.<priority>.*) instead of
             mesh.agent.>, mesh.topic.> and mesh.broadcast.>, so the server
             refuses a malformed subject at publish instead of storing it;
             a stream without a consumer limit of its own gets one (the
             server's default would hold fewer agents, each with seven).
  consumers  each direct consumer <agent>_<priority> that still reads
             broadcasts or topics is narrowed to the agent's direct messages,
             its other settings (ack wait, back-off, attempts, ...) kept; the
             agent gets its fan-out consumers <agent>_fanout-urgent (critical,
             high) and <agent>_fanout-bulk (normal, low, batch), reading the
             broadcasts and the topics its old consumers read, unless it has
             them already.
  registry   the registry bucket (KV mesh_registry) allows per-key TTLs and
             keeps the marker the server leaves when a key expires for a
             week (subject_delete_marker_ttl), so a registry loaded later,
             such as agentmesh agents', still shows an instance whose
             heartbeats stopped as UNAVAILABLE. Without markers an expired
             key vanishes: only a registry that watched it go knows; without
             per-key TTLs agents cannot register at all.

A fan-out consumer starts where the agent's old consumers of its priorities
left off: after the lowest ack floor among them (after the stream's last
message for one with nothing pending), so no broadcast or topic message that
was not yet handled is lost. Delivery is at least once: the few messages
handled but not yet acked then, or received by the old consumers until they
are narrowed, are delivered again.

When: after upgrading, before or while the agents restart. Agents with
provisioning rights narrow their own direct consumers when they start, but
only this command updates the stream's subjects, and a fan-out consumer an
agent creates itself starts at the next message published: the broadcasts
and topic messages stored before then would not reach it. Agents without
provisioning rights need the consumers this command creates.

It needs credentials that may update streams and consumers (an
administrator's). --dry-run prints what would change and changes nothing; a
run that fails part way can be run again.` + exitCodesHelp,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.migrate(cmd.Context(), dryRun)
		},
	}
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "print what would change; change nothing")
	return cmd
}

// migrate has no overall deadline: a large mesh takes a few requests per
// agent, each bounded by the JetStream client's default timeout.
func (a *app) migrate(ctx context.Context, dryRun bool) error {
	ctx, js, done, err := a.watchedJetStream(ctx, "agentmesh-migrate")
	if err != nil {
		return err
	}
	defer done()
	m := &migrator{js: js, scheme: a.scheme(), out: a.stdout, dryRun: dryRun}
	return denied(ctx, m.run(ctx), "migrate needs credentials that may update streams and consumers (an administrator's)")
}

// migrator moves one mesh to the current topology, printing each change.
type migrator struct {
	js      jetstream.JetStream
	scheme  subjects.Scheme
	out     io.Writer
	dryRun  bool
	changes int
}

// did prints a change: done, or with --dry-run what would be done.
func (m *migrator) did(format string, args ...any) {
	m.changes++
	if m.dryRun {
		format = "would " + format
	}
	fmt.Fprintf(m.out, format+"\n", args...)
}

func (m *migrator) run(ctx context.Context) error {
	name := m.scheme.Stream()
	stream, err := m.js.Stream(ctx, name)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		fmt.Fprintf(m.out, "stream %s does not exist: nothing to do (agents create it with the current subjects)\n", name)
	case err != nil:
		return fmt.Errorf("stream %s: %w", name, err)
	default:
		if err := m.stream(ctx, stream.CachedInfo()); err != nil {
			return err
		}
		if err := m.consumers(ctx, stream); err != nil {
			return err
		}
	}
	if err := m.registry(ctx); err != nil {
		return err
	}
	switch {
	case m.changes == 0:
		fmt.Fprintln(m.out, "nothing to do: the mesh has the current topology")
	case m.dryRun:
		fmt.Fprintf(m.out, "dry run: %d changes, none made\n", m.changes)
	default:
		fmt.Fprintf(m.out, "migrated: %d changes\n", m.changes)
	}
	return nil
}

// stream makes the stream's subjects exactly the scheme's and gives it
// its own consumer limit if it has none.
func (m *migrator) stream(ctx context.Context, info *jetstream.StreamInfo) error {
	cfg := info.Config
	want := m.scheme.StreamSubjects()
	changed := false
	if removed, added := missing(cfg.Subjects, want), missing(want, cfg.Subjects); len(removed)+len(added) > 0 {
		m.did("set the subjects of stream %s: removed %s; added %s", cfg.Name, list(removed), list(added))
		cfg.Subjects, changed = want, true
	}
	if cfg.MaxConsumers <= 0 {
		// Without one the server's default applies, which seven consumers
		// per agent reach sooner than the five they had.
		m.did("set the consumer limit of stream %s to %d", cfg.Name, agentkit.MaxStreamConsumers)
		cfg.MaxConsumers, changed = agentkit.MaxStreamConsumers, true
	}
	if !changed {
		fmt.Fprintf(m.out, "stream %s: current\n", cfg.Name)
		return nil
	}
	if m.dryRun {
		return nil
	}
	if _, err := m.js.UpdateStream(ctx, cfg); err != nil {
		return fmt.Errorf("update stream %s: %w", cfg.Name, err)
	}
	return nil
}

// registry lets the registry bucket keep expiry markers as long as agents
// create it with, and allow the per-key TTLs that leave them. The server
// allows both on an existing stream, and applies the marker TTL to keys
// that expire afterwards, those put before included.
func (m *migrator) registry(ctx context.Context) error {
	bucket := m.scheme.RegistryBucket()
	name := subjects.KVStream(bucket)
	stream, err := m.js.Stream(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		fmt.Fprintf(m.out, "registry bucket %s does not exist (agents create it with expiry markers)\n", bucket)
		return nil
	}
	if err != nil {
		return fmt.Errorf("registry bucket %s: %w", bucket, err)
	}
	cfg := stream.CachedInfo().Config
	changed := false
	if !cfg.AllowMsgTTL {
		m.did("allow per-key TTLs in registry bucket %s (allow_msg_ttl), without which agents cannot register", bucket)
		cfg.AllowMsgTTL, changed = true, true
	}
	if cfg.SubjectDeleteMarkerTTL < registry.MarkerTTL {
		m.did("keep the markers of expired keys in registry bucket %s for %v (subject_delete_marker_ttl, was %v), so an instance whose heartbeats stopped reads UNAVAILABLE",
			bucket, registry.MarkerTTL, cfg.SubjectDeleteMarkerTTL)
		cfg.SubjectDeleteMarkerTTL, changed = registry.MarkerTTL, true
	}
	if !changed {
		fmt.Fprintf(m.out, "registry bucket %s: current\n", bucket)
		return nil
	}
	if m.dryRun {
		return nil
	}
	if _, err := m.js.UpdateStream(ctx, cfg); err != nil {
		return fmt.Errorf("update registry bucket %s: %w", bucket, err)
	}
	return nil
}

// missing returns the elements of a that are not in b.
func missing(a, b []string) []string {
	var out []string
	for _, s := range a {
		if !slices.Contains(b, s) {
			out = append(out, s)
		}
	}
	return out
}

func list(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ", ")
}

// wideConsumer is a direct consumer of an older version, which reads
// broadcasts and topics besides the agent's direct messages.
type wideConsumer struct {
	info     *jetstream.ConsumerInfo
	agent    string
	priority string
	direct   string   // its direct filter: what it keeps
	dropped  []string // its other filters
	topics   []string // the topics of its topic filters
	// from is the first stream sequence it may not have handled: after
	// its ack floor, or after the stream's last message when nothing is
	// pending.
	from uint64
}

// consumers narrows the direct consumers that read broadcasts or topics
// and gives their agents fan-out consumers.
func (m *migrator) consumers(ctx context.Context, stream jetstream.Stream) error {
	// The stream's last sequence is read before the consumers: a consumer
	// with nothing pending then has handled every message up to it.
	info, err := stream.Info(ctx)
	if err != nil {
		return fmt.Errorf("stream %s: %w", m.scheme.Stream(), err)
	}
	last := info.State.LastSeq
	byAgent := map[string][]wideConsumer{}
	lister := stream.ListConsumers(ctx)
	for ci := range lister.Info() {
		if w, ok := m.wide(ci, last); ok {
			byAgent[w.agent] = append(byAgent[w.agent], w)
		}
	}
	if err := lister.Err(); err != nil {
		return fmt.Errorf("list the consumers of %s: %w", m.scheme.Stream(), err)
	}
	if len(byAgent) == 0 {
		fmt.Fprintln(m.out, "consumers: every direct consumer reads direct messages only")
		return nil
	}
	for _, agent := range slices.Sorted(maps.Keys(byAgent)) {
		olds := byAgent[agent]
		slices.SortFunc(olds, func(x, y wideConsumer) int {
			return slices.Index(subjects.Priorities, x.priority) - slices.Index(subjects.Priorities, y.priority)
		})
		// Fan-out first: should narrowing fail, the old consumers still
		// read what the new ones may not yet.
		for _, class := range subjects.FanoutClasses {
			if err := m.fanout(ctx, agent, class, olds); err != nil {
				return err
			}
		}
		for _, w := range olds {
			if err := m.narrow(ctx, w); err != nil {
				return err
			}
		}
	}
	return nil
}

// wide returns ci as a wideConsumer if it is an agent's direct consumer
// with filters besides its direct one.
func (m *migrator) wide(ci *jetstream.ConsumerInfo, last uint64) (wideConsumer, bool) {
	c, err := m.scheme.ParseConsumerName(ci.Name)
	if err != nil || c.Priority == "" || c.Group != "" {
		return wideConsumer{}, false // not an agent's direct consumer
	}
	direct, _ := m.scheme.DirectFilter(c.Agent, c.Priority) // parsed tokens are valid
	filters := ci.Config.FilterSubjects
	if ci.Config.FilterSubject != "" {
		filters = append([]string{ci.Config.FilterSubject}, filters...)
	}
	if !slices.Contains(filters, direct) {
		// Not what agentkit creates (it would read something else, or
		// everything): not this command's to change.
		fmt.Fprintf(m.out, "consumer %s: filters %s do not include %s; left as it is\n", ci.Name, list(filters), direct)
		return wideConsumer{}, false
	}
	if len(filters) == 1 {
		return wideConsumer{}, false // current
	}
	w := wideConsumer{info: ci, agent: c.Agent, priority: c.Priority, direct: direct, from: ci.AckFloor.Stream + 1}
	if ci.NumPending == 0 && ci.NumAckPending == 0 {
		w.from = max(w.from, last+1)
	}
	for _, f := range filters {
		if f == direct {
			continue
		}
		w.dropped = append(w.dropped, f)
		if t, ok := m.topicOf(f); ok && !slices.Contains(w.topics, t) {
			w.topics = append(w.topics, t)
		}
	}
	return w, true
}

// topicOf returns the topic of a topic filter built by the scheme.
func (m *migrator) topicOf(filter string) (string, bool) {
	rest, ok := strings.CutSuffix(filter, ".*")
	if !ok {
		return "", false
	}
	sub, err := m.scheme.Parse(rest + ".x") // any sender
	if err != nil || sub.Kind != subjects.KindTopic {
		return "", false
	}
	if f, _ := m.scheme.TopicFilter(sub.Topic, sub.Priority); f != filter {
		return "", false
	}
	return sub.Topic, true
}

// fanout creates agent's fan-out consumer of class unless it exists,
// reading the broadcasts and the topics of olds, the agent's wide
// consumers, from where the old ones of class's priorities left off.
func (m *migrator) fanout(ctx context.Context, agent, class string, olds []wideConsumer) error {
	stream := m.scheme.Stream()
	name, err := m.scheme.FanoutConsumer(agent, class)
	if err != nil {
		return err
	}
	switch _, err := m.js.Consumer(ctx, stream, name); {
	case err == nil:
		fmt.Fprintf(m.out, "consumer %s: exists, left as it is\n", name)
		return nil
	case !errors.Is(err, jetstream.ErrConsumerNotFound):
		return fmt.Errorf("consumer %s: %w", name, err)
	}
	var topics []string
	var from uint64
	var like *wideConsumer // the old consumer of the class's highest priority, for its settings
	prios := subjects.FanoutPriorities(class)
	for i, w := range olds {
		for _, t := range w.topics {
			if !slices.Contains(topics, t) {
				topics = append(topics, t)
			}
		}
		if slices.Contains(prios, w.priority) && (from == 0 || w.from < from) {
			from = w.from
		}
		if w.priority == prios[0] {
			like = &olds[i]
		}
	}
	if from == 0 { // no old consumer of the class's priorities: the lowest of all
		for _, w := range olds {
			if from == 0 || w.from < from {
				from = w.from
			}
		}
	}
	var policy agentkit.DeliveryPolicy
	if like != nil {
		c := like.info.Config
		policy = agentkit.DeliveryPolicy{BackOff: c.BackOff, MaxDeliver: c.MaxDeliver, MaxAckPending: c.MaxAckPending}
		if len(policy.BackOff) == 0 && c.AckWait > 0 {
			policy.BackOff = []time.Duration{c.AckWait}
		}
	}
	cfg, err := agentkit.FanoutConsumerConfig(m.scheme, agent, class, policy, topics)
	if err != nil && like != nil {
		fmt.Fprintf(m.out, "consumer %s: the settings of %s do not suit it (%v): default ones\n", name, like.info.Name, err)
		like = nil
		cfg, err = agentkit.FanoutConsumerConfig(m.scheme, agent, class, agentkit.DeliveryPolicy{}, topics)
	}
	if err != nil {
		return fmt.Errorf("consumer %s: %w", name, err)
	}
	if like != nil && like.info.Config.SampleFrequency != "" {
		cfg.SampleFrequency = like.info.Config.SampleFrequency
	}
	cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, from
	m.did("create consumer %s: broadcasts and topics %s at %s, from stream sequence %d", name, list(topics), strings.Join(prios, ", "), from)
	if m.dryRun {
		return nil
	}
	if _, err := m.js.CreateConsumer(ctx, stream, cfg); err != nil {
		return fmt.Errorf("create consumer %s: %w", name, err)
	}
	return nil
}

// narrow makes w read its agent's direct messages only, its other
// settings kept.
func (m *migrator) narrow(ctx context.Context, w wideConsumer) error {
	m.did("narrow consumer %s to %s (dropping %s)", w.info.Name, w.direct, list(w.dropped))
	if m.dryRun {
		return nil
	}
	cfg := w.info.Config
	cfg.FilterSubject, cfg.FilterSubjects = w.direct, nil
	if _, err := m.js.UpdateConsumer(ctx, m.scheme.Stream(), cfg); err != nil {
		return fmt.Errorf("narrow consumer %s: %w", w.info.Name, err)
	}
	return nil
}
