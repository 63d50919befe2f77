package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/agentmesh-io/agentmesh/subjects"
)

// maxReplicas is the most replicas a JetStream stream may have.
const maxReplicas = 5

// Error codes of the server's refusals of a scale-up, as JetStream's API
// numbers them (nats.go names only some).
const (
	errCodeNoPeers          jetstream.ErrorCode = 10005 // no suitable peers for placement
	errCodeInsufficient     jetstream.ErrorCode = 10023 // insufficient resources
	errCodeNotClusteredMode jetstream.ErrorCode = 10074 // replicas > 1 not supported in non-clustered mode
)

func (a *app) streamsCmd() *cobra.Command {
	var (
		replicas int
		dryRun   bool
		asJSON   bool
	)
	cmd := &cobra.Command{
		Use:   "streams",
		Short: "Show the mesh's streams and stores, their replicas and leaders; scale them up",
		Long: `streams lists the streams and stores of the mesh: the message stream, the ack
monitor's events and dead-letter streams, the registry, shared-state and session
KV buckets and the object store of large payloads (KV buckets and object stores
are streams too). For each: its replica count, the server leading it, the state
of every other replica (current, behind by so many operations, offline), its
messages, bytes and consumers; one not created yet says so.

--replicas N scales every existing one with fewer than N replicas up to N, and
prints what changed. Why: an agent or monitor asking for N replicas
(WithReplicas, mesh.replicas) refuses to start on a stream or bucket with fewer,
because opening never changes what exists, and a store on fewer replicas than
its users believe loses what they think is safe when one server fails. Scale
the streams up with this command, then start the agents or the monitor. It
never lowers a replica count: one with more than N is left as it is. The
server copies a stream to its new replicas in the background; run streams
again to see them current. Consumers that set no replica count of their own
(agentkit's do not) follow their stream.

The server refuses a scale-up it cannot place: N replicas need a JetStream
cluster of at least N servers, online and with room. Each refusal is reported
with the server's reason, the others are still scaled, and the exit code is 1.
--dry-run prints what would change and changes nothing.

Listing needs credentials that may read stream information; scaling,
credentials that may update streams (an administrator's).` + exitCodesHelp,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			scale := cmd.Flags().Changed("replicas")
			switch {
			case scale && (replicas < 1 || replicas > maxReplicas):
				return usageErr(fmt.Errorf("--replicas %d: must be 1 to %d", replicas, maxReplicas))
			case scale && asJSON:
				return usageErr(errors.New("--json lists the streams; it does not combine with --replicas"))
			case dryRun && !scale:
				return usageErr(errors.New("--dry-run goes with --replicas"))
			case scale:
				return a.streamsScale(cmd.Context(), replicas, dryRun)
			}
			return a.streamsList(cmd.Context(), asJSON)
		},
	}
	cmd.Flags().IntVar(&replicas, "replicas", 0, "scale every stream and store with fewer replicas up to this many (1 to 5)")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "with --replicas: print what would change; change nothing")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the streams as JSON (one array)")
	return cmd
}

// meshStream is one stream of the mesh and what it holds.
type meshStream struct {
	name  string
	holds string
}

// meshStreams returns the mesh's streams, KV buckets and object store
// under scheme, as the server names their streams.
func meshStreams(s subjects.Scheme) []meshStream {
	return []meshStream{
		{s.Stream(), "messages"},
		{s.EventsStream(), "ack events (monitor)"},
		{s.DLQStream(), "dead letters (monitor)"},
		{subjects.KVStream(s.RegistryBucket()), "registry (KV)"},
		{subjects.KVStream(s.StateBucket()), "shared state (KV)"},
		{subjects.KVStream(s.SessionsBucket()), "sessions (KV)"},
		{subjects.ObjectStream(s.PayloadsBucket()), "large payloads (object store)"},
	}
}

// streamInfo returns the information of stream name, nil if it does not
// exist.
func streamInfo(ctx context.Context, js jetstream.JetStream, name string) (*jetstream.StreamInfo, error) {
	st, err := js.Stream(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", name, err)
	}
	return st.CachedInfo(), nil
}

