package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/registry"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
)

// sendFlags are the envelope fields send and request take.
type sendFlags struct {
	from, to, action, payload, priority, correlation, workflow, task, file, typ string
	ttl, timeout                                                                time.Duration
}

func (a *app) sendCmd(request bool) *cobra.Command {
	var f sendFlags
	use, short := "send", "Send a message to an agent (stored; does not wait)"
	long := `send builds an envelope from flags (or reads one from --file, validated like
any received envelope) and stores it in the mesh stream for the receiving agent.
It returns once the stream has stored it and prints the message id; if the
stream already holds the envelope's message_id (sent within its 2-minute
duplicate window, e.g. a --file sent again), it stores nothing and exits 1. A
file's envelope goes to its receiver_id, else its topic, else to every agent
(printed as "broadcast"); with --file the envelope flags are errors.

The message is a notification unless --type request: send does not wait for
a response, and one asked for would be left on the sender's consumers. The
receiver still answers a notification it fails on with an error envelope.
A message to an agent the mesh does not know (no consumer, no registry
entry) is stored anyway, to wait for that agent; send warns on stderr.`
	if request {
		use, short = "request", "Send a request and print the response as JSON"
		long = `request sends a request like send, then waits for the response (matched by
in_reply_to) and prints it as JSON. The CLI is an agent itself (--from, default
"cli"): it gets the durable consumers every agentkit agent has, so the
response is stored and acknowledged like any other message. An error or NACK
reply is printed and exits 1. A message_id the stream already holds (sent
within its duplicate window) is not stored again: the response to the earlier
copy is awaited, which comes only if it has not been received before. A request
to an agent the mesh does not know (no consumer, no registry entry) is sent,
with a warning on stderr, and usually times out.`
	}
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Long: long + `

Examples:
  agentmesh ` + use + ` --to planner_1 --action plan_workflow --priority high \
      --payload '{"operation":"update","target_customer_id":"CUST001"}'
  agentmesh ` + use + ` --file envelope.json` + exitCodesHelp,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.runSend(cmd.Context(), cmd, f, request)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.from, "from", "cli", "sender agent id")
	fl.StringVar(&f.to, "to", "", "receiver agent id")
	fl.StringVar(&f.action, "action", "", "action")
	fl.StringVar(&f.payload, "payload", "", "payload (JSON)")
	fl.StringVar(&f.priority, "priority", "normal", "priority: critical, high, normal (medium), low, batch")
	fl.DurationVar(&f.ttl, "ttl", 0, "time to live (0: none)")
	fl.StringVar(&f.correlation, "correlation", "", "correlation id (default: the message id)")
	fl.StringVar(&f.workflow, "workflow", "", "workflow id")
	fl.StringVar(&f.task, "task", "", "task id")
	fl.StringVar(&f.file, "file", "", "read the envelope from this JSON file (- for stdin) instead of flags")
	if request {
		fl.DurationVar(&f.timeout, "timeout", 30*time.Second, "how long to wait for the response")
	} else {
		// A notification by default: send does not wait, so a response
		// to a request would sit on the sender's consumer until some later
		// process with that id (agentmesh request) consumed and dropped it.
		fl.StringVar(&f.typ, "type", "notification", "message type: notification (no response wanted) or request")
	}
	return cmd
}

// envelopeOptions turns a decoded envelope into send options, so a file's
// fields survive Agent.Request, which builds its own envelope.
func envelopeOptions(e *wire.Envelope) []agentkit.SendOption {
	opts := []agentkit.SendOption{agentkit.WithMessageID(e.MessageID), agentkit.WithPriority(e.Priority)}
	if e.TTLMillis > 0 {
		opts = append(opts, agentkit.WithTTL(time.Duration(e.TTLMillis)*time.Millisecond))
	}
	for _, kv := range []struct {
		v string
		o func(string) agentkit.SendOption
	}{{e.Correlation, agentkit.WithCorrelationID}, {e.WorkflowID, agentkit.WithWorkflowID}, {e.TaskID, agentkit.WithTaskID},
		{e.SessionID, agentkit.WithSessionID}, {e.ReceiverType, agentkit.WithReceiverType}} {
		if kv.v != "" {
			opts = append(opts, kv.o(kv.v))
		}
	}
	for k, v := range e.Metadata {
		opts = append(opts, agentkit.WithMetadata(k, v))
	}
	if len(e.Context) > 0 {
		opts = append(opts, agentkit.WithSessionContext(e.Context))
	}
	return opts
}

