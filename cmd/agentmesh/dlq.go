package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// Headers the ack monitor adds to a dead letter (ackmonitor/escalate.go);
// the original message's headers are kept beside them.
const (
	hdrDLQReason     = "Mesh-Dlq-Reason"
	hdrDLQStatus     = "Mesh-Dlq-Status"
	hdrDLQDeliveries = "Mesh-Dlq-Deliveries"
	hdrDLQConsumer   = "Mesh-Dlq-Consumer"
	hdrDLQStreamSeq  = "Mesh-Dlq-Stream-Seq"
	hdrDLQSubject    = "Mesh-Dlq-Subject"
	hdrDLQOriginalID = "Mesh-Dlq-Original-Id"
	// hdrReplayOf marks a replayed message with the dead letter's sequence.
	hdrReplayOf = "Mesh-Replay-Of"
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

// deadLetter is one MESH_DLQ message.
type deadLetter struct {
	seq  uint64
	time time.Time
	msg  *nats.Msg
}

// readDLQ returns the dead letters, oldest first; a missing stream is no
// dead letters (found false).
func readDLQ(ctx context.Context, js jetstream.JetStream, scheme subjects.Scheme) (letters []deadLetter, found bool, err error) {
	st, err := js.Stream(ctx, scheme.DLQStream())
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	info, err := st.Info(ctx)
	if err != nil {
		return nil, true, err
	}
	if info.State.Msgs == 0 {
		return nil, true, nil
	}
	cons, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverAllPolicy})
	if err != nil {
		return nil, true, err
	}
	for {
		batch, err := cons.Fetch(256, jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			return nil, true, err
		}
		n, done := 0, false
		for m := range batch.Messages() {
			n++
			md, err := m.Metadata()
			if err != nil {
				continue
			}
			letters = append(letters, deadLetter{seq: md.Sequence.Stream, time: md.Timestamp,
				msg: &nats.Msg{Subject: m.Subject(), Header: m.Headers(), Data: m.Data()}})
			if md.Sequence.Stream >= info.State.LastSeq || md.NumPending == 0 {
				done = true
			}
		}
		if done || n == 0 {
			return letters, true, nil
		}
	}
}

func (a *app) dlqList(ctx context.Context, limit int) error {
	ctx, cancel := opTimeout(ctx)
	defer cancel()
	nc, js, err := a.jetStream(ctx, "agentmesh-dlq")
	if err != nil {
		return err
	}
	defer nc.Close()
	letters, found, err := readDLQ(ctx, js, a.scheme())
	if err != nil {
		return err
	}
	if !found {
		fmt.Fprintf(a.stdout, "no dead letters (stream %s does not exist: the ack monitor creates it)\n", a.scheme().DLQStream())
		return nil
	}
	if len(letters) == 0 {
		fmt.Fprintln(a.stdout, "no dead letters")
		return nil
	}
	if len(letters) > limit {
		letters = letters[len(letters)-limit:]
	}
	tw := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SEQ\tTIME\tRECEIVER\tPRIORITY\tSENDER\tACTION\tSTATUS\tDELIVERIES\tREASON\tMESSAGE ID")
	for _, l := range letters {
		h := l.msg.Header
		sub, _ := a.scheme().Parse(l.msg.Subject)
		id := h.Get(hdrDLQOriginalID)
		if id == "" {
			id = h.Get(agentkit.HeaderMsgID)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", l.seq, l.time.Local().Format("01-02 15:04:05"),
			sub.Receiver, sub.Priority, sub.Sender, h.Get(agentkit.HeaderAction), h.Get(hdrDLQStatus),
			h.Get(hdrDLQDeliveries), h.Get(hdrDLQReason), id)
	}
	return tw.Flush()
}

// replayMsg builds the message that sends dead letter l back.
func replayMsg(scheme subjects.Scheme, l deadLetter) (*nats.Msg, error) {
	h := l.msg.Header
	target := h.Get(hdrDLQSubject)
	if target == "" {
		// No original subject recorded: rebuild the direct subject from
		// the dead letter's mesh.dlq.<receiver>.<priority>.<sender>.
		sub, err := scheme.Parse(l.msg.Subject)
		if err != nil || sub.Kind != subjects.KindDLQ {
			return nil, fmt.Errorf("dead letter %d: subject %q is not a dead-letter subject", l.seq, l.msg.Subject)
		}
		if target, err = scheme.Direct(sub.Receiver, sub.Priority, sub.Sender); err != nil {
			return nil, err
		}
	}
	if _, err := scheme.Parse(target); err != nil {
		return nil, fmt.Errorf("dead letter %d: original subject: %w", l.seq, err)
	}
	if _, err := agentkit.Decode(l.msg.Data); err != nil {
		return nil, fmt.Errorf("dead letter %d: body: %w", l.seq, err)
	}
	out := nats.Header{}
	for k, v := range h {
		if strings.HasPrefix(k, "Mesh-Dlq-") || strings.HasPrefix(k, "Nats-") {
			continue
		}
		out[k] = append([]string(nil), v...)
	}
	id := h.Get(hdrDLQOriginalID)
	if id == "" {
		id, _, _ = strings.Cut(h.Get(agentkit.HeaderMsgID), ":")
	}
	out.Set(agentkit.HeaderMsgID, fmt.Sprintf("%s:replay:%d", id, l.seq))
	out.Set(hdrReplayOf, strconv.FormatUint(l.seq, 10))
	return &nats.Msg{Subject: target, Header: out, Data: l.msg.Data}, nil
}

func (a *app) dlqReplay(ctx context.Context, seqs []uint64, all bool) error {
	ctx, cancel := opTimeout(ctx)
	defer cancel()
	nc, js, err := a.jetStream(ctx, "agentmesh-dlq")
	if err != nil {
		return err
	}
	defer nc.Close()
	var letters []deadLetter
	if all {
		var found bool
		if letters, found, err = readDLQ(ctx, js, a.scheme()); err != nil {
			return err
		} else if !found {
			return fmt.Errorf("stream %s does not exist", a.scheme().DLQStream())
		}
	} else {
		st, err := js.Stream(ctx, a.scheme().DLQStream())
		if err != nil {
			return fmt.Errorf("stream %s: %w", a.scheme().DLQStream(), err)
		}
		for _, seq := range seqs {
			raw, err := st.GetMsg(ctx, seq)
			if err != nil {
				return fmt.Errorf("dead letter %d: %w", seq, err)
			}
			letters = append(letters, deadLetter{seq: seq, time: raw.Time, msg: &nats.Msg{Subject: raw.Subject, Header: raw.Header, Data: raw.Data}})
		}
	}
	failed := 0
	for _, l := range letters {
		msg, err := replayMsg(a.scheme(), l)
		if err == nil {
			var ack *jetstream.PubAck
			ack, err = js.PublishMsg(ctx, msg)
			if err == nil {
				dup := ""
				if ack.Duplicate {
					dup = " (already replayed: duplicate)"
				}
				fmt.Fprintf(a.stdout, "replayed dead letter %d to %s as %s seq %d%s\n", l.seq, msg.Subject, ack.Stream, ack.Sequence, dup)
				continue
			}
		}
		failed++
		fmt.Fprintf(a.stderr, "dead letter %d: %v\n", l.seq, err)
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d dead letters not replayed", failed, len(letters))
	}
	if len(letters) == 0 {
		fmt.Fprintln(a.stdout, "no dead letters")
	}
	return nil
}