// streamJSON is one stream as streams --json prints it.
type streamJSON struct {
	Name    string `json:"name"`
	Holds   string `json:"holds"`
	Created bool   `json:"created"`
	// The rest is set only for a stream that exists.
	Replicas int    `json:"replicas,omitempty"`
	Cluster  string `json:"cluster,omitempty"`
	Leader   string `json:"leader,omitempty"`
	// Peers are the replicas besides the leader.
	Peers []peerJSON `json:"peers,omitempty"`
	// Reconfiguring is what the server is doing to reach the stream's
	// configured replicas, while it is.
	Reconfiguring string `json:"reconfiguring,omitempty"`
	Messages      uint64 `json:"messages"`
	Bytes         uint64 `json:"bytes"`
	Consumers     int    `json:"consumers"`
}

// peerJSON is one replica of a stream besides its leader.
type peerJSON struct {
	Name    string `json:"name"`
	Current bool   `json:"current"`
	Offline bool   `json:"offline,omitempty"`
	// Joining: assigned to the stream, not yet one of its replicas.
	Joining bool `json:"joining,omitempty"`
	// Lag is how many operations it is behind the leader.
	Lag uint64 `json:"lag,omitempty"`
}

// describeStream returns ms as streams lists it; info is nil when ms
// does not exist.
func describeStream(ms meshStream, info *jetstream.StreamInfo) streamJSON {
	j := streamJSON{Name: ms.name, Holds: ms.holds, Created: info != nil}
	if info == nil {
		return j
	}
	j.Replicas = max(info.Config.Replicas, 1)
	j.Messages, j.Bytes, j.Consumers = info.State.Msgs, info.State.Bytes, info.State.Consumers
	if c := info.Cluster; c != nil {
		j.Cluster, j.Leader = c.Name, c.Leader
		for _, p := range c.Replicas {
			j.Peers = append(j.Peers, peerJSON{Name: p.Name, Current: p.Current, Offline: p.Offline, Joining: p.Pending, Lag: p.Lag})
		}
		if d := c.Desired; d != nil {
			j.Reconfiguring = "in progress"
			if d.Status != nil && d.Status.Description != "" {
				j.Reconfiguring = d.Status.Description
			}
		}
	}
	return j
}

func (a *app) streamsList(ctx context.Context, asJSON bool) error {
	ctx, cancel := opTimeout(ctx)
	defer cancel()
	ctx, js, done, err := a.watchedJetStream(ctx, "agentmesh-streams")
	if err != nil {
		return err
	}
	defer done()
	var out []streamJSON
	for _, ms := range meshStreams(a.scheme()) {
		info, err := streamInfo(ctx, js, ms.name)
		if err != nil {
			return denied(ctx, err, "streams needs credentials that may read stream information (an administrator's)")
		}
		out = append(out, describeStream(ms, info))
	}
	if asJSON {
		enc := json.NewEncoder(a.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	return printStreams(a.stdout, out)
}

func printStreams(w io.Writer, streams []streamJSON) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "STREAM\tHOLDS\tREPLICAS\tLEADER\tOTHER REPLICAS\tMESSAGES\tBYTES\tCONSUMERS")
	for _, s := range streams {
		if !s.Created {
			fmt.Fprintf(tw, "%s\t%s\tnot created\t\t\t\t\t\n", s.Name, s.Holds)
			continue
		}
		leader := s.Leader
		if leader == "" {
			leader = "none"
		}
		fmt.Fprintf(tw, "%s\t%s\tR%d\t%s\t%s\t%d\t%s\t%d\n", s.Name, s.Holds, s.Replicas, leader, peersState(s),
			s.Messages, byteSize(s.Bytes), s.Consumers)
	}
	return tw.Flush()
}

