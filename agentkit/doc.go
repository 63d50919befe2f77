// Package agentkit is the SDK an agent links to talk to other agents over
// NATS JetStream: an agent runtime with at-least-once delivery,
// request/response, publish/subscribe and broadcast. The messages it sends
// are the envelopes of package [wire] (the wire format, which tools read
// without the runtime); the standard payloads are in package [protocol].
//
// # Agents
//
// [New] takes an existing *nats.Conn (agentkit never dials) and an agent id.
// Register a [Handler] per action with [Agent.Handle], then [Agent.Start]:
// Start provisions the stream MESH (unless it exists), one durable pull
// consumer per priority, "<agent>_<priority>", filtering the agent's direct
// subject at that priority, and two fan-out consumers,
// "<agent>_fanout-urgent" and "<agent>_fanout-bulk", filtering broadcasts
// and subscribed topics (created at the stream's end: a new agent gets no
// history of them; see [WithFanoutActions]). Several Agent
// values with one id are instances of one agent: they share the consumers
// and take turns reading them, the eldest live instance in the registry
// consuming while the others stand by ([Agent.Consuming]), so a
// redelivery after a lost ack returns to the instance that remembers
// handling it and a task's messages run in order across instances;
// [WithConcurrentInstances] lets them all consume and split the work. A process hosting many agents puts them in a [Group]
// ([WithGroup]): they then share one direct consumer per priority,
// "<group>_group-<priority>", instead of five each, which is what lets one
// server carry thousands of agents. [Agent.Drain] finishes in-flight work and stops;
// [Agent.Stop] stops at once and hands in-flight messages back. Both are
// bounded once they have cancelled the handlers' contexts (Stop at once,
// Drain when its ctx ends): a handler still running the stop grace later
// ([WithStopGrace], 5s) is abandoned. Its message goes back for
// redelivery, so another instance may handle it while the abandoned
// handler runs on (at least once); its result is dropped, the error
// handler hears [ErrHandlersAbandoned], and its goroutine ends when it
// returns.
//
//	a, err := agentkit.New(nc, "planner_1", agentkit.WithType("planner"))
//	a.HandleFunc("plan_workflow", func(ctx context.Context, m *agentkit.Message) error {
//		return m.Reply(ctx, "plan_complete", plan)
//	})
//	err = a.Start(ctx)
//	defer a.Drain(ctx)
//
// # Sending
//
// [Agent.Send] stores a message for another agent and returns; [Agent.Request]
// waits for the response; [Agent.SendAndWait] waits for the receiver's ACK or
// NACK; [Agent.Publish] goes to every agent subscribed to a topic ([Agent.Subscribe]); [Agent.Broadcast] to
// every agent; [Agent.SendBatch] stores many messages in one pipelined burst.
// The Nats-Msg-Id header is the envelope's message_id, so a publish retried
// after a failure (agentkit retries with exponential backoff) or a resend
// with [WithMessageID] is stored and delivered once.
//
// A ctx that has already ended publishes nothing and returns its error;
// after Stop or Drain every send fails with [ErrClosed]. A failed send is
// [ErrPublish] when the stream did not store the message (send it again
// freely), [ErrPublishUnconfirmed] when it may have (send the same
// envelope again, with [Agent.SendEnvelope] or [WithMessageID], within the
// stream's 2-minute duplicate window: it is stored once).
//
// # Delivery and outcomes
//
// Each priority has a [DeliveryPolicy]: the ack timeout of every attempt
// (BackOff), the number of attempts (MaxDeliver), how long a handler may run
// (ProcessingLimit) and how many messages are buffered ahead of the
// handlers. The defaults ([DefaultPolicies]) are high 5s/10s/20s/40s,
// normal 10s/20s/40s, low 30s/30s, plus critical and batch.
//
// The buffer follows the handlers' pace: it holds Prefetch messages (1 by
// default) until the pace is known, then what the workers finish within
// half the first ack timeout, up to MaxPrefetch (512 by default). Quick
// handlers get a deep buffer and throughput; slow ones (an LLM call of a
// minute) a shallow one, so a backlog waits at the server instead of timing
// out in the client, where the ack clock already runs. [Stats] reports the
// current sizes.
//
// From receipt until it is settled, the runtime tells the broker a message
// is alive (InProgress): while its handler runs, up to the processing
// limit, and while it waits for a busy worker. The ack timeout measures
// liveness, not work, and a queue behind slow handlers is not redelivered.
// The price: a received message stays with this instance until a worker
// takes it, even when handlers turn slow and another instance is idle.
// What the handler returns decides the outcome, in one place:
//
//	handler returns              broker                       sender hears
//	nil                          Ack                          ACK envelope if requires_ack
//	Busy(d), Retry(err, d)       NAK, back after d            the error, after the last attempt
//	Busy(0) / any other error    NakWithDelay(backoff)        the error, after the last attempt
//	panic                        recovered, NakWithDelay      the error, after the last attempt
//	Reject(code, reason),        TermWithReason               error envelope (NACK if requires_ack)
//	  non-retryable *Error
//	(no handler for the action)  TermWithReason               CAPABILITY_MISSING
//	(broadcast or topic message  Ack, counted as ignored      nothing
//	  whose action it does not take)
//
// "Sender hears" is for requests: a notification hears nothing on
// failure, unless it set requires_ack (then the NACK). A delay d of the
// handler's holds on every attempt it is returned on; without one, the
// NAK's delay is the priority's BackOff entry for the attempt, which the
// broker adds to the growth of the attempt's ack timeout over the first.
// After the last attempt the broker emits a MAX_DELIVERIES advisory; the ack
// monitor escalates it to the sender's director. Messages that cannot be an
// envelope for this agent (not JSON, missing fields, a sender_id other than
// the subject's sender, another receiver, too large) are terminated with a
// reason naming the problem and never reach a handler. Messages whose
// ttl_ms has passed are acked unhandled. [Agent.Stats] counts every outcome.
//
// # Priorities
//
// Critical messages have a worker of their own and every worker prefers
// critical, then high, normal, low and batch, so a critical message is
// handled ahead of any backlog. Replies to a pending [Agent.Request] are
// delivered without a worker, so handlers may make requests themselves.
//
// # Registry, breakers and fallback
//
// A started agent registers itself in KV bucket mesh_registry (id, type,
// version, capabilities, director, status, instances, load) and renews the
// entry every heartbeat ([WithHeartbeat], default 5s) with a per-key TTL of
// three heartbeats, so an agent that dies is UNAVAILABLE after three missed
// beats without deregistering. The members of a [Group] leave that to
// their process: it renews one record a heartbeat for all of them
// ([registry.Host]), so registries watching the bucket receive one message
// per process rather than per agent. An agent none of whose instances is left
// reads STOPPED only when the newest of them to go deregistered cleanly,
// UNAVAILABLE when its record expired (for a week, as long as the bucket
// keeps the expiry marker): a crashed restart is not hidden by the clean
// stop before it. The record states its TTL (ttl_seconds), so a reader
// judges a record past it gone by itself, on a bucket that keeps no
// markers too (`agentmesh migrate` adds them to an older bucket).
// [Agent.Registry] answers [registry.View.Find] from a watched local cache.
//
// Request and SendAndWait go through a circuit breaker per destination
// ([WithBreaker]): five consecutive timeouts open it and sends fail fast
// with [ErrCircuitOpen]; after 60s up to three trial messages go through at
// low priority and close it again. Three consecutive NACKs from an agent
// mark it degraded in the registry; three consecutive timeouts mark it
// UNAVAILABLE, though it heartbeats, until it answers or the
// breaker's open timeout passes. A handler that returns [Reroute], or a
// send with [WithFallback] to an open circuit, goes to the least loaded
// READY agent with the capability instead; replies still reach the
// original sender.
//
// # Ordering, context and large payloads
//
// Messages of one task (task_id, mirrored in the Mesh-Task-Id header; a
// sender that mirrors no header has its envelope decoded by the reader to
// find it) and priority are handled one at a time in stream order by the
// consuming instance; different tasks run concurrently. The order is per
// priority: messages of the task at another priority do not wait for each
// other, and a redelivered message comes after those delivered since (a
// crashed instance's unacked messages, too, return after their ack
// timeout). Instances that consume at once ([WithConcurrentInstances])
// keep the order per instance only.
// Inside a handler, messages sent with the handler's ctx inherit the
// handled message's correlation, workflow, task and session ids and
// context. Envelopes larger than the server's max payload travel through
// Object Store mesh_payloads and reach handlers as if inline.
// [WorkflowStatus] reads a conversation back from the stream.
//
// # Shared state, sessions and protocols
//
// [state.State] keeps TASK, AGENT, RESOURCE and POLICY entities in KV
// bucket mesh_state with compare-and-swap updates and a change feed
// ([Agent.State] opens it); the agent that acks a task.* message records
// it in the task's state, after the ack and off the handlers' workers
// ([WithTaskTracking]). [state.Sessions] keeps sessions (participants,
// decisions, artifacts) in mesh_sessions, expiring on their own. The
// standard protocols are actions with typed payloads
// ([protocol.TaskAssignment], [protocol.TaskHandoffRequest],
// [protocol.HelpRequest], [protocol.StatusUpdate], [protocol.ErrorReport],
// ...) and helpers ([Agent.Handoff], [Agent.RequestHelp], [Call]).
//
// # Middleware, hooks and observability
//
// [WithMiddleware] wraps every handler (authorisation, logging, limits),
// between the runtime's checks of a message and its settling. [WithHooks]
// attaches hooks the runtime calls as events happen: a message settled
// ([SettleHook]), an envelope published ([PublishHook]), a request
// answered or not ([RequestHook]), a circuit changing state
// ([BreakerHook]), an agent created or stopped. Package
// [github.com/agentmesh-io/agentmesh/agentkit/metrics] is such a hook: it
// exports Prometheus metrics, and agentkit itself does not import
// Prometheus.
//
// Spans go to the OpenTelemetry provider of [WithTracerProvider] (default
// the global one), with W3C trace context in NATS headers. Logs go to the
// *slog.Logger of [WithLogger] (default: discarded) and never include
// payloads. A publish the server's permissions refuse fails with
// [ErrPermissionDenied] instead of timing out.
//
// # Hostile peers and a lost connection
//
// Every byte a peer controls is checked and bounded before the runtime
// builds a subject, an object name, a log record or a reason from it: ids,
// the action, the status and agent types are at most 256 characters with
// no control characters, a large envelope's Mesh-Envelope-Ref must be its
// Nats-Msg-Id, and TERM reasons are at most 512 bytes, quoting what the
// sender wrote shortened. What fails is terminated as INVALID (which the
// ack monitor holds against the sender, not the receiver), counted in
// [Stats] and logged by sample: a burst of ten records, then one a second,
// each saying how many it left out.
//
// While nats.go reconnects a connection, the agent carries on (its pulls
// and publishes resume). A closed connection never comes back: the agent
// stops, [Agent.Closed] fires, and the error handler and [Agent.Err]
// report [ErrConnClosed]; to go on, the owner makes a new connection and a
// new Agent. [Agent.Err] also reports a reader the server turns away (its
// consumer deleted) until it reads again.
//
// # Errors
//
// Sentinel errors ([wire.ErrInvalidEnvelope], [ErrInvalidID], [ErrTimeout],
// [ErrPublish], [ErrPublishUnconfirmed], [ErrClosed], [ErrConnClosed],
// ...) are wrapped with context; match them with errors.Is.
// An error another agent sent back is a [*wire.Error] with a closed
// [wire.ErrorCode]: use errors.As, [CodeOf], [wire.IsRemote] and
// [IsRetryable].
package agentkit
