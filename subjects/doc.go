// Package subjects is the only place in agentmesh that knows how subjects,
// stream names, consumer names and bucket names are spelled.
//
// Every other package builds and parses names through a [Scheme], so the
// scheme can change in one place and NATS permissions can be derived from it.
//
// # Subjects
//
// With the default prefix "mesh":
//
//	mesh.agent.<receiver>.<priority>.<sender>   direct message
//	mesh.topic.<topic>.<priority>.<sender>      publish/subscribe
//	mesh.broadcast.<priority>.<sender>          to every agent
//	mesh.hb.<agent>                             heartbeat (core NATS)
//	mesh.alert.<severity>.<agent>               alert raised by the monitor
//	mesh.dlq.<receiver>.<priority>.<sender>     dead letter
//
// The sender is always the last token, so NATS permissions can bind an
// agent's credentials to the filters of [Scheme.SentBy] and the server, not
// the payload, vouches for who sent a message.
//
// # Registry keys
//
// The registry bucket ([Scheme.RegistryBucket]) holds one key per agent
// instance, "agent.<agent>.<instance>" ([InstanceKey]), and the marks
// senders set on an agent, "health.<agent>" and "unavailable.<agent>"
// ([MarkKey]). [KVSubject] is the subject a key is stored on, for puts that
// need headers such as a per-key TTL.
//
// # Shared-state and session keys
//
// The shared-state bucket ([Scheme.StateBucket]) holds one key per entity,
// "<kind in lower case>.<id>", e.g. "task.t1" ([StateKey], [StateFilter],
// [ParseStateKey]). The sessions bucket ([Scheme.SessionsBucket]) holds one
// key per session: its id ([SessionKey]).
//
// # Tokens
//
// Agent ids and topics are tokens: 1 to 64 characters from
// [A-Za-z0-9_-]; the prefix is 1 to 32 from [a-z0-9_], starting with a
// letter (see [New]). Anything else is rejected with an [*InvalidTokenError]
// (errors.Is(err, [ErrInvalidToken])) before it can reach NATS.
//
// # Advisories
//
// The JetStream advisory and metric subjects the ack monitor consumes are
// restated here ([AckMetricPrefix], [MaxDeliveriesPrefix], [NakPrefix],
// [TerminatedPrefix]) instead of importing the server; a test asserts they
// equal the server's constants.
//
// # JetStream's own subjects
//
// The permissions of agentmesh's users grant JetStream API subjects
// ([API]), ack and flow control subjects ([AckFilters],
// [FlowControlFilters]), the streams behind KV and object store buckets
// ([KVStream], [ObjectStream], [ObjectFilter]) and private inboxes
// ([InboxPrefix]), and agentkit's SendBatch writes fast batch publish reply
// subjects ([AppendFastBatchReply]); they are spelled here too, and tests
// check them against the server's constants and the streams nats.go
// creates.
package subjects
