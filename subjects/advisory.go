package subjects

import (
	"fmt"
	"strings"
)

// JetStream advisory and metric subject prefixes, restated from the server
// (server/jetstream_api.go) so production code need not import it. Consumer
// subjects append ".<stream>.<consumer>".
const (
	AdvisoryPrefix         = "$JS.EVENT.ADVISORY"
	MetricPrefix           = "$JS.EVENT.METRIC"
	AdvisoryConsumerPrefix = AdvisoryPrefix + ".CONSUMER"
	AckMetricPrefix        = MetricPrefix + ".CONSUMER.ACK"
	MaxDeliveriesPrefix    = AdvisoryConsumerPrefix + ".MAX_DELIVERIES"
	NakPrefix              = AdvisoryConsumerPrefix + ".MSG_NAKED"
	TerminatedPrefix       = AdvisoryConsumerPrefix + ".MSG_TERMINATED"
)

// EventKind names a consumer event the ack monitor consumes.
type EventKind string

// The consumer events.
const (
	EventAck           EventKind = "ACK"
	EventNak           EventKind = "MSG_NAKED"
	EventTerminated    EventKind = "MSG_TERMINATED"
	EventMaxDeliveries EventKind = "MAX_DELIVERIES"
)

// Event is a parsed consumer advisory or ack-metric subject.
type Event struct {
	Kind     EventKind
	Stream   string
	Consumer string
}

var eventPrefixes = []struct {
	prefix string
	kind   EventKind
}{
	{AckMetricPrefix, EventAck},
	{NakPrefix, EventNak},
	{TerminatedPrefix, EventTerminated},
	{MaxDeliveriesPrefix, EventMaxDeliveries},
}

// EventSubject returns the subject of kind for stream and consumer.
func EventSubject(kind EventKind, stream, consumer string) (string, error) {
	if err := firstErr(ValidateToken("stream", stream), ValidateToken("consumer", consumer)); err != nil {
		return "", err
	}
	for _, p := range eventPrefixes {
		if p.kind == kind {
			return p.prefix + "." + stream + "." + consumer, nil
		}
	}
	return "", fmt.Errorf("%w: unknown event kind %q", ErrInvalidSubject, kind)
}

// ParseEvent parses an ack metric or a NAK, TERM or MAX_DELIVERIES advisory subject.
func ParseEvent(subject string) (Event, error) {
	for _, p := range eventPrefixes {
		rest, ok := strings.CutPrefix(subject, p.prefix+".")
		if !ok {
			continue
		}
		stream, consumer, ok := strings.Cut(rest, ".")
		if !ok || firstErr(ValidateToken("stream", stream), ValidateToken("consumer", consumer)) != nil {
			break
		}
		return Event{Kind: p.kind, Stream: stream, Consumer: consumer}, nil
	}
	return Event{}, fmt.Errorf("%w: %q is not a consumer ack event", ErrInvalidSubject, subject)
}
