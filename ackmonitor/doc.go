// Package ackmonitor is the agentmesh ack monitor as a library: it watches
// every message stored in the mesh stream and every consumer event about
// it, keeps the specification's acknowledgment ledger, computes ack, NACK and
// timeout rates, raises and resolves alerts, dead-letters failed messages,
// escalates exhausted ones to the sender's director, and serves a
// dashboard, a JSON API and Prometheus metrics. The binary is
// cmd/ackmonitor; this package never dials, prints or exits.
//
// # Inputs
//
// [Monitor.Run] provisions (unless they exist) the message stream MESH,
// MESH_EVENTS, which captures the MESH consumers' NAK, TERM and
// MAX_DELIVERIES advisories and ack metrics so none is lost while the
// monitor is down, and MESH_DLQ. It reads two durable pull consumers,
// both explicit-ack:
//
//   - <id>_events on MESH_EVENTS: every consumer event;
//   - <id>_sends on MESH, headers only: every send (message id, sender,
//     receiver or topic, priority, correlation, workflow, in-reply-to, and
//     the stream timestamp as sent_at). A send without Mesh-Type, whose
//     sender mirrors no header, has its body read from the stream instead.
//
// Messages are written in batches, one store transaction per batch, and
// acked only after the commit. Writes are idempotent (see package store),
// so redeliveries and replays change nothing. A batch the store refuses
// is written again in halves until the refused messages stand alone
// (while the store's probe write fails, nothing is tried); a message the
// store keeps
// refusing on its own (5 tries in which it took other writes: other
// messages or, for a message alone, a probe write) is terminated, logged
// and counted in ackmonitor_intake_refused_total, so it cannot hold up the
// intake for good; a refused TERM or MAX_DELIVERIES event is recorded
// first, so its row is never taken for acked. During an outage nothing is
// terminated.
//
// The events stream cannot capture an event published while it has no
// leader (a step-down, a node restart), so the active instance also
// subscribes to the consumer events on core NATS and writes them at once;
// the events intake then skips their stream copies. In tests, five
// step-downs of the events stream under load lost 11–24 % of the ack
// metrics to the stream alone, and those rows stayed pending for good.
//
// Ack metrics are sampled (the consumers' SampleFrequency; agentkit's
// default samples every ack) while NAK, TERM and MAX_DELIVERIES advisories
// are always sent. Every ReconcileInterval (default 30s) the active
// instance looks for pending rows at or below their consumer's ack floor,
// messages the consumer has acked, terminated or exhausted: with no TERM
// or MAX_DELIVERIES recorded they were acked. At the second look, once
// the events the stream held at the first are written, it records an
// inferred ACK (no ack time, no
// acknowledged_at; counted in ackmonitor_inferred_acks_total), so the
// counts of direct messages stay exact at any sampling and after events
// were lost on both paths. A real event that arrives later still decides
// the row. Topic and broadcast rows appear only with a first event, so an
// unsampled ACK of one leaves no row to infer.
//
// # The ledger and the rates
//
// One row per (stream_seq, consumer): a direct message has one, a topic or
// broadcast message one per receiving consumer. Its status is final once
// an ACK (ack metric), a TERM (status NACK, with the reason agentkit puts
// in the TERM: "NOT_FOUND: customer not found") or MAX_DELIVERIES (status
// TIMEOUT, also when the last attempt was NAKed: the message was never
// handled) arrives. A TIMEOUT row whose every delivery was NAKed (no
// timed-out attempt) is marked nak_exhausted: it is dead-lettered and
// escalated as a TIMEOUT, and counts in timed_out, but not in the timeout
// rate (nak_exhausted beside it, ackmonitor_nak_exhausted_total), since
// nothing timed out. A NAK is not final: the broker redelivers. retry_count
// is deliveries − 1; timeouts, the attempts that expired without an ack or
// NAK, are deliveries − 1 − NAKs (deliveries − NAKs for an exhausted
// message, whose last attempt counts too): the server's delivery count
// includes every attempt, and it sends a NAK advisory for each NAK.
//
// # Late and lost acks
//
// A redelivery is not always a timeout: the handler may have finished and
// its ack been lost (a consumer leader change loses acks it had not
// replicated) or come too late. agentkit remembers the messages it
// handled and acks such a redelivery at once, without running the
// handler, while a real retry runs the handler again; the ack metric's
// ack_time (from the latest delivery or InProgress to the ack) tells the
// two apart when the handler takes measurably longer than that ack. The
// store's rule ([store.LateAckRule]): an ACK of delivery 2 or later whose
// ack_time is at most half the fastest of the consumer's latest 20 ACKed
// first deliveries (at least 5 of them) marks the redelivery it acked as
// a late ack: the row counts it in late_acks, not in timeouts. It is
// judged once, when the ACK is first applied, and kept in the history
// (late_ack). Late acks count in none of the rates and raise no alert;
// /api/v1/agents, /summary, the dashboard and agentmesh stats show them
// beside delivery_timeouts, and ackmonitor_late_acks_total counts them.
//
// What the evidence does not allow:
//
//   - a handler about as fast as agentkit's duplicate ack (on one host
//     both take 0.3–5 ms) gives no evidence: its redeliveries stay
//     timeouts, however they came about;
//   - a redelivery another instance took (each instance remembers only
//     what it handled) runs the handler again: a timeout, or a NAK when
//     that instance took over from a crashed one and handed its messages
//     back (agentkit's turns);
//   - an ack that arrives after the ack wait expired, before or after the
//     redelivery, settles the message while the server still holds it
//     pending, and its ack metric names the acking delivery's count: the
//     row shows that delivery (usually the first), no redelivery and no
//     timeout, since the server reports no redelivery. Once a later
//     delivery was acked, the server drops the late ack without a metric;
//   - only the last redelivery is judged: earlier ones stay timeouts;
//   - a handler longer than agentkit's progress interval (a quarter of
//     the ack timeout) has its ack_time run from its last InProgress, so
//     its first deliveries' ack times spread down towards zero: the rule
//     then rarely finds evidence, and about one in forty of its real
//     retries (half the expected minimum of 20 uniform samples) can fall
//     below the bound and be taken for a late ack.
//
// Agents hosted by one process share a group consumer per priority,
// "<group>_group-<priority>", whose FilterSubjects are its members'
// direct filters; a member's own "<id>_<priority>" consumer, while it
// exists, delivers what was stored before the member joined. Whichever
// delivered it, a direct message has one row, keyed by its receiver's own
// consumer: the intake attributes a group's event to the receiver of the
// message at its stream sequence (remembered from the sends, else read
// from the stream), if the group's filters name that receiver, and
// ignores it otherwise (not a direct message, another receiver), as an
// undecodable event. So is an event about a message up to the end of
// the member's catch-up (agentkit's mark in the catch-up consumer's
// metadata): the group acks those unread. A look-up that fails puts the
// event off (NAK) for up to 10 deliveries. A receiver a group's filters
// name has a consumer (see below), and the ack floor of a member without
// its own consumer is its group's.
//
// A TERM whose reason starts with "INVALID: " gives status INVALID:
// agentkit terminates so a message that is not a valid envelope for its
// receiver, and a handler's Reject with code INVALID. Invalid input is its
// sender's failure, not its receiver's: the row counts in none of its
// receiver's rates (only in Invalid beside them), nor in
// ackmonitor_outcomes_total, and is not escalated; it is dead-lettered
// like a NACK. It counts in its sender's invalid rate (invalid / resolved
// messages from the sender), with the sender taken from the subject's
// sender token as package subjects parses it, never from a header or the
// envelope; a subject whose sender token is not a valid agent id gives
// [UnknownSender]. /api/v1/senders reports the rates and
// ackmonitor_invalid_messages_total{sender,priority} counts the messages.
//
// Rates over the sliding window (default 5 minutes) count the messages
// that reached a final status in the window: ack rate = ACK / (ACK + NACK
// + TIMEOUT), timeout rate = (TIMEOUT − nak_exhausted) / (ACK + NACK +
// TIMEOUT), and so on, not by messages sent: messages
// still in flight are neither acked nor failed yet, so counting them would
// report every burst as a drop in the ack rate. Messages sent in the
// window and those still pending are reported beside the rates.
//
// Two times are kept per acked message:
//
//   - ack time (processing_time_ms, avg_ack_time_ms): the ack metric's
//     ack_time, from the acking delivery (or its last InProgress) to the
//     ack — how long the receiver took once it had the message;
//   - latency (sent_at → acknowledged_at): from the stream's timestamp to
//     the ack, including queueing, NAK delays and redeliveries — what the
//     sender experienced. ackmonitor_ack_latency_seconds observes it once
//     per ACK, when the row first has both (store.Applied.Acked): at the
//     ACK, or at the send when the ACK reached the ledger first.
//
// # Alerts
//
// Every EvaluateInterval the active instance compares each agent's window
// rates with [Thresholds] (defaults: ack rate < 95 % warning, < 90 %
// critical; timeout rate > 5 % warning, > 10 % critical), once the agent
// has MinSamples resolved messages in the window, and likewise each
// sender's invalid rate (> 5 % warning, > 10 % critical by default; alert
// kind invalid_rate, about the sender). The ack and timeout rates over
// every agent together raise the mesh-wide alerts, agent [MeshAgent]
// ("_mesh"), at the same thresholds once MeshMinSamples (default 10)
// messages resolved in the window. Fewer than the minimum keep an alert's
// state; an alert resolves when its rates fall back within the thresholds,
// or when its agent has no resolved message left in the window (it went
// quiet: nothing supports the alert any more). Logs give the rates in
// percent. Alerts are kept in the store
// (raised_at, resolved_at), which is also the state machine, and
// published as [AlertEvent] JSON on mesh.alert.<severity>.<agent>;
// resolutions go out as severity "info" with state "resolved".
// deploy/prometheus/alerts.yml states the receivers' and the mesh-wide
// rules over /metrics, and rules for the monitor itself down (up == 0),
// not scraped (absent(up)) or without an active instance.
//
// # Messages to unknown agents
//
// A direct message to an agent without a consumer for its priority (its
// own, or a group consumer whose filters name it) is stored and never
// delivered. A moment after each new send the monitor looks the
// receiver's consumer up (cached for a minute when found, 5 s when not;
// the group consumers listed at most every 5 s) and counts a missing one
// in
// ackmonitor_messages_to_unknown_agents_total{receiver}: 50 receivers get
// their own label, later ones count as [OtherReceivers], so made-up ids
// cannot grow the series. /api/v1/unknown_receivers lists the latest 100
// receivers (messages, last sender, message id and time, since this
// instance started), the summary counts them and the dashboard shows
// them.
//
// # Dead letters and escalation
//
// For each TIMEOUT, NACK and INVALID row the active instance reads the
// original message by stream sequence, copies it with its headers to
// mesh.dlq.<receiver>.<priority>.<sender> (plus the Mesh-Dlq-* headers;
// Nats-Msg-Id "<stream>:<stream seq>:<consumer>", the row's key, so a
// retried copy is deduplicated and no other copy is) and, for TIMEOUT
// rows, marks the receiver potentially unavailable (in its store until
// the receiver's next ACK, and in the agent registry, status UNAVAILABLE,
// for UnavailableFor); for TIMEOUT rows (and NACK rows when
// EscalateTerminated is set) it sends an "escalation" notification
// envelope, priority high, to the sender's director ([DirectorResolver];
// by default the "director" field of the sender's registry entry, else
// DefaultDirector). The payload is an [Escalation]: the original envelope,
// the attempts, the NAK/TERM history and the correlation chain. The row
// records the dead letter as soon as it is stored (with the receiver's
// mark) and the escalation once it is sent, and the escalation's message
// id is derived from the row, so a restart, a failover or a retry never
// copies or escalates a message twice.
//
// What peers wrote is bounded so that the server takes the copy: each
// Mesh-Dlq-* value to 1 KiB and each copied header to 4 KiB, cut at a
// character boundary and ending "…(truncated)"; the original's JetStream
// (Nats-*) headers are left out; and when the copy would exceed the
// server's header limit or max payload, its largest headers, then its
// body, are left out and named in Mesh-Dlq-Omitted-Headers and
// Mesh-Dlq-Body-Omitted.
//
// A follow-up that fails (no leader for the DLQ stream, an unknown
// director) leaves the row pending; it is tried again after 1s (or
// EvaluateInterval, if longer), doubling to a minute, while the rows
// behind it go ahead. Each failure is logged and counted in
// ackmonitor_follow_up_failures_total, and in the row
// (follow_up_attempts, follow_up_error). A follow-up that cannot succeed
// is given up: at once when the failure is permanent (the DLQ stream
// refuses the copy as a bad request, e.g. above its maximum message size;
// agentkit refuses the escalation envelope), else after FollowUpAttempts
// tries (default 20, about a quarter of an hour). A given-up row is no
// longer tried; it keeps what its follow-up did (e.g. its dead letter when
// only the escalation failed), records when and why (given_up_at,
// follow_up_error), is listed by /api/v1/messages?status=given_up and
// counted in ackmonitor_follow_ups_given_up_total.
//
// Rows are followed up 256 at a time, each step for all of them at once:
// the originals are read concurrently, the copies published without
// waiting for each other's acks, the escalations sent concurrently, and
// the ledger written once per step (BenchmarkDeadLetters measures the
// pace).
//
// # Rows that stay pending
//
// A row without a final status is pending: its message is in flight or
// waits for a receiver that is down or behind, or it stays pending for
// good: its receiver is gone, its events were lost and no ACK can be
// inferred (its consumer is gone, or the message left the stream), or
// the ledger refused its TERM or MAX_DELIVERIES event (logged with the
// row; it is neither inferred as an ACK nor dead-lettered or escalated).
// /api/v1/messages?status=pending lists pending rows oldest first, so the
// rows pending longest come before those in flight. After each reconcile
// pass the active instance sets ackmonitor_stale_pending_rows to the
// number of pending rows whose send is older than StalePendingAfter
// (default 2h, about twice the longest a message takes to reach its last
// outcome under agentkit's default delivery policies), a COUNT over an
// index; rows without a recorded send are not counted (a send the ledger
// refused, see ackmonitor_intake_refused_total, leaves its rows without
// one), and a standby reports no value. The count falls only when rows
// get a final status, so a row pending for good stays in it: the
// AckMonitorStalePendingRows rule in deploy/prometheus/alerts.yml warns
// when the count grows.
//
// # High availability
//
// Instances sharing a store and a monitor id share the two durable
// consumers through a pinned-client priority group: one instance is
// pinned and receives everything; the others' pulls wait. When the pinned
// instance stops pulling for PinnedTTL, the server pins another. Only the
// instance holding the events pin evaluates alerts and escalates
// ([Monitor.Active]). The server pins an instance only when it delivers
// it an event, so an instance that finds nobody pinned and no event
// waiting publishes a wake-up the events stream captures
// ([subjects.Scheme.MonitorWake]): a restart or takeover in a quiet mesh
// still follows up what the previous instance left. An instance that
// becomes active while events a previous holder fetched are still unacked
// (it died holding them; this process's previous run counts too) holds
// follow-ups back for AckWait, until the server redelivers them, and then
// until its intake has written them, so no message is escalated with part
// of its history. Several instances need a shared store: PostgreSQL
// (which writes a batch under advisory locks on its stream sequences, see
// package store), or one SQLite file on one host.
//
// # HTTP
//
// [Monitor.Handler] serves / (the dashboard, embedded, polling the API
// every 2 s), /api/v1/summary, /agents, /senders, /alerts,
// /unknown_receivers, /escalations,
// /dlq (the ledger's dead-lettered rows), /dlq/letters (the dead letters
// as stream MESH_DLQ holds them, read with package dlq, newest first),
// /messages, /timeseries and /hourly, /metrics (Prometheus, on the
// monitor's own registry) and /healthz.
//
// Query parameters are checked before any reaches the store; a bad one is
// answered 400 with {"error": "parameter <name>: ...", "parameter":
// "<name>"}:
//
//   - agent (/messages, /timeseries): an agent id, a subject token
//     ([A-Za-z0-9_-], at most 64 characters);
//   - status (/messages): ACK, NACK, TIMEOUT, INVALID, given_up (rows whose
//     follow-up was given up, newest first), or pending: rows without a
//     final status, oldest first (the others come newest first);
//   - limit (/alerts, /escalations, /dlq, /messages): a positive integer;
//     above 1000 it is lowered to 1000;
//   - range (/timeseries, default 1h; /hourly, default 24h): a Go duration
//     ("30m", "24h"), positive and at most 744h (31 days);
//   - step (/timeseries, default 1m): a duration of at least 1s, with
//     range/step (rounded up) at most 10,000 points. The answer's
//     step_seconds is the step the store used (whole microseconds).
//
// A store failure is logged (the monitor's Logger) and answered 500 with a
// generic message: database errors can name hosts, users and tables.
package ackmonitor
