package ackmonitor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/subjects"
)

// Agents hosted by one process share a direct consumer per priority, the
// group consumer "<group>_group-<priority>" (subjects.Scheme.GroupConsumer),
// whose FilterSubjects are the direct filters of the agents it hosts. A
// direct message is handled through exactly one consumer: its receiver's
// own "<id>_<priority>" (for a member, a catch-up consumer that delivers
// what was stored before it joined, deleted once done) or its receiver's
// group consumer. The ledger keys a direct message's row by its receiver's
// consumer whoever delivered it, so a message keeps one row and the rates
// stay per agent: the intake attributes a group consumer's events to the
// message's receiver (attributeGroupEvents), and reconcile reads a member's
// ack floor from its group consumer while the member has none of its own.
//
// When an agent joins, the group's consumer may be given some of the
// agent's messages its catch-up delivers (up to the sequence in the
// catch-up consumer's metadata, subjects.CatchUpKey): the group acks them
// unread, so their events are not the message's outcome and are ignored. The
// catch-ups are found by the listings and by reading a member's own
// consumer at the group's first event about it, and remembered after they
// are deleted, as those events may be written later.

const (
	// maxGroupMembers bounds the members the membership map keeps over
	// all groups: consumer configurations are not the monitor's to trust
	// with its memory. A group holds a few hundred agents.
	maxGroupMembers = 1 << 16
	// groupsListedFor is how long a listing of the group consumers serves
	// a look-up that misses before the stream's consumers are listed
	// again.
	groupsListedFor = time.Minute
)

// groupMembers maps the mesh stream's group consumers to their members,
// from the consumers' FilterSubjects: each member is named by its own
// direct consumer, "<id>_<priority>", the ledger key of its rows. It is
// filled by listing the stream's consumers (list, for the reverse look-up
// of a member's group) and by reading one group consumer (read, for the
// check of an event's group). Both are bounded; entries are replaced,
// never grown without bound.
type groupMembers struct {
	js     jetstream.JetStream
	scheme subjects.Scheme
	logger *slog.Logger

	listing sync.Mutex // one listing at a time

	mu       sync.Mutex
	groups   map[string]groupEntry // group consumer → its members
	byMember map[string]string     // member's direct consumer → group consumer
	listedAt time.Time             // when the last complete listing started
	// catchUps is the last sequence each member's catch-up consumer
	// delivers (by the consumer's name), also once it is deleted;
	// catchUpRead the members whose own consumer was read for it.
	catchUps    map[string]uint64
	catchUpRead map[string]bool
}

// groupEntry is what the map knows of one group consumer.
type groupEntry struct {
	members map[string]struct{} // the members' direct consumers
	readAt  time.Time           // when its configuration was asked for
}

func newGroupMembers(js jetstream.JetStream, scheme subjects.Scheme, logger *slog.Logger) *groupMembers {
	return &groupMembers{js: js, scheme: scheme, logger: logger, groups: map[string]groupEntry{}, byMember: map[string]string{},
		catchUps: map[string]uint64{}, catchUpRead: map[string]bool{}}
}

// isGroup reports whether consumer is a group consumer's name.
func (g *groupMembers) isGroup(consumer string) bool {
	c, err := g.scheme.ParseConsumerName(consumer)
	return err == nil && c.Group != ""
}

// membersOf returns the direct consumers of the agents whose direct
// filters are among filters, at most limit of them. A filter that is not
// exactly one agent's direct filter (a wildcard receiver, another kind of
// subject) names no member.
func (g *groupMembers) membersOf(filters []string, limit int) map[string]struct{} {
	out := map[string]struct{}{}
	for _, f := range filters {
		if len(out) >= limit {
			g.logger.Warn("a group consumer has more members than the monitor keeps; the rest are not attributed",
				"filters", len(filters), "kept", limit)
			break
		}
		prefix, ok := strings.CutSuffix(f, ".*")
		if !ok {
			continue
		}
		// Any valid sender token stands for the wildcard; the filter
		// must then be exactly the receiver's direct filter.
		sub, err := g.scheme.Parse(prefix + ".x")
		if err != nil || sub.Kind != subjects.KindDirect {
			continue
		}
		if want, err := g.scheme.DirectFilter(sub.Receiver, sub.Priority); err != nil || want != f {
			continue
		}
		name, err := g.scheme.Consumer(sub.Receiver, sub.Priority)
		if err != nil {
			continue
		}
		out[name] = struct{}{}
	}
	return out
}

// isMember reports whether direct (an agent's direct consumer name) is a
// member of the group consumer group. A group the map does not know, or
// knows only as it was configured before since, is read again first:
// an event the server published about a delivery of group (received
// since) comes from a configuration at least as old, so a member that
// joined before the delivery is found.
func (g *groupMembers) isMember(ctx context.Context, group, direct string, since time.Time) (bool, error) {
	g.mu.Lock()
	e, ok := g.groups[group]
	g.mu.Unlock()
	if ok {
		if _, member := e.members[direct]; member {
			return true, nil
		}
		if !e.readAt.Before(since) {
			return false, nil
		}
	}
	e, err := g.read(ctx, group)
	if err != nil {
		return false, err
	}
	_, member := e.members[direct]
	return member, nil
}

