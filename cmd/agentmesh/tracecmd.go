package main

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/agentmesh-io/agentmesh/cmd/agentmesh/internal/trace"
)

func (a *app) traceCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "trace <correlation-id>",
		Short: "Print a conversation as a tree, read back from the MESH stream",
		Long: `trace scans the mesh stream's headers (an ordered, headers-only consumer) for
messages whose Mesh-Correlation-Id is the given id, fetches their bodies and
prints them as a tree: each reply under the message it answers (in_reply_to),
with sender → receiver, message type, action, priority, task, status or error,
the time offset from the first message and the stream sequence; a replayed
dead letter is marked "replay of dead letter N". Each direct message ends with
its outcome, from its receiver's consumer and the dead letters: acked, pending
(not delivered yet), delivered, not settled (being handled or retried),
dead-lettered (exhausted or terminated: the ack monitor's dead letter), or no
consumer. Without a dead-letter stream (no ack monitor ran) an acked and an
exhausted message both show as settled.` + exitCodesHelp,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usageErr(fmt.Errorf("trace takes one correlation id, got %d arguments", len(args)))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := opTimeout(cmd.Context())
			defer cancel()
			ctx, js, done, err := a.watchedJetStream(ctx, "agentmesh-trace")
			if err != nil {
				return err
			}
			defer done()
			entries, err := trace.Read(ctx, js, a.scheme(), args[0])
			if err != nil {
				return denied(ctx, err, fmt.Sprintf("trace reads all of stream %s, which an agent's own credentials may not; use the monitor's or the admin's", a.scheme().Stream()))
			}
			if err := trace.AddOutcomes(ctx, js, a.scheme(), entries); err != nil {
				return denied(ctx, err, "")
			}
			roots := trace.Build(entries)
			if asJSON {
				enc := json.NewEncoder(a.stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(roots)
			}
			if len(entries) == 0 {
				return fmt.Errorf("no messages with correlation id %q in stream %s", args[0], a.scheme().Stream())
			}
			fmt.Fprintf(a.stdout, "correlation %s: %d messages from %s\n", args[0], len(entries), entries[0].Time.Format(time.RFC3339Nano))
			return trace.Render(a.stdout, roots, a.scheme(), time.Time{})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the tree as JSON")
	return cmd
}
