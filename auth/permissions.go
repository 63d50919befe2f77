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
// [subjects.InboxPrefix]: the only subjects an agent may subscribe to are
// below it. Connect with nats.CustomInboxPrefix(InboxPrefix(name)) (see
// [Credentials.Options]).
func InboxPrefix(name string) string { return subjects.InboxPrefix(name) }

// agentPermissions returns the permissions of agent id: publish only as
// itself, consume, ack and inspect only its own durable consumers (five direct,
// two fan-out),
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
	var consumers []string
	for _, prio := range subjects.Priorities {
		c, _ := s.Consumer(id, prio)
		consumers = append(consumers, c)
	}
	for _, class := range subjects.FanoutClasses {
		c, _ := s.FanoutConsumer(id, class)
		consumers = append(consumers, c)
	}
	for _, c := range consumers {
		p.Publish = append(p.Publish,
			subjects.API("CONSUMER", "MSG", "NEXT", stream, c),
			subjects.API("CONSUMER", "INFO", stream, c),
		)
		p.Publish = append(p.Publish, subjects.AckFilters(stream, c)...)
	}
	p.Subscribe = []string{InboxPrefix(id) + ".>"}
	if o.Registration {
		p.Publish = append(p.Publish, registryAgentRights(s, id)...)
		// Instances taking turns probe each other: each answers on its
		// own probe subject, into the requesting instance's inbox, which
		// is this same user's.
		probes, _ := s.ProbeFilter(id)
		p.Publish = append(p.Publish, probes, InboxPrefix(id)+".>")
		p.Subscribe = append(p.Subscribe, probes)
	}
	if o.Payloads {
		p.Publish = append(p.Publish, payloadRights(s)...)
	}
	return p
}

// registryAgentRights are the registry rights of agent id: write its own
// instance keys, mark any agent's health, read (watch) the whole bucket.
func registryAgentRights(s subjects.Scheme, id string) []string {
	b := s.RegistryBucket()
	kvStream := subjects.KVStream(b)
	instances, _ := subjects.InstancesFilter(id) // id validated by the caller
	health, _ := subjects.MarksFilter(subjects.KeyHealth)
	unavailable, _ := subjects.MarksFilter(subjects.KeyUnavailable)
	return append([]string{
		subjects.KVSubject(b, instances),                  // its instances' records (put with Nats-TTL, delete)
		subjects.KVSubject(b, health),                     // degraded marks about the agents it sends to
		subjects.KVSubject(b, unavailable),                // unavailable marks (repeated timeouts), likewise
		subjects.API("STREAM", "INFO", kvStream),          // js.KeyValue
		subjects.API("STREAM", "MSG", "GET", kvStream),    // a record read from the stream leader, as turns do
		subjects.API("CONSUMER", "CREATE", kvStream, ">"), // the watch's ordered consumer
		subjects.API("CONSUMER", "DELETE", kvStream, "*"), // removed when the watch stops
	}, subjects.FlowControlFilters(kvStream)...) // the watch's flow control
}

// payloadRights are the object store rights of agentkit's claim check:
// store and read any large envelope of the mesh.
func payloadRights(s subjects.Scheme) []string {
	b := s.PayloadsBucket()
	objStream := subjects.ObjectStream(b)
	return append([]string{
		subjects.ObjectFilter(b),
		subjects.API("STREAM", "INFO", objStream),
		subjects.API("CONSUMER", "CREATE", objStream, ">"),
		subjects.API("CONSUMER", "DELETE", objStream, "*"),
		subjects.API("DIRECT", "GET", objStream, ">"),
		subjects.API("STREAM", "MSG", "GET", objStream),
		subjects.API("STREAM", "PURGE", objStream), // Delete purges the object's chunks: any filter, or none, is allowed
	}, subjects.FlowControlFilters(objStream)...)
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
		subjects.API("INFO"),
		subjects.KVSubject(s.RegistryBucket(), ">"),
	)
	streams := []struct {
		name           string
		create, update bool
	}{
		{s.Stream(), true, false},                             // created if missing, never changed
		{s.EventsStream(), true, true},                        // the monitor's own streams
		{s.DLQStream(), true, true},                           //
		{subjects.KVStream(s.RegistryBucket()), false, false}, // read and written through the KV API
	}
	for _, st := range streams {
		if st.create {
			p.Publish = append(p.Publish, subjects.API("STREAM", "CREATE", st.name))
		}
		if st.update {
			p.Publish = append(p.Publish, subjects.API("STREAM", "UPDATE", st.name))
		}
		p.Publish = append(p.Publish,
			subjects.API("STREAM", "INFO", st.name),
			subjects.API("STREAM", "MSG", "GET", st.name),
			subjects.API("DIRECT", "GET", st.name, ">"),
			subjects.API("CONSUMER", "*", st.name),      // NAMES, LIST
			subjects.API("CONSUMER", "*", st.name, ">"), // CREATE, INFO, DELETE, UNPIN, ...
			subjects.API("CONSUMER", "MSG", "NEXT", st.name, "*"),
		)
		p.Publish = append(p.Publish, subjects.FlowControlFilters(st.name)...)
		p.Publish = append(p.Publish, subjects.AckFilters(st.name, "*")...)
	}
	p.Subscribe = append(slices.Clone(s.EventsSubjects()),
		InboxPrefix(id)+".>",
		s.HeartbeatFilter(),
		s.AlertFilter(),
	)
	return p
}
