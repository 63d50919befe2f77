package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"text/tabwriter"

	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/dlq"
	"github.com/spf13/cobra"
)

func (a *app) dlqCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "dlq",
		Short: "List and replay dead letters (stream MESH_DLQ)",
		Long: `The ack monitor copies messages that exhausted their delivery attempts, or
were terminated, to the dead-letter stream MESH_DLQ on subjects
mesh.dlq.<receiver>.<priority>.<sender>, keeping the original headers and body.` + exitCodesHelp,
	}
	var limit int
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List dead letters",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if limit < 1 {
				return usageErr(fmt.Errorf("--limit %d: must be at least 1", limit))
			}
			return a.dlqList(cmd.Context(), limit)
		},
	}
	ls.Flags().IntVar(&limit, "limit", 100, "show at most this many (the newest)")
	var all bool
	replay := &cobra.Command{
		Use:   "replay <seq>... | --all",
		Short: "Send dead letters back to their original subject",
		Long: `replay republishes each dead letter's original envelope, unchanged, to the
subject it was first sent on (for direct messages mesh.agent.<receiver>.<priority>.<sender>),
with the original Mesh-* headers and Mesh-Replay-Of: <dead letter seq>. The
publish's Nats-Msg-Id is "<message_id>:replay:<seq>", so replaying the same dead
letter twice within the stream's duplicate window (2 minutes) stores it once;
the envelope's message_id stays the original's. Dead letters stay in MESH_DLQ.` + exitCodesHelp,
		RunE: func(cmd *cobra.Command, args []string) error {
			if all == (len(args) > 0) {
				return usageErr(errors.New("give dead-letter sequence numbers or --all, not both"))
			}
			var seqs []uint64
			for _, s := range args {
				n, err := strconv.ParseUint(s, 10, 64)
				if err != nil {
					return usageErr(fmt.Errorf("sequence %q: %w", s, err))
				}
				if n == 0 {
					return usageErr(errors.New("sequence 0: stream sequences start at 1"))
				}
				seqs = append(seqs, n)
			}
			return a.dlqReplay(cmd.Context(), seqs, all)
		},
	}
	replay.Flags().BoolVar(&all, "all", false, "replay every dead letter")
	cmd.AddCommand(ls, replay)
	return cmd
}

func (a *app) dlqList(ctx context.Context, limit int) error {
	ctx, cancel := opTimeout(ctx)
	defer cancel()
	nc, js, err := a.jetStream(ctx, "agentmesh-dlq")
	if err != nil {
		return err
	}
	defer nc.Close()
	letters, err := dlq.Read(ctx, js, a.scheme(), limit)
	if errors.Is(err, dlq.ErrNoStream) {
		fmt.Fprintf(a.stdout, "no dead letters (stream %s does not exist: the ack monitor creates it)\n", a.scheme().DLQStream())
		return nil
	}
	if err != nil {
		return err
	}
	if len(letters) == 0 {
		fmt.Fprintln(a.stdout, "no dead letters")
		return nil
	}
	tw := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SEQ\tTIME\tRECEIVER\tPRIORITY\tSENDER\tACTION\tSTATUS\tDELIVERIES\tREASON\tMESSAGE ID")
	for _, l := range letters {
		sub, _ := a.scheme().Parse(l.Subject)
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", l.Seq, l.Time.Local().Format("01-02 15:04:05"),
			sub.Receiver, sub.Priority, sub.Sender, l.Header.Get(wire.HeaderAction), l.Status(),
			l.Header.Get(dlq.HeaderDeliveries), l.Reason(), l.MessageID())
	}
	return tw.Flush()
}

func (a *app) dlqReplay(ctx context.Context, seqs []uint64, all bool) error {
	ctx, cancel := opTimeout(ctx)
	defer cancel()
	nc, js, err := a.jetStream(ctx, "agentmesh-dlq")
	if err != nil {
		return err
	}
	defer nc.Close()
	var letters []dlq.Letter
	if all {
		if letters, err = dlq.Read(ctx, js, a.scheme(), 0); err != nil {
			return err
		}
	} else {
		for _, seq := range seqs {
			l, err := dlq.Get(ctx, js, a.scheme(), seq)
			if err != nil {
				return err
			}
			letters = append(letters, l)
		}
	}
	failed := 0
	for _, l := range letters {
		r, err := dlq.Replay(ctx, js, a.scheme(), l)
		if err != nil {
			failed++
			fmt.Fprintf(a.stderr, "dead letter %d: %v\n", l.Seq, err)
			continue
		}
		dup := ""
		if r.Duplicate {
			dup = " (already replayed: duplicate)"
		}
		fmt.Fprintf(a.stdout, "replayed dead letter %d to %s as %s seq %d%s\n", l.Seq, r.Subject, r.Stream, r.Sequence, dup)
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d dead letters not replayed", failed, len(letters))
	}
	if len(letters) == 0 {
		fmt.Fprintln(a.stdout, "no dead letters")
	}
	return nil
}
