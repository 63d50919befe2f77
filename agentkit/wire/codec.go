package wire

import (
	"encoding"
	"slices"
	"strconv"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
)

// The envelope is encoded on every send, so it appends itself instead of
// going through JSON v2's reflection-driven struct encoding, which is
// markedly slower (BenchmarkCodec). Strings, the payload and the timestamp
// are still written by JSON v2's and the time package's own functions, so
// the bytes are the same as the default encoding (FuzzCodecMatchesJSONv2).
// Decoding stays with JSON v2's default, which a hand-written reader over
// jsontext tokens did not beat.

// envelopeFields is Envelope without its JSON method: what JSON v2's
// default struct encoding sees.
type envelopeFields Envelope

// MarshalJSONTo implements JSON v2's MarshalerTo.
func (e *Envelope) MarshalJSONTo(enc *jsontext.Encoder) error {
	b, err := e.AppendJSON(nil)
	if err != nil {
		return err
	}
	return enc.WriteValue(b)
}

// AppendJSON appends e's encoding to b and returns the extended buffer: the
// fields in declaration order, unset optional fields omitted as their
// omitempty and omitzero tags say, byte for byte what JSON v2's default
// struct encoding writes (see FuzzCodecMatchesJSONv2). Unlike
// [Envelope.Encode] it does not validate e, so a caller that has validated
// it already can encode into a reused buffer; an invalid enum or JSON value
// is still an error.
func (e *Envelope) AppendJSON(b []byte) ([]byte, error) {
	w := envelopeWriter{b: append(slices.Grow(b, e.sizeHint()), '{')}
	w.str(`"acl":`, e.ACL, true)
	w.str(`,"message_id":`, e.MessageID, true)
	w.enum(`,"message_type":`, string(e.MessageType), e.MessageType.Valid(), e.MessageType)
	w.str(`,"action":`, e.Action, false)
	w.enum(`,"priority":`, string(e.Priority), e.Priority.Valid(), e.Priority)
	if w.err == nil {
		w.b = append(w.b, `,"timestamp":"`...)
		if w.b, w.err = e.Timestamp.AppendText(w.b); w.err == nil {
			w.b = append(w.b, '"')
		}
	}
	if e.TTLMillis != 0 {
		w.b = strconv.AppendInt(append(w.b, `,"ttl_ms":`...), e.TTLMillis, 10)
	}
	w.str(`,"sender_id":`, e.SenderID, true)
	w.str(`,"sender_type":`, e.SenderType, false)
	w.str(`,"receiver_id":`, e.ReceiverID, false)
	w.str(`,"receiver_type":`, e.ReceiverType, false)
	w.str(`,"topic":`, e.Topic, false)
	w.str(`,"correlation_id":`, e.Correlation, false)
	w.str(`,"workflow_id":`, e.WorkflowID, false)
	w.str(`,"task_id":`, e.TaskID, false)
	w.str(`,"session_id":`, e.SessionID, false)
	w.str(`,"in_reply_to":`, e.InReplyTo, false)
	if e.RequiresAck {
		w.b = append(w.b, `,"requires_ack":true`...)
	}
	w.str(`,"status":`, e.Status, false)
	if e.Error != nil {
		w.nested(`,"error":`, e.Error)
	}
	w.raw(`,"payload":`, e.Payload)
	w.raw(`,"context":`, e.Context)
	if len(e.Metadata) > 0 {
		w.nested(`,"metadata":`, e.Metadata)
	}
	if e.Trace != nil {
		w.nested(`,"trace":`, e.Trace)
	}
	return append(w.b, '}'), w.err
}

// sizeHint is about the length of e's encoding, so it is appended into
// one allocation: the variable-length members plus room for the names,
// quotes and the fixed-length ones.
func (e *Envelope) sizeHint() int {
	n := 320 + len(e.Payload) + len(e.Context)
	for _, s := range [...]string{e.MessageID, e.Action, e.SenderID, e.SenderType, e.ReceiverID, e.ReceiverType,
		e.Topic, e.Correlation, e.WorkflowID, e.TaskID, e.SessionID, e.InReplyTo, e.Status} {
		n += len(s)
	}
	return n
}

// envelopeWriter appends one envelope, keeping the first error.
type envelopeWriter struct {
	b   []byte
	err error
}

// str appends a string member; an empty optional one is omitted.
func (w *envelopeWriter) str(name, v string, required bool) {
	if (v == "" && !required) || w.err != nil {
		return
	}
	w.b, w.err = jsontext.AppendQuote(append(w.b, name...), v)
}

// enum appends an enum member, or reports the MarshalText error of an
// invalid one.
func (w *envelopeWriter) enum(name, v string, valid bool, m encoding.TextMarshaler) {
	if !valid && w.err == nil {
		_, w.err = m.MarshalText()
	}
	w.str(name, v, true)
}

// nested appends an object member, omitted when it encodes empty.
func (w *envelopeWriter) nested(name string, v any) {
	if w.err != nil {
		return
	}
	b, err := jsonv2.Marshal(v, jsonv2.Deterministic(true))
	if err != nil {
		w.err = err
		return
	}
	w.raw(name, b)
}

// raw appends already encoded JSON, checked and compacted; an empty value
// (null, "", {} or []) is omitted, as omitempty does.
func (w *envelopeWriter) raw(name string, v []byte) {
	if len(v) == 0 || emptyJSON(v) || w.err != nil {
		return
	}
	w.b, w.err = jsontext.AppendFormat(append(w.b, name...), v)
}

// emptyJSON reports whether v is null, "", {} or [] give or take
// whitespace. It looks at no more than the first five significant bytes.
func emptyJSON(v []byte) bool {
	var sig [5]byte
	n := 0
	for _, c := range v {
		switch c {
		case ' ', '\t', '\r', '\n':
			continue
		}
		if n == len(sig) {
			return false
		}
		sig[n] = c
		n++
	}
	switch string(sig[:n]) {
	case "null", `""`, "{}", "[]":
		return true
	}
	return false
}