// envelopeFlags are the flags that build an envelope, which --file replaces.
var envelopeFlags = []string{"to", "action", "payload", "priority", "ttl", "correlation", "workflow", "task", "type"}

func (a *app) buildEnvelope(cmd *cobra.Command, f sendFlags) (*wire.Envelope, error) {
	if f.file != "" {
		for _, name := range envelopeFlags {
			if cmd.Flags().Changed(name) {
				return nil, usageErr(fmt.Errorf("--%s conflicts with --file: the envelope comes from the file", name))
			}
		}
		var data []byte
		var err error
		if f.file == "-" {
			data, err = io.ReadAll(os.Stdin)
		} else {
			data, err = os.ReadFile(f.file)
		}
		if err != nil {
			return nil, err
		}
		e, err := wire.Decode(data)
		if err != nil {
			return nil, usageErr(fmt.Errorf("%s: %w", f.file, err))
		}
		if cmd.Flags().Changed("from") && e.SenderID != f.from {
			return nil, usageErr(fmt.Errorf("--from %q disagrees with the file's sender_id %q", f.from, e.SenderID))
		}
		return e, nil
	}
	if f.to == "" || f.action == "" {
		return nil, usageErr(errors.New("--to and --action are required (or --file)"))
	}
	p, err := wire.ParsePriority(f.priority)
	if err != nil {
		return nil, usageErr(err)
	}
	e := wire.NewEnvelope(wire.TypeRequest, f.from, f.action)
	if f.typ == "notification" {
		e.MessageType = wire.TypeNotification
	} else if f.typ != "" && f.typ != "request" {
		return nil, usageErr(fmt.Errorf("--type %q: must be request or notification", f.typ))
	}
	e.ReceiverID, e.Priority, e.TTLMillis = f.to, p, f.ttl.Milliseconds()
	e.Correlation, e.WorkflowID, e.TaskID = f.correlation, f.workflow, f.task
	if e.Correlation == "" {
		e.Correlation = e.MessageID
	}
	if f.payload != "" {
		if !json.Valid([]byte(f.payload)) {
			return nil, usageErr(fmt.Errorf("--payload is not valid JSON: %s", f.payload))
		}
		e.Payload = json.RawMessage(f.payload)
	}
	if err := e.Validate(); err != nil {
		return nil, usageErr(err)
	}
	return e, nil
}

