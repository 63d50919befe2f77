package agentkit

import (
	"context"
	"slices"
	"strings"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/agentmesh-io/agentmesh/agentkit/wire"
)

// tracerName is the instrumentation scope of agentkit's spans.
const tracerName = "github.com/agentmesh-io/agentmesh/agentkit"

// headerCarrier carries W3C trace context in NATS headers under lowercase
// keys. nats.Header is case-sensitive, so wrapping it as an http.Header
// would canonicalise "traceparent" to "Traceparent" and miss the lowercase
// key other languages' OpenTelemetry propagators send.
type headerCarrier nats.Header

func (c headerCarrier) Get(key string) string { return nats.Header(c).Get(strings.ToLower(key)) }

func (c headerCarrier) Set(key, value string) { nats.Header(c).Set(strings.ToLower(key), value) }

func (c headerCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

var _ propagation.TextMapCarrier = headerCarrier{}

// tracing is the agent's tracer and propagator: the send side starts
// producer and client spans with it, the receive side consumer spans.
type tracing struct {
	tracer     trace.Tracer
	propagator propagation.TextMapPropagator
}

// Span start options, built once: the hot path allocates nothing for them.
var (
	sendSpan    = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindProducer)}
	handleSpan  = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer)}
	requestSpan = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindClient)}
)

// startSend starts the producer span of publishing e on subject and
// records its ids in the envelope's trace field, so readers
// of the body alone see the same trace as the headers. Attributes are only
// built for spans that record.
func (t *tracing) startSend(ctx context.Context, subject string, e *wire.Envelope) (context.Context, trace.Span) {
	parent := trace.SpanContextFromContext(ctx)
	ctx, span := t.tracer.Start(ctx, "send "+e.Action, sendSpan...)
	if !span.IsRecording() {
		return ctx, span
	}
	span.SetAttributes(
		attribute.String("messaging.system", "nats"),
		attribute.String("messaging.operation.type", "send"),
		attribute.String("messaging.destination.name", subject),
		attribute.String("messaging.message.id", e.MessageID),
		attribute.String("messaging.message.conversation_id", e.Correlation),
		attribute.String("agentmesh.action", e.Action),
		attribute.String("agentmesh.message_type", string(e.MessageType)),
	)
	mirrorTrace(e, span, parent)
	return ctx, span
}

// mirrorTrace sets e's trace field to span, a child of parent (if valid),
// as its headers will carry it.
func mirrorTrace(e *wire.Envelope, span trace.Span, parent trace.SpanContext) {
	if sc := span.SpanContext(); sc.IsValid() {
		e.Trace = &wire.Trace{TraceID: sc.TraceID().String(), SpanID: sc.SpanID().String()}
		if parent.IsValid() {
			e.Trace.ParentSpan = parent.SpanID().String()
		}
	}
}

// inject writes ctx's trace context into h.
func (t *tracing) inject(ctx context.Context, h nats.Header) {
	t.propagator.Inject(ctx, headerCarrier(h))
}

// startHandle starts the consumer span of handling d: a child of the
// sending span carried in the headers (so a conversation across agents is
// one trace), linked to it, and tagged with the delivery attempt.
func (t *tracing) startHandle(ctx context.Context, d *delivery) (context.Context, trace.Span) {
	remote := t.propagator.Extract(ctx, headerCarrier(d.msg.Headers()))
	rsc := trace.SpanContextFromContext(remote)
	if !rsc.IsValid() {
		if bsc := bodyTrace(d.env.Trace); bsc.IsValid() {
			// No trace context in the headers: the sender's span as the
			// body names it.
			rsc, remote = bsc, trace.ContextWithRemoteSpanContext(remote, bsc)
		}
	}
	opts := handleSpan
	if rsc.IsValid() {
		opts = append(slices.Clip(handleSpan), trace.WithLinks(trace.Link{SpanContext: rsc}))
	}
	ctx, span := t.tracer.Start(remote, "handle "+d.env.Action, opts...)
	if span.IsRecording() {
		span.SetAttributes(
			attribute.String("messaging.system", "nats"),
			attribute.String("messaging.operation.type", "process"),
			attribute.String("messaging.destination.name", d.msg.Subject()),
			attribute.String("messaging.message.id", d.env.MessageID),
			attribute.String("messaging.message.conversation_id", d.env.Correlation),
			attribute.Int64("messaging.message.delivery_count", int64(d.delivery)),
			attribute.String("agentmesh.action", d.env.Action),
			attribute.String("agentmesh.sender", d.env.SenderID),
		)
	}
	return ctx, span
}

// bodyTrace is the span context an envelope's trace member names, or the
// zero one. A sender writes it only while its span records, so it counts
// as sampled; its trace state, which only headers carry, is lost.
func bodyTrace(tr *wire.Trace) trace.SpanContext {
	if tr == nil {
		return trace.SpanContext{}
	}
	tid, err := trace.TraceIDFromHex(tr.TraceID)
	if err != nil {
		return trace.SpanContext{}
	}
	sid, err := trace.SpanIDFromHex(tr.SpanID)
	if err != nil {
		return trace.SpanContext{}
	}
	return trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled, Remote: true})
}

// startRequest starts the client span of a Request or SendAndWait.
func (t *tracing) startRequest(ctx context.Context, o *outgoing) (context.Context, trace.Span) {
	ctx, span := t.tracer.Start(ctx, "request "+o.Action, requestSpan...)
	if span.IsRecording() {
		span.SetAttributes(attribute.String("agentmesh.receiver", o.ReceiverID), attribute.String("agentmesh.action", o.Action))
	}
	return ctx, span
}

// endSpan records err (if any) and ends span.
func endSpan(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