// peersState says how each replica besides the leader is doing.
func peersState(s streamJSON) string {
	var parts []string
	for _, p := range s.Peers {
		switch {
		case p.Offline:
			parts = append(parts, p.Name+" offline")
		case p.Joining:
			parts = append(parts, p.Name+" joining")
		case p.Current:
			parts = append(parts, p.Name+" current")
		default:
			parts = append(parts, fmt.Sprintf("%s behind by %d", p.Name, p.Lag))
		}
	}
	if s.Reconfiguring != "" {
		parts = append(parts, "reconfiguring: "+s.Reconfiguring)
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, ", ")
}

// byteSize prints n in the largest binary unit it fills.
func byteSize(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := uint64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// streamsScale has no overall deadline: each update is one request,
// bounded by the JetStream client's default timeout.
func (a *app) streamsScale(ctx context.Context, want int, dryRun bool) error {
	ctx, js, done, err := a.watchedJetStream(ctx, "agentmesh-streams")
	if err != nil {
		return err
	}
	defer done()
	err = scaleStreams(ctx, js, meshStreams(a.scheme()), want, dryRun, a.stdout)
	return denied(ctx, err, "streams --replicas needs credentials that may update streams (an administrator's)")
}

// scaleStreams raises every stream of streams with fewer than want
// replicas to want, printing each stream's outcome to out. A stream the
// server refuses to scale does not stop the others; the error returned
// then names them all.
func scaleStreams(ctx context.Context, js jetstream.JetStream, streams []meshStream, want int, dryRun bool, out io.Writer) error {
	var refused []string
	var reason string
	changes := 0
	for _, ms := range streams {
		info, err := streamInfo(ctx, js, ms.name)
		if err != nil {
			return err
		}
		if info == nil {
			fmt.Fprintf(out, "%s: not created; whoever creates it chooses its replicas\n", ms.name)
			continue
		}
		have := max(info.Config.Replicas, 1)
		switch {
		case have == want:
			fmt.Fprintf(out, "%s: R%d already\n", ms.name, have)
			continue
		case have > want:
			fmt.Fprintf(out, "%s: R%d, more than the R%d asked for: left as it is (streams never lowers replicas)\n",
				ms.name, have, want)
			continue
		}
		changes++
		if dryRun {
			fmt.Fprintf(out, "%s: would scale from R%d to R%d\n", ms.name, have, want)
			continue
		}
		cfg := info.Config
		cfg.Replicas = want
		if _, err := js.UpdateStream(ctx, cfg); err != nil {
			if ctx.Err() != nil {
				// Cancelled or denied: every further request would end so too.
				return fmt.Errorf("scale stream %s: %w", ms.name, err)
			}
			refused = append(refused, ms.name)
			why := refusal(err, want)
			if reason == "" {
				reason = why
			}
			fmt.Fprintf(out, "%s: the server refused R%d: %s\n", ms.name, want, why)
			continue
		}
		fmt.Fprintf(out, "%s: scaled from R%d to R%d\n", ms.name, have, want)
	}
	switch {
	case len(refused) > 0:
		return fmt.Errorf("%d of %d scale-ups to R%d refused (%s): %s",
			len(refused), changes, want, strings.Join(refused, ", "), reason)
	case changes == 0:
		fmt.Fprintf(out, "nothing to do: no stream has fewer than R%d\n", want)
	case dryRun:
		fmt.Fprintf(out, "dry run: %d streams would be scaled to R%d, none changed\n", changes, want)
	default:
		fmt.Fprintf(out, "scaled %d streams to R%d; the server copies them to their new replicas in the background (agentmesh streams shows them current)\n",
			changes, want)
	}
	return nil
}

// refusal returns the server's refusal of a scale-up to want replicas,
// with what it means when it is that the cluster is too small.
func refusal(err error, want int) string {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return err.Error()
	}
	said := fmt.Sprintf("%s (JetStream error %d)", apiErr.Description, apiErr.ErrorCode)
	switch apiErr.ErrorCode {
	case errCodeNotClusteredMode:
		return fmt.Sprintf("%s: this server is not in a JetStream cluster; R%d needs a cluster of at least %d servers", said, want, want)
	case errCodeNoPeers, errCodeInsufficient:
		return fmt.Sprintf("%s: R%d needs %d servers of the cluster online, with JetStream and room for the stream", said, want, want)
	}
	return said
}