func (a *app) runSend(ctx context.Context, cmd *cobra.Command, f sendFlags, request bool) error {
	env, err := a.buildEnvelope(cmd, f)
	if err != nil {
		return err
	}
	if request && env.ReceiverID == "" {
		return usageErr(errors.New("a request needs a receiver_id"))
	}
	if request && f.timeout <= 0 {
		return usageErr(fmt.Errorf("--timeout %v: must be positive", f.timeout))
	}
	opts, err := a.cfg.AgentOptions()
	if err != nil {
		return err
	}
	nc, err := a.connect(ctx, "agentmesh-"+env.SenderID)
	if err != nil {
		return err
	}
	defer nc.Close()
	if !isolated(nc) {
		// Probed under its own watch: credentials that may not look are
		// no reason to fail the send.
		pctx, pstop := watchDenials(ctx, nc)
		a.warnUnknownReceiver(pctx, nc, env)
		pstop()
	}
	ctx, stop := watchDenials(ctx, nc)
	defer stop()
	if isolated(nc) {
		// The credentials auth generates for one agent may not create
		// streams, consumers or registry records, nor look at the stream:
		// bind to the consumers auth --provision made, and stay out of
		// the registry, as such an agent runs.
		opts = append(opts, agentkit.WithProvisioning(false), agentkit.WithRegistration(false))
	}
	agent, err := agentkit.New(nc, env.SenderID, opts...)
	if err != nil {
		return usageErr(err)
	}
	defer agent.Stop()
	if !request {
		// Retries end at the publish timeout (agent.publish_timeout), as
		// an agent's do.
		sctx, cancel := context.WithTimeout(ctx, a.cfg.Agent.PublishTimeout)
		defer cancel()
		if err := agent.SendEnvelope(sctx, env); err != nil {
			if errors.Is(err, jetstream.ErrNoStreamResponse) {
				return fmt.Errorf("%w\nno stream stores mesh messages here: agents create stream %s when they start (agentmesh up, agentmesh demo), or run agentmesh auth --provision", err, a.scheme().Stream())
			}
			return err
		}
		// A duplicate ack to a first attempt means an earlier send stored the
		// id. After a retry it may instead be the first attempt's own copy,
		// whose ack was lost, and the ack does not say which: that counts as
		// sent.
		if st := agent.Stats(); st.PublishDuplicates > 0 && st.PublishRetries == 0 {
			return fmt.Errorf("not sent: the stream already holds message_id %s (sent within its duplicate window); give the envelope a new message_id", env.MessageID)
		}
		fmt.Fprintf(a.stdout, "sent %s %s to %s [%s] message_id=%s correlation_id=%s\n",
			env.MessageType, env.Action, target(env), env.Priority, env.MessageID, env.Correlation)
		return nil
	}
	rctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	if err := agent.Start(rctx); err != nil {
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			return fmt.Errorf("%w\nthese credentials bind to the consumers of %s made by agentmesh auth --provision (with %s among its agents)", err, env.SenderID, env.SenderID)
		}
		return denied(rctx, err, "")
	}
	reply, rerr := agent.Request(rctx, env.ReceiverID, env.Action, env.Payload, envelopeOptions(env)...)
	rerr = denied(rctx, rerr, "")
	if reply != nil {
		enc := json.NewEncoder(a.stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(reply); err != nil {
			return err
		}
	}
	return rerr
}

// warnUnknownReceiver warns on stderr when env goes to one agent that has
// neither a consumer at env's priority nor a registry entry: the stream
// stores the message anyway, for an agent that may never start (a typo).
// What it cannot tell (an error, a denial) it does not warn about.
func (a *app) warnUnknownReceiver(ctx context.Context, nc *nats.Conn, env *wire.Envelope) {
	if env.ReceiverID == "" {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	js, err := jetstream.New(nc)
	if err != nil {
		return
	}
	scheme := a.scheme()
	name, err := scheme.Consumer(env.ReceiverID, string(env.Priority))
	if err != nil {
		return
	}
	if _, err := js.Consumer(ctx, scheme.Stream(), name); !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return // it exists, the stream does not (send says so), or unknown
	}
	kv, err := js.KeyValue(ctx, scheme.RegistryBucket())
	switch {
	case errors.Is(err, jetstream.ErrBucketNotFound):
	case err != nil:
		return
	default:
		if in, err := registry.Instances(ctx, kv, env.ReceiverID); err != nil || len(in) > 0 {
			return
		}
	}
	fmt.Fprintf(a.stderr, "agentmesh: warning: no agent %q on this mesh (no consumer %s, no registry entry): "+
		"the message waits in stream %s until an agent with that id starts\n", env.ReceiverID, name, scheme.Stream())
}

// isolated reports whether nc authenticated with credentials auth
// generated for one agent: those, and only those, set a private inbox
// prefix (auth.SeedFileOptions), because the agent may subscribe nowhere
// else.
func isolated(nc *nats.Conn) bool {
	return nc.Opts.InboxPrefix != "" && nc.Opts.InboxPrefix != nats.InboxPrefix
}

// target says where env goes: its receiver, its topic or every agent.
func target(env *wire.Envelope) string {
	switch {
	case env.ReceiverID != "":
		return env.ReceiverID
	case env.Topic != "":
		return "topic " + env.Topic
	default:
		return "broadcast (every agent)"
	}
}
