// Package auth generates the NATS credentials and permissions that isolate
// the agents of a mesh from each other, and provisions what isolated agents
// may not create themselves.
//
// [Generate] takes the agents ([AgentSpec]) and returns a [Bundle]: one nkey
// user per agent, a monitor user (the ack monitor) and an admin user, all in
// one account (MESH) with JetStream enabled. [Bundle.ServerConfig] is the
// server side, an accounts block in nats-server syntax holding public keys
// only; [Bundle.WriteDir] writes it as server-auth.conf next to one seed
// file per user (0600). Agents connect with [LoadCredentials] and
// [Credentials.Options], which sign the server's nonce with the seed and set
// the private inbox prefix. An administrator runs [Provision] once (and
// again when agents or topics change), then agents run with
// agentkit.WithProvisioning(false). To regenerate (new agents, topics or
// rights) without changing the keys of users the server already knows,
// call [Bundle.KeepSeeds] before WriteDir; the server applies a changed
// server-auth.conf when it reloads its configuration:
//
//	b, err := auth.Generate([]auth.AgentSpec{{ID: "planner"}, {ID: "executor", Topics: []string{"tasks"}}}, auth.Options{})
//	err = b.WriteDir("deploy/auth")               // include "server-auth.conf" from nats-server.conf
//	err = auth.Provision(ctx, adminJS, subjects.Default, b.Specs(), auth.ProvisionOptions{})
//
//	creds, err := auth.LoadCredentials("deploy/auth/planner.nk")
//	opts, err := creds.Options()
//	nc, err := nats.Connect(url, opts...)
//	a, err := agentkit.New(nc, "planner", agentkit.WithProvisioning(false), agentkit.WithRegistration(false))
//
// An embedded server takes the same authorization with
// opts.ProcessConfigString(b.ServerConfig()). That path, unlike accounts
// built in Go, enables JetStream for the account. This package does not
// import the server, so agents that link it stay small.
//
// # Why nkeys
//
// The server's configuration holds only public keys, so it can be committed
// or shared without leaking anything. At connect time the client signs a
// random nonce, so the seed never crosses the wire and a captured handshake
// cannot be replayed, even without TLS. There is no password to hash and no
// shared secret to rotate in two places: revoking an agent is removing one
// line of the server's configuration. The seed files work with the plain
// nats.NkeyOptionFromSeed too.
//
// # What the server enforces
//
// An agent "X" may publish only:
//
//   - messages whose sender token is X: mesh.agent.*.*.X, mesh.topic.*.*.X,
//     mesh.broadcast.*.X, and its heartbeat mesh.hb.X. The receiver checks
//     the envelope's sender_id against the subject, so the server vouches for
//     the sender;
//   - pull requests, INFO requests and acks (in both ack subject formats)
//     of its own seven consumers (five direct, two fan-out), each named
//     exactly ($JS.API.CONSUMER.MSG.NEXT.MESH.X_normal, ...,
//     X_fanout-urgent). A pattern like X_* would also match the consumers
//     of an agent called X_high.
//
// It may subscribe only to its inbox prefix, _INBOX_X.>, which is where
// JetStream delivers its pulled messages, API answers and publish acks.
// So X cannot:
//
//   - read another agent's messages: pulling on, or reading the info of,
//     another agent's consumer is refused, and so is subscribing to its
//     inbox, to _INBOX.> or to mesh.>;
//   - send as another agent, forge alerts, or write dead letters;
//   - create, change or delete streams or consumers (agentkit.Subscribe
//     on a running isolated agent therefore fails: topics are set in the
//     AgentSpec and applied by Provision);
//   - ack, nak or terminate another agent's messages.
//
// The monitor may use the JetStream API on the message, events and
// dead-letter streams and on the registry bucket (but not delete streams),
// read the consumer advisories, heartbeats and alerts, publish alerts and
// dead letters, and send messages as itself (escalations). The admin is
// unrestricted.
//
// # What the server cannot enforce
//
// Within its rights an agent is trusted. It can send any number of messages
// to any agent, and put anything in their bodies; the receiver validates
// them. The subject vouches for the sender, not for the content.
//
// With [Options.Registration] the agents may keep agentkit's registration
// on, at a price: every agent reads the whole registry (that is its purpose),
// can mark any agent degraded (agentkit does so after repeated NACKs), and
// can create and delete consumers on the registry's stream. It cannot write
// another agent's instance record ($KV.mesh_registry.agent.<self>.* only).
// Its instances also answer and send each other's liveness probes
// (mesh.probe.<self>.*, with replies into its own inbox, _INBOX_<self>.>).
// The consumer rights are the loose part: a push consumer's deliver
// subject is not checked against its creator's permissions, so an agent can
// have the server publish registry content it wrote (a health mark) on any
// subject. Core subscribers receive it: a forged heartbeat on mesh.hb.<other>
// reaches the monitor (TestRegistration_deliverSubject). Streams do not
// store it (nats-server 2.15.2), so no forged message reaches another
// agent's consumers. It can also delete another agent's registry watch
// (an ordered consumer, which nats.go re-creates; not tested here), and a
// forged degraded mark steers fallback routing away from an agent. Without
// the option, agents run with agentkit.WithRegistration(false): they cannot use Find or
// fallback routing, and agentkit publishes no heartbeats for them (its
// heartbeat loop belongs to registration), so the monitor sees their
// liveness only through their consumers.
//
// With [Options.Payloads] the agents may use agentkit's object store of
// large envelopes, and then every agent can read every offloaded envelope,
// whoever sent it, and purge the whole store (deleting an object is a purge
// request, whose filter the permissions cannot constrain); the consumer
// rights carry the same deliver-subject caveat as the registry's. Without
// it, envelopes must fit the server's max payload.
//
// Accounts are the hard boundary: agents in different accounts share
// nothing unless exported. One account per mesh keeps the streams shared.
//
// # Permission errors
//
// A refused publish is dropped by the server, which tells the client only
// asynchronously ("Permissions Violation for Publish to ..."), through the
// connection's error handler and nc.LastError. A JetStream call that needs
// an answer gets none. agentkit looks at nc.LastError after a failed publish
// attempt and returns agentkit.ErrPermissionDenied, but only once that
// attempt has timed out (a quarter of its publish timeout, at most 2s).
// [Watcher] collects the violations as [*PermissionError] values
// (errors.Is [ErrPermissionDenied]) as they arrive, and [Watcher.Guard]
// fails an operation at once.
package auth