// catchUpEnd returns the last sequence the catch-up of direct (a member's
// own consumer) delivers, or 0 when it has none. Unless a listing found
// its catch-up, the member's own consumer is read the first time: agentkit
// makes a joining agent's catch-up just after it adds the agent to the
// group's filters and before the group delivers anything of it, so a
// listing in between finds the member without it, while a read for the
// group's first event about the member finds it.
func (g *groupMembers) catchUpEnd(ctx context.Context, direct string) (uint64, error) {
	g.mu.Lock()
	until, known := g.catchUps[direct]
	read := g.catchUpRead[direct]
	g.mu.Unlock()
	if known || read {
		return until, nil
	}
	c, err := g.js.Consumer(ctx, g.scheme.Stream(), direct)
	switch {
	case errors.Is(err, jetstream.ErrConsumerNotFound):
	case err != nil:
		return 0, fmt.Errorf("ackmonitor: consumer %s: %w", direct, err)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if err == nil {
		g.noteCatchUp(direct, c.CachedInfo().Config.Metadata)
	}
	if len(g.catchUpRead) >= maxGroupMembers {
		clear(g.catchUpRead) // read again, once each
	}
	g.catchUpRead[direct] = true
	return g.catchUps[direct], nil
}

// noteCatchUp remembers the end of consumer's catch-up, if its metadata
// has one. g.mu is held.
func (g *groupMembers) noteCatchUp(consumer string, metadata map[string]string) {
	mark, ok := metadata[subjects.CatchUpKey]
	if !ok {
		return
	}
	until, err := strconv.ParseUint(mark, 10, 64)
	if err != nil {
		return
	}
	if _, known := g.catchUps[consumer]; !known && len(g.catchUps) >= maxGroupMembers {
		clear(g.catchUps) // past the bound: the oldest are the least likely asked about
	}
	g.catchUps[consumer] = until
}

// read reads group's configuration from the stream and enters it in the
// map; a group consumer that does not exist has no members.
func (g *groupMembers) read(ctx context.Context, group string) (groupEntry, error) {
	at := time.Now()
	c, err := g.js.Consumer(ctx, g.scheme.Stream(), group)
	var filters []string
	switch {
	case errors.Is(err, jetstream.ErrConsumerNotFound):
	case err != nil:
		return groupEntry{}, fmt.Errorf("ackmonitor: group consumer %s: %w", group, err)
	default:
		filters = filtersOf(c.CachedInfo().Config)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if old, ok := g.groups[group]; ok && old.readAt.After(at) {
		return old, nil // a newer read or listing won
	}
	e := groupEntry{members: g.membersOf(filters, maxGroupMembers-g.membersBesides(group)), readAt: at}
	g.enter(group, e)
	return e, nil
}

// membersBesides counts the members of every group but group. g.mu is
// held.
func (g *groupMembers) membersBesides(group string) int {
	return len(g.byMember) - len(g.groups[group].members)
}

// enter replaces group's entry by e, or drops it when e has no member.
// g.mu is held.
func (g *groupMembers) enter(group string, e groupEntry) {
	for m := range g.groups[group].members {
		if g.byMember[m] == group {
			delete(g.byMember, m)
		}
	}
	if len(e.members) == 0 {
		delete(g.groups, group)
		return
	}
	g.groups[group] = e
	for m := range e.members {
		g.byMember[m] = group
	}
}

// groupOf returns the group consumer whose filters include direct's (an
// agent's direct consumer), or "" when none does. It lists the stream's
// consumers when the map does not know direct and its last listing
// started before since, or is older than groupsListedFor.
func (g *groupMembers) groupOf(ctx context.Context, direct string, since time.Time) (string, error) {
	g.mu.Lock()
	group, listedAt := g.byMember[direct], g.listedAt
	g.mu.Unlock()
	if group != "" || !listedAt.Before(since) && time.Since(listedAt) < groupsListedFor {
		return group, nil
	}
	if err := g.list(ctx, since); err != nil {
		return "", err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.byMember[direct], nil
}

// list rebuilds the map from the stream's consumers, unless a listing
// that started at or after since completed meanwhile.
func (g *groupMembers) list(ctx context.Context, since time.Time) error {
	g.listing.Lock()
	defer g.listing.Unlock()
	g.mu.Lock()
	done := !g.listedAt.Before(since)
	g.mu.Unlock()
	if done {
		return nil
	}
	at := time.Now()
	mesh, err := g.js.Stream(ctx, g.scheme.Stream())
	if err != nil {
		return fmt.Errorf("ackmonitor: listing group consumers: %w", err)
	}
	found := map[string]groupEntry{}
	catchUps := map[string]map[string]string{}
	n := 0
	lister := mesh.ListConsumers(ctx)
	for info := range lister.Info() {
		if !g.isGroup(info.Name) {
			if _, ok := info.Config.Metadata[subjects.CatchUpKey]; ok && len(catchUps) < maxGroupMembers {
				catchUps[info.Name] = info.Config.Metadata
			}
			continue
		}
		e := groupEntry{members: g.membersOf(filtersOf(info.Config), maxGroupMembers-n), readAt: at}
		if len(e.members) > 0 {
			found[info.Name] = e
			n += len(e.members)
		}
	}
	if err := lister.Err(); err != nil {
		return fmt.Errorf("ackmonitor: listing group consumers: %w", err)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for name, e := range g.groups {
		if e.readAt.After(at) {
			found[name] = e // read since the listing started
		}
	}
	g.groups, g.byMember, g.listedAt = map[string]groupEntry{}, map[string]string{}, at
	for name, e := range found {
		g.enter(name, e)
	}
	for name, md := range catchUps {
		g.noteCatchUp(name, md)
	}
	return nil
}

// filtersOf returns the filters of a consumer configuration, whichever
// field holds them.
func filtersOf(cfg jetstream.ConsumerConfig) []string {
	if cfg.FilterSubject == "" {
		return cfg.FilterSubjects
	}
	return append(slices.Clip(cfg.FilterSubjects), cfg.FilterSubject)
}
