package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/agentmesh-io/agentmesh/agentkit/permission"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/dlq"
)

func (a *app) dlqCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "dlq",
		Short: "List, replay and remove dead letters (stream MESH_DLQ)",
		Long: `The ack monitor copies messages that exhausted their delivery attempts, or
were terminated, to the dead-letter stream MESH_DLQ on subjects
mesh.dlq.<receiver>.<priority>.<sender>, keeping the original headers and body.

A dead letter stays in MESH_DLQ until it is removed (dlq rm, or dlq replay
--remove) or ages out: removing it is how it is marked resolved.` + exitCodesHelp,
		// Without RunE cobra prints the help for any argument and exits
		// 0, so a mistyped subcommand would look like success.
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usageErr(fmt.Errorf("unknown command %q for %q", args[0], cmd.CommandPath()))
			}
			return cmd.Help()
		},
	}
	var (
		limit  int
		asJSON bool
	)
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List dead letters",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if limit < 1 {
				return usageErr(fmt.Errorf("--limit %d: must be at least 1", limit))
			}
			return a.dlqList(cmd.Context(), limit, asJSON)
		},
	}
	ls.Flags().IntVar(&limit, "limit", 100, "show at most this many (the newest)")
	ls.Flags().BoolVar(&asJSON, "json", false, "print the dead letters as JSON (one array, oldest first)")
	var all, remove, dryRun bool
	replay := &cobra.Command{
		Use:   "replay <seq>... | --all",
		Short: "Send dead letters back to their original subject",
		Long: `replay republishes each dead letter's original envelope, unchanged, to the
subject it was first sent on (for direct messages mesh.agent.<receiver>.<priority>.<sender>),
with the original Mesh-* headers and Mesh-Replay-Of: <dead letter seq>. The
publish's Nats-Msg-Id is "<message_id>:replay:<seq>", so replaying the same dead
letter twice within the stream's duplicate window (2 minutes) stores it once;
the envelope's message_id stays the original's. Dead letters stay in MESH_DLQ
unless --remove is given: then each one is removed once its replay is stored.
--dry-run prints what would be sent where and sends nothing.` + exitCodesHelp,
		RunE: func(cmd *cobra.Command, args []string) error {
			if !all && len(args) == 0 {
				return usageErr(errors.New("give dead-letter sequence numbers or --all"))
			}
			if all && len(args) > 0 {
				return usageErr(errors.New("give dead-letter sequence numbers or --all, not both"))
			}
			if dryRun && remove {
				return usageErr(errors.New("--dry-run conflicts with --remove"))
			}
			seqs, err := parseSeqs(args)
			if err != nil {
				return err
			}
			return a.dlqReplay(cmd.Context(), seqs, all, dryRun, remove)
		},
	}
	replay.Flags().BoolVar(&all, "all", false, "replay every dead letter")
	replay.Flags().BoolVar(&remove, "remove", false, "remove each dead letter once its replay is stored (resolves it)")
	replay.Flags().BoolVar(&dryRun, "dry-run", false, "print what would be replayed where; send nothing")
	rm := &cobra.Command{
		Use:   "rm <seq>...",
		Short: "Remove dead letters (mark them resolved)",
		Long: `rm deletes the dead letters at the given sequences from MESH_DLQ, for dead
letters that were handled some other way or are given up on. It needs
credentials that may delete messages of the stream (an administrator's).` + exitCodesHelp,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usageErr(errors.New("give the sequence numbers of the dead letters to remove"))
			}
			seqs, err := parseSeqs(args)
			if err != nil {
				return err
			}
			return a.dlqRemove(cmd.Context(), seqs)
		},
	}
	cmd.AddCommand(ls, replay, rm)
	return cmd
}

// parseSeqs parses dead-letter sequence numbers.
func parseSeqs(args []string) ([]uint64, error) {
	var seqs []uint64
	for _, s := range args {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return nil, usageErr(fmt.Errorf("sequence %q: %w", s, err))
		}
		if n == 0 {
			return nil, usageErr(errors.New("sequence 0: stream sequences start at 1"))
		}
		seqs = append(seqs, n)
	}
	return seqs, nil
}

// letterJSON is one dead letter as dlq ls --json prints it.
type letterJSON struct {
	Seq        uint64          `json:"seq"`
	Time       time.Time       `json:"time"`
	Subject    string          `json:"subject"`
	Receiver   string          `json:"receiver,omitempty"`
	Priority   string          `json:"priority,omitempty"`
	Sender     string          `json:"sender,omitempty"`
	Action     string          `json:"action,omitempty"`
	Status     string          `json:"status,omitempty"`
	Reason     string          `json:"reason,omitempty"`
	Deliveries int             `json:"deliveries,omitempty"`
	Consumer   string          `json:"consumer,omitempty"`
	MessageID  string          `json:"message_id,omitempty"`
	Original   string          `json:"original_subject,omitempty"`
	Envelope   json.RawMessage `json:"envelope,omitempty"`
}

