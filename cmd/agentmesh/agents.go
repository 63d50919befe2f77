package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/agentmesh-io/agentmesh/agentkit/registry"
	"github.com/agentmesh-io/agentmesh/subjects"
)

func (a *app) agentsCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "agents",
		Short: "List the agent registry (KV bucket mesh_registry)",
		Long: `agents prints the agent registry: one row per agent with its id, type,
status, capabilities and last heartbeat. It reads KV bucket mesh_registry,
where every agentkit agent instance keeps the key agent.<id>.<instance>
renewed by its heartbeats (registry.View); instances of one agent are
merged into one row. An agent whose heartbeats stopped shows UNAVAILABLE:
the server leaves a marker when its key expires, kept for a week. A registry
bucket created by an older version may keep no markers: then an agent whose
instance crashed is not listed once its key expired (or is listed as its
earlier instances went), and agents says so; agentmesh migrate adds them.

Without the bucket (no agent has registered yet) it says so and exits 0.` + exitCodesHelp,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := opTimeout(cmd.Context())
			defer cancel()
			ctx, js, done, err := a.watchedJetStream(ctx, "agentmesh-agents")
			if err != nil {
				return err
			}
			defer done()
			return denied(ctx, a.listAgents(ctx, js, asJSON), "reading the registry needs the monitor's or an administrator's credentials")
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the records as JSON")
	return cmd
}

func (a *app) listAgents(ctx context.Context, js jetstream.JetStream, asJSON bool) error {
	bucket := a.scheme().RegistryBucket()
	reg, err := registry.Open(ctx, js, a.scheme(), a.cfg.Mesh.Replicas, false)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		fmt.Fprintf(a.stdout, "no registry (KV bucket %s does not exist: no agent has registered)\n", bucket)
		return nil
	}
	if err != nil {
		return err
	}
	defer reg.Close()
	a.warnMarkerless(ctx, js, bucket)
	recs, err := reg.Find(ctx, registry.Query{})
	if err != nil {
		return err
	}
	slices.SortFunc(recs, func(x, y registry.Agent) int { return strings.Compare(x.ID, y.ID) })
	if asJSON {
		enc := json.NewEncoder(a.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(recs)
	}
	if len(recs) == 0 {
		fmt.Fprintf(a.stdout, "registry %s is empty\n", bucket)
		return nil
	}
	tw := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tTYPE\tSTATUS\tINSTANCES\tLOAD\tDIRECTOR\tCAPABILITIES\tLAST HEARTBEAT")
	for _, r := range recs {
		var caps []string
		for _, c := range r.Capabilities {
			caps = append(caps, c.Name+"("+strings.Join(c.Actions, ",")+")")
		}
		status := string(r.Status)
		if r.Degraded {
			status += " (degraded)"
		}
		hb := "-"
		if !r.LastHeartbeat.IsZero() {
			hb = fmt.Sprintf("%s ago", time.Since(r.LastHeartbeat).Round(time.Second))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%.2f\t%s\t%s\t%s\n", r.ID, r.Type, status, r.Instances, r.Load, r.Director, strings.Join(caps, " "), hb)
	}
	return tw.Flush()
}

// warnMarkerless tells the operator, on stderr, when the registry bucket
// keeps no markers of expired keys: the list then cannot show crashed
// instances whose keys expired. It says nothing when it cannot tell.
func (a *app) warnMarkerless(ctx context.Context, js jetstream.JetStream, bucket string) {
	st, err := js.Stream(ctx, subjects.KVStream(bucket))
	if err != nil || st.CachedInfo().Config.SubjectDeleteMarkerTTL > 0 {
		return
	}
	fmt.Fprintf(a.stderr, "note: registry bucket %s keeps no markers of expired keys, so an agent whose instances crashed is missing or shows how an earlier instance went; agentmesh migrate adds them\n", bucket)
}
