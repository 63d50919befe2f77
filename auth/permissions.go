package auth

import (
	"slices"

	"github.com/agentmesh-io/agentmesh/subjects"
)

// Permissions is what one user may publish and subscribe to: allow lists
// only. Anything not listed is denied by the server. A nil *Permissions
// (the admin) means no restriction.
type Permissions struct {
	// Publish lists the subjects the user may publish to, including the
	// JetStream API and ack subjects it may call.
	Publish []string
	// Subscribe lists the subjects the user may subscribe to.
	Subscribe []string
}

// InboxPrefix returns the private reply-subject prefix of user name,
// "_INBOX_<name>": the only subjects an agent may subscribe to are below
// it. Connect with nats.CustomInboxPrefix(InboxPrefix(name)) (see
// [Credentials.Options]).
func InboxPrefix(name string) string { return "_INBOX_" + name }

// jsAPI is the JetStream API subject prefix.
const jsAPI = "$JS.API"

// agentPermissions returns the permissions of agent id: publish only as
// itself, consume, ack and inspect only its own five durable consumers,
// replies only on its private inbox, and, when o asks for it, the registry
// and payload store rights agentkit needs.
func agentPermissions(s subjects.Scheme, id string, o Options) *Permissions {
	p := &Permissions{}
	// Sending: the sender is the last token of every message subject.
	sent, _ := s.SentBy(id) // id validated by the caller
	hb, _ := s.Heartbeat(id)
	p.Publish = append(p.Publish, sent...)
	p.Publish = append(p.Publish, hb)
	// Consuming: each consumer named exactly, never "<id>_*", which would
	// also match the consumers of an agent whose id starts with "<id>_".
	stream := s.Stream()
	for _, prio := range subjects.Priorities {
		c, _ := s.Consumer(id, prio)
		p.Publish = append(p.Publish,
			jsAPI+".CONSUMER.MSG.NEXT."+stream+"."+c,
			jsAPI+".CONSUMER.INFO."+stream+"."+c,
		)
		p.Publish = append(p.Publish, ackSubjects(stream, c)...)
	}
	if o.Registration {
		p.Publish = append(p.Publish, registryAgentRights(s, id)...)
	}
	if o.Payloads {
		p.Publish = append(p.Publish, payloadRights(s)...)
	}
	p.Subscribe = []string{InboxPrefix(id) + ".>"}
	return p
}

// ackSubjects are the ack (and nak, term, in-progress) subjects of
// consumer on stream, in both formats the server uses: v1
// "$JS.ACK.<stream>.<consumer>.<5 numbers>" (the default) and v2
// "$JS.ACK.<domain>.<account hash>.<stream>.<consumer>.<5 numbers>..."
// (feature flag js_ack_fc_v2). The v2 pattern cannot match another
// consumer's v1 subject: its fifth token would be a number, not the stream.
func ackSubjects(stream, consumer string) []string {
	return []string{
		"$JS.ACK." + stream + "." + consumer + ".>",
		"$JS.ACK.*.*." + stream + "." + consumer + ".>",
	}
}

// registryAgentRights are the registry rights of agent id: write its own
// instance keys, mark any agent's health, read (watch) the whole bucket.
func registryAgentRights(s subjects.Scheme, id string) []string {
	b := s.RegistryBucket()
	kvStream := "KV_" + b
	instances, _ := subjects.InstancesFilter(id) // id validated by the caller
	health, _ := subjects.MarksFilter(subjects.KeyHealth)
	unavailable, _ := subjects.MarksFilter(subjects.KeyUnavailable)
	return []string{
		subjects.KVSubject(b, instances),              // its instances' records (put with Nats-TTL, delete)
		subjects.KVSubject(b, health),                 // degraded marks about the agents it sends to
		subjects.KVSubject(b, unavailable),            // unavailable marks (repeated timeouts), likewise
		jsAPI + ".STREAM.INFO." + kvStream,            // js.KeyValue
		jsAPI + ".CONSUMER.CREATE." + kvStream + ".>", // the watch's ordered consumer
		jsAPI + ".CONSUMER.DELETE." + kvStream + ".*", // removed when the watch stops
		"$JS.FC." + kvStream + ".>",                   // flow control of the watch (v1)
		"$JS.FC.*.*." + kvStream + ".>",               // (v2)
	}
}

// payloadRights are the object store rights of agentkit's claim check:
// store and read any large envelope of the mesh.
func payloadRights(s subjects.Scheme) []string {
	b := s.PayloadsBucket()
	objStream := "OBJ_" + b
	return []string{
		"$O." + b + ".>",
		jsAPI + ".STREAM.INFO." + objStream,
		jsAPI + ".CONSUMER.CREATE." + objStream + ".>",
		jsAPI + ".CONSUMER.DELETE." + objStream + ".*",
		jsAPI + ".DIRECT.GET." + objStream + ".>",
		jsAPI + ".STREAM.MSG.GET." + objStream,
		jsAPI + ".STREAM.PURGE." + objStream, // Delete purges the object's chunks: any filter, or none, is allowed
		"$JS.FC." + objStream + ".>",
		"$JS.FC.*.*." + objStream + ".>",
	}
}

// monitorPermissions returns the permissions of the ack monitor (user
// id): the consumer API on the message, events and dead-letter streams and
// the registry's, reading their messages, creating the streams when missing
// and updating its own two, but never deleting or purging a stream; the
// registry; consumer advisories, heartbeats and alerts; and publishing
// alerts, dead letters, the events wake-up and its own messages.
func monitorPermissions(s subjects.Scheme, id string) *Permissions {
	p := &Permissions{}
	sent, _ := s.SentBy(id) // escalations, sent as the monitor; id validated by the caller
	hb, _ := s.Heartbeat(id)
	p.Publish = append(p.Publish, sent...)
	p.Publish = append(p.Publish, s.DLQSubjects()...)
	p.Publish = append(p.Publish,
		s.AlertFilter(),
		hb,
		s.MonitorWake(),
		jsAPI+".INFO",
		subjects.KVSubject(s.RegistryBucket(), ">"),
	)
	streams := []struct {
		name           string
		create, update bool
	}{
		{s.Stream(), true, false},                  // created if missing, never changed
		{s.EventsStream(), true, true},             // the monitor's own streams
		{s.DLQStream(), true, true},                //
		{"KV_" + s.RegistryBucket(), false, false}, // read and written through the KV API
	}
	for _, st := range streams {
		if st.create {
			p.Publish = append(p.Publish, jsAPI+".STREAM.CREATE."+st.name)
		}
		if st.update {
			p.Publish = append(p.Publish, jsAPI+".STREAM.UPDATE."+st.name)
		}
		p.Publish = append(p.Publish,
			jsAPI+".STREAM.INFO."+st.name,
			jsAPI+".STREAM.MSG.GET."+st.name,
			jsAPI+".DIRECT.GET."+st.name+".>",
			jsAPI+".CONSUMER.*."+st.name,      // NAMES, LIST
			jsAPI+".CONSUMER.*."+st.name+".>", // CREATE, INFO, DELETE, UNPIN, ...
			jsAPI+".CONSUMER.MSG.NEXT."+st.name+".*",
			"$JS.FC."+st.name+".>",
			"$JS.FC.*.*."+st.name+".>",
		)
		p.Publish = append(p.Publish, ackSubjects(st.name, "*")...)
	}
	p.Subscribe = append(slices.Clone(s.EventsSubjects()),
		InboxPrefix(id)+".>",
		s.HeartbeatFilter(),
		s.AlertFilter(),
	)
	return p
}