func (a *app) dlqList(ctx context.Context, limit int, asJSON bool) error {
	ctx, cancel := opTimeout(ctx)
	defer cancel()
	ctx, js, done, err := a.watchedJetStream(ctx, "agentmesh-dlq")
	if err != nil {
		return err
	}
	defer done()
	letters, err := dlq.Read(ctx, js, a.scheme(), limit)
	err = denied(ctx, err, "")
	if errors.Is(err, dlq.ErrNoStream) {
		if asJSON {
			_, err := fmt.Fprintln(a.stdout, "[]")
			return err
		}
		fmt.Fprintf(a.stdout, "no dead letters (stream %s does not exist: the ack monitor creates it)\n", a.scheme().DLQStream())
		return nil
	}
	if err != nil {
		return err
	}
	if asJSON {
		out := make([]letterJSON, 0, len(letters))
		for _, l := range letters {
			sub, _ := a.scheme().Parse(l.Subject)
			j := letterJSON{Seq: l.Seq, Time: l.Time, Subject: l.Subject, Receiver: sub.Receiver, Priority: sub.Priority,
				Sender: sub.Sender, Action: l.Action(), Status: l.Status(), Reason: l.Reason(),
				Deliveries: l.Deliveries(), Consumer: l.Consumer(), MessageID: l.MessageID(), Original: l.Header.Get(dlq.HeaderSubject)}
			if json.Valid(l.Data) {
				j.Envelope = l.Data
			}
			out = append(out, j)
		}
		enc := json.NewEncoder(a.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
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
			sub.Receiver, sub.Priority, sub.Sender, l.Action(), l.Status(),
			l.Header.Get(dlq.HeaderDeliveries), l.Reason(), l.MessageID())
	}
	return tw.Flush()
}

func (a *app) dlqReplay(ctx context.Context, seqs []uint64, all, dryRun, remove bool) error {
	ctx, cancel := opTimeout(ctx)
	defer cancel()
	ctx, js, done, err := a.watchedJetStream(ctx, "agentmesh-dlq")
	if err != nil {
		return err
	}
	defer done()
	letters, err := a.dlqLetters(ctx, js, seqs, all)
	if err != nil {
		return denied(ctx, err, "")
	}
	failed := 0
	for _, l := range letters {
		if dryRun {
			msg, err := dlq.ReplayMsg(a.scheme(), l)
			if err != nil {
				failed++
				fmt.Fprintf(a.stderr, "dead letter %d: %v\n", l.Seq, err)
				continue
			}
			fmt.Fprintf(a.stdout, "would replay dead letter %d (%s %s, message_id=%s) to %s\n", l.Seq,
				msg.Header.Get(wire.HeaderType), l.Action(), l.MessageID(), msg.Subject)
			continue
		}
		r, err := dlq.Replay(ctx, js, a.scheme(), l)
		if err = denied(ctx, err, ""); err != nil {
			if errors.Is(err, permission.ErrDenied) {
				return err // the rest would be refused the same way
			}
			failed++
			fmt.Fprintf(a.stderr, "dead letter %d: %v\n", l.Seq, err)
			continue
		}
		dup := ""
		if r.Duplicate {
			dup = " (already replayed: duplicate)"
		}
		fmt.Fprintf(a.stdout, "replayed dead letter %d to %s as %s seq %d%s\n", l.Seq, r.Subject, r.Stream, r.Sequence, dup)
		if remove {
			if err := denied(ctx, dlq.Remove(ctx, js, a.scheme(), l.Seq), ""); err != nil {
				failed++
				fmt.Fprintf(a.stderr, "dead letter %d: replayed but not removed: %v\n", l.Seq, err)
				continue
			}
			fmt.Fprintf(a.stdout, "removed dead letter %d\n", l.Seq)
		}
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d dead letters failed", failed, len(letters))
	}
	if len(letters) == 0 {
		fmt.Fprintln(a.stdout, "no dead letters")
	}
	return nil
}

// dlqLetters reads the dead letters at seqs, or all of them.
func (a *app) dlqLetters(ctx context.Context, js jetstream.JetStream, seqs []uint64, all bool) ([]dlq.Letter, error) {
	if all {
		return dlq.Read(ctx, js, a.scheme(), 0)
	}
	letters := make([]dlq.Letter, 0, len(seqs))
	for _, seq := range seqs {
		l, err := dlq.Get(ctx, js, a.scheme(), seq)
		if err != nil {
			return nil, err
		}
		letters = append(letters, l)
	}
	return letters, nil
}

func (a *app) dlqRemove(ctx context.Context, seqs []uint64) error {
	ctx, cancel := opTimeout(ctx)
	defer cancel()
	ctx, js, done, err := a.watchedJetStream(ctx, "agentmesh-dlq")
	if err != nil {
		return err
	}
	defer done()
	failed := 0
	for _, seq := range seqs {
		if err := denied(ctx, dlq.Remove(ctx, js, a.scheme(), seq), ""); err != nil {
			if errors.Is(err, dlq.ErrNoStream) || errors.Is(err, permission.ErrDenied) {
				return err
			}
			failed++
			fmt.Fprintln(a.stderr, err)
			continue
		}
		fmt.Fprintf(a.stdout, "removed dead letter %d\n", seq)
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d dead letters not removed", failed, len(seqs))
	}
	return nil
}
