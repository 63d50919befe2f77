package wire_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"maps"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/subjects"
)

var envelopeTime = time.Date(2025, 8, 21, 10, 30, 0, 123456789, time.UTC)

// validEnvelope returns a request that passes Validate, with every
// conversation id set.
func validEnvelope() *wire.Envelope {
	return &wire.Envelope{
		ACL:          wire.Version,
		MessageID:    "6f1c2a9e-3b7d-4c1a-9e55-0d2f8b1a7c34",
		MessageType:  wire.TypeRequest,
		Action:       "plan_workflow",
		Priority:     wire.PriorityHigh,
		Timestamp:    envelopeTime,
		TTLMillis:    30_000,
		SenderID:     "orchestrator_1",
		SenderType:   "orchestrator",
		ReceiverID:   "planner_1",
		ReceiverType: "planner",
		Correlation:  "session_user_1692633600_a7b2c9d4_1692633612",
		WorkflowID:   "wf_abc",
		TaskID:       "t2",
		SessionID:    "session_user_1692633600",
		RequiresAck:  true,
		Payload:      json.RawMessage(`{"operation":"update"}`),
		Context:      json.RawMessage(`{"previousDecisions":["use JSONL"]}`),
		Metadata:     map[string]string{"source": "test"},
	}
}

func TestEnvelope_Validate(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("x", 257)
	maxID := strings.Repeat("x", 256)
	for _, tc := range []struct {
		name      string
		give      func(e *wire.Envelope)
		wantField string // "" when the envelope is valid
	}{
		{"valid request", func(*wire.Envelope) {}, ""},
		{"valid minimal notification", func(e *wire.Envelope) {
			*e = wire.Envelope{ACL: "1", MessageID: "m", MessageType: wire.TypeNotification, Action: "a",
				Priority: wire.PriorityBatch, Timestamp: envelopeTime, SenderID: "s"}
		}, ""},
		{"valid topic message without receiver", func(e *wire.Envelope) { e.ReceiverID, e.Topic = "", "findings" }, ""},
		{"valid response without action", func(e *wire.Envelope) {
			e.MessageType, e.Action, e.InReplyTo = wire.TypeResponse, "", "msg_001"
		}, ""},
		{"valid NACK ack", func(e *wire.Envelope) {
			e.MessageType, e.InReplyTo, e.Error = wire.TypeAck, "msg_001", wire.NewError(wire.CodeBusy, "busy")
		}, ""},
		{"valid error", func(e *wire.Envelope) {
			e.MessageType, e.Error = wire.TypeError, wire.NewError(wire.CodeNotFound, "no CUST999")
		}, ""},
		{"valid 256-char ids", func(e *wire.Envelope) {
			e.MessageID, e.Correlation, e.WorkflowID, e.TaskID, e.SessionID, e.InReplyTo = maxID, maxID, maxID, maxID, maxID, maxID
		}, ""},
		{"valid 64-char tokens", func(e *wire.Envelope) {
			e.SenderID, e.ReceiverID, e.Topic = strings.Repeat("s", 64), strings.Repeat("r", 64), strings.Repeat("t", 64)
		}, ""},
		{"valid zero ttl", func(e *wire.Envelope) { e.TTLMillis = 0 }, ""},

		{"acl empty", func(e *wire.Envelope) { e.ACL = "" }, "acl"},
		{"acl 2", func(e *wire.Envelope) { e.ACL = "2" }, "acl"},
		{"message_id empty", func(e *wire.Envelope) { e.MessageID = "" }, "message_id"},
		{"message_id 257 chars", func(e *wire.Envelope) { e.MessageID = long }, "message_id"},
		{"message_id space", func(e *wire.Envelope) { e.MessageID = "msg 1" }, "message_id"},
		{"message_id tab", func(e *wire.Envelope) { e.MessageID = "msg\t1" }, "message_id"},
		{"message_id newline", func(e *wire.Envelope) { e.MessageID = "msg\n1" }, "message_id"},
		{"message_type empty", func(e *wire.Envelope) { e.MessageType = "" }, "message_type"},
		{"message_type unknown", func(e *wire.Envelope) { e.MessageType = "publish" }, "message_type"},
		{"message_type upper case", func(e *wire.Envelope) { e.MessageType = "REQUEST" }, "message_type"},
		{"priority empty", func(e *wire.Envelope) { e.Priority = "" }, "priority"},
		{"priority unknown", func(e *wire.Envelope) { e.Priority = "urgent" }, "priority"},
		{"priority medium is input-only", func(e *wire.Envelope) { e.Priority = "medium" }, "priority"},
		{"timestamp zero", func(e *wire.Envelope) { e.Timestamp = time.Time{} }, "timestamp"},
		{"ttl negative", func(e *wire.Envelope) { e.TTLMillis = -1 }, "ttl_ms"},
		{"sender empty", func(e *wire.Envelope) { e.SenderID = "" }, "sender_id"},
		{"sender dot", func(e *wire.Envelope) { e.SenderID = "orch.1" }, "sender_id"},
		{"sender 65 chars", func(e *wire.Envelope) { e.SenderID = strings.Repeat("s", 65) }, "sender_id"},
		{"sender wildcard", func(e *wire.Envelope) { e.SenderID = "*" }, "sender_id"},
		{"receiver wildcard", func(e *wire.Envelope) { e.ReceiverID = ">" }, "receiver_id"},
		{"receiver unicode", func(e *wire.Envelope) { e.ReceiverID = "planificación" }, "receiver_id"},
		{"topic space", func(e *wire.Envelope) { e.Topic = "a b" }, "topic"},
		{"request without action", func(e *wire.Envelope) { e.Action = "" }, "action"},
		{"notification without action", func(e *wire.Envelope) {
			e.MessageType, e.Action = wire.TypeNotification, ""
		}, "action"},
		{"response without in_reply_to", func(e *wire.Envelope) { e.MessageType = wire.TypeResponse }, "in_reply_to"},
		{"ack without in_reply_to", func(e *wire.Envelope) { e.MessageType = wire.TypeAck }, "in_reply_to"},
		{"error without error", func(e *wire.Envelope) { e.MessageType = wire.TypeError }, "error"},
		{"error code empty", func(e *wire.Envelope) { e.Error = &wire.Error{} }, "error.code"},
		{"error code unknown", func(e *wire.Envelope) { e.Error = &wire.Error{Code: "FILE_NOT_FOUND"} }, "error.code"},
		{"correlation_id 257", func(e *wire.Envelope) { e.Correlation = long }, "correlation_id"},
		{"workflow_id 257", func(e *wire.Envelope) { e.WorkflowID = long }, "workflow_id"},
		{"task_id 257", func(e *wire.Envelope) { e.TaskID = long }, "task_id"},
		{"session_id 257", func(e *wire.Envelope) { e.SessionID = long }, "session_id"},
		{"in_reply_to 257", func(e *wire.Envelope) { e.InReplyTo = long }, "in_reply_to"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := validEnvelope()
			tc.give(e)
			err := e.Validate()
			if tc.wantField == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				if _, err := e.Encode(); err != nil {
					t.Fatalf("Encode() = %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, wire.ErrInvalidEnvelope) {
				t.Fatalf("Validate() = %v, want ErrInvalidEnvelope", err)
			}
			var ve *wire.ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("Validate() = %T, want *ValidationError", err)
			}
			if ve.Field != tc.wantField {
				t.Errorf("Field = %q, want %q (%v)", ve.Field, tc.wantField, err)
			}
			if want := "agentkit: invalid envelope: " + tc.wantField + ": "; !strings.HasPrefix(err.Error(), want) || ve.Reason == "" {
				t.Errorf("Error() = %q, want prefix %q and a reason", err, want)
			}
			if b, encErr := e.Encode(); encErr == nil || b != nil {
				t.Errorf("Encode() = %s, %v, want the validation error", b, encErr)
			}
		})
	}
}

// TestEnvelope_ValidateFieldOrder checks that an envelope with several bad
// fields always reports the same one.
func TestEnvelope_ValidateFieldOrder(t *testing.T) {
	t.Parallel()
	e := validEnvelope()
	long := strings.Repeat("x", 257)
	e.Correlation, e.WorkflowID, e.TaskID, e.SessionID, e.InReplyTo = long, long, long, long, long
	for range 50 {
		var ve *wire.ValidationError
		if err := e.Validate(); !errors.As(err, &ve) || ve.Field != "correlation_id" {
			t.Fatalf("Validate() = %v, want the first bad id, correlation_id", err)
		}
	}
}

func TestEnvelope_EncodeDecode(t *testing.T) {
	t.Parallel()
	e := validEnvelope()
	e.Error = wire.NewError(wire.CodeBusy, "busy")
	e.Error.RetryAfterMS = 5000
	e.Error.Details = map[string]any{"queue": 42.0}
	e.Trace = &wire.Trace{TraceID: "trace_123", SpanID: "span_456", ParentSpan: "span_123"}
	data, err := e.Encode()
	if err != nil {
		t.Fatal(err)
	}
	got, err := wire.Decode(data)
	if err != nil {
		t.Fatalf("Decode(%s): %v", data, err)
	}
	if !got.Timestamp.Equal(e.Timestamp) {
		t.Errorf("Timestamp = %v, want %v", got.Timestamp, e.Timestamp)
	}
	got.Timestamp = e.Timestamp
	gotJSON, _ := json.Marshal(got)
	wantJSON, _ := json.Marshal(e)
	if !bytes.Equal(gotJSON, wantJSON) {
		t.Errorf("round trip:\n got %s\nwant %s", gotJSON, wantJSON)
	}

	for _, give := range []string{``, `{`, `[]`, `"x"`, `null`, `{}`, `{"acl":"1"}`} {
		if _, err := wire.Decode([]byte(give)); !errors.Is(err, wire.ErrInvalidEnvelope) {
			t.Errorf("Decode(%q) = %v, want ErrInvalidEnvelope", give, err)
		}
	}
}

// TestEnvelope_EncodeOmitsUnsetFields checks the canonical form the JSON
// Schema describes: optional fields that are not set are not written.
func TestEnvelope_EncodeOmitsUnsetFields(t *testing.T) {
	t.Parallel()
	e := wire.NewEnvelope(wire.TypeRequest, "orch_1", "ping")
	data, err := e.Encode()
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	want := []string{"acl", "action", "message_id", "message_type", "priority", "sender_id", "timestamp"}
	if got := slices.Sorted(maps.Keys(m)); !slices.Equal(got, want) {
		t.Errorf("NewEnvelope encodes fields %q, want %q: %s", got, want, data)
	}

	e.MessageType, e.InReplyTo = wire.TypeError, "m-0"
	e.Error = &wire.Error{Code: wire.CodeInvalid}
	if data, err = e.Encode(); err != nil {
		t.Fatal(err)
	}
	var errObj struct {
		Error map[string]any `json:"error"`
	}
	if err := json.Unmarshal(data, &errObj); err != nil {
		t.Fatal(err)
	}
	if got, want := slices.Sorted(maps.Keys(errObj.Error)), []string{"code", "retryable"}; !slices.Equal(got, want) {
		t.Errorf("error encodes fields %q, want %q: %s", got, want, data)
	}
}

// TestEnvelope_EncodeDeterministic checks that one envelope always encodes to
// the same bytes, map fields included.
func TestEnvelope_EncodeDeterministic(t *testing.T) {
	t.Parallel()
	e := validEnvelope()
	e.Metadata = map[string]string{}
	details := map[string]any{}
	for _, k := range strings.Split("a b c d e f g h", " ") {
		e.Metadata[k] = k
		details[k] = k
	}
	e.Error = &wire.Error{Code: wire.CodeInternal, Details: details}
	first, err := e.Encode()
	if err != nil {
		t.Fatal(err)
	}
	for range 20 {
		if again, _ := e.Encode(); !bytes.Equal(again, first) {
			t.Fatalf("Encode is not deterministic:\n%s\n%s", first, again)
		}
	}
}

func TestPriority_Text(t *testing.T) {
	t.Parallel()
	want := []wire.Priority{"critical", "high", "normal", "low", "batch"}
	if !slices.Equal(wire.Priorities, want) {
		t.Fatalf("Priorities = %q, want %q", wire.Priorities, want)
	}
	for _, p := range wire.Priorities {
		if !p.Valid() || p.String() != string(p) {
			t.Errorf("%q: Valid() = %v, String() = %q", p, p.Valid(), p.String())
		}
		b, err := p.MarshalText()
		if err != nil || string(b) != string(p) {
			t.Errorf("%q.MarshalText() = %q, %v", p, b, err)
		}
		var got wire.Priority
		if err := got.UnmarshalText(b); err != nil || got != p {
			t.Errorf("UnmarshalText(%q) = %q, %v", b, got, err)
		}
		if parsed, err := wire.ParsePriority(string(p)); err != nil || parsed != p {
			t.Errorf("ParsePriority(%q) = %q, %v", p, parsed, err)
		}
	}

	// "medium" is accepted on input as normal.
	if got, err := wire.ParsePriority("medium"); err != nil || got != wire.PriorityNormal {
		t.Errorf("ParsePriority(medium) = %q, %v, want normal", got, err)
	}
	var medium wire.Priority
	if err := json.Unmarshal([]byte(`"medium"`), &medium); err != nil || medium != wire.PriorityNormal {
		t.Errorf("json.Unmarshal(medium) = %q, %v, want normal", medium, err)
	}

	for _, give := range []string{"", "MEDIUM", "High", "urgent", "normal ", "4"} {
		if got, err := wire.ParsePriority(give); !errors.Is(err, wire.ErrInvalidEnvelope) || got != "" {
			t.Errorf("ParsePriority(%q) = %q, %v, want ErrInvalidEnvelope", give, got, err)
		}
		p := wire.PriorityLow
		if err := p.UnmarshalText([]byte(give)); !errors.Is(err, wire.ErrInvalidEnvelope) || p != wire.PriorityLow {
			t.Errorf("UnmarshalText(%q) = %v and set %q, want ErrInvalidEnvelope and no change", give, err, p)
		}
	}
	for _, give := range []wire.Priority{"", "medium", "urgent"} {
		if give.Valid() {
			t.Errorf("Priority(%q).Valid() = true", give)
		}
		if b, err := give.MarshalText(); !errors.Is(err, wire.ErrInvalidEnvelope) {
			t.Errorf("Priority(%q).MarshalText() = %q, %v, want ErrInvalidEnvelope", give, b, err)
		}
	}
}

// TestPriority_MatchesSubjects checks that every priority is spelled like the
// subject token of the same rank.
func TestPriority_MatchesSubjects(t *testing.T) {
	t.Parallel()
	if len(wire.Priorities) != len(subjects.Priorities) {
		t.Fatalf("wire.Priorities = %q, subjects.Priorities = %q", wire.Priorities, subjects.Priorities)
	}
	for i, p := range wire.Priorities {
		if string(p) != subjects.Priorities[i] {
			t.Errorf("wire.Priorities[%d] = %q, subjects.Priorities[%d] = %q", i, p, i, subjects.Priorities[i])
		}
		if err := subjects.ValidatePriority(string(p)); err != nil {
			t.Errorf("subjects rejects %q: %v", p, err)
		}
	}
}

func TestMessageType_Text(t *testing.T) {
	t.Parallel()
	for _, ty := range []wire.MessageType{wire.TypeRequest, wire.TypeResponse, wire.TypeNotification, wire.TypeError, wire.TypeAck} {
		if !ty.Valid() {
			t.Errorf("%q.Valid() = false", ty)
		}
		b, err := ty.MarshalText()
		if err != nil || string(b) != string(ty) {
			t.Errorf("%q.MarshalText() = %q, %v", ty, b, err)
		}
		var got wire.MessageType
		if err := got.UnmarshalText(b); err != nil || got != ty {
			t.Errorf("UnmarshalText(%q) = %q, %v", b, got, err)
		}
	}
	for _, give := range []string{"", "REQUEST", "publish", "broadcast", "ack "} {
		ty := wire.TypeAck
		if err := ty.UnmarshalText([]byte(give)); !errors.Is(err, wire.ErrInvalidEnvelope) || ty != wire.TypeAck {
			t.Errorf("UnmarshalText(%q) = %v and set %q, want ErrInvalidEnvelope and no change", give, err, ty)
		}
		if wire.MessageType(give).Valid() {
			t.Errorf("MessageType(%q).Valid() = true", give)
		}
		if b, err := wire.MessageType(give).MarshalText(); !errors.Is(err, wire.ErrInvalidEnvelope) {
			t.Errorf("MessageType(%q).MarshalText() = %q, %v, want ErrInvalidEnvelope", give, b, err)
		}
	}
}

func TestErrorCode_Text(t *testing.T) {
	t.Parallel()
	if len(wire.ErrorCodes) != 10 {
		t.Errorf("ErrorCodes = %q, want 10 codes", wire.ErrorCodes)
	}
	for _, c := range wire.ErrorCodes {
		if !c.Valid() {
			t.Errorf("%q.Valid() = false", c)
		}
		b, err := c.MarshalText()
		if err != nil || string(b) != string(c) {
			t.Errorf("%q.MarshalText() = %q, %v", c, b, err)
		}
		var got wire.ErrorCode
		if err := got.UnmarshalText(b); err != nil || got != c {
			t.Errorf("UnmarshalText(%q) = %q, %v", b, got, err)
		}
	}
	for _, give := range []string{"", "timeout", "FILE_NOT_FOUND", "TIMEOUT "} {
		c := wire.CodeBusy
		if err := c.UnmarshalText([]byte(give)); !errors.Is(err, wire.ErrInvalidEnvelope) || c != wire.CodeBusy {
			t.Errorf("UnmarshalText(%q) = %v and set %q, want ErrInvalidEnvelope and no change", give, err, c)
		}
		if b, err := wire.ErrorCode(give).MarshalText(); !errors.Is(err, wire.ErrInvalidEnvelope) {
			t.Errorf("ErrorCode(%q).MarshalText() = %q, %v, want ErrInvalidEnvelope", give, b, err)
		}
	}
}

func TestErrorCode_Retryable(t *testing.T) {
	t.Parallel()
	want := map[wire.ErrorCode]bool{
		wire.CodeTimeout:           true,
		wire.CodeUnavailable:       true,
		wire.CodeBusy:              true,
		wire.CodeRateLimit:         true,
		wire.CodeInternal:          true, // a crash may be transient
		wire.CodeInvalid:           false,
		wire.CodeRejected:          false,
		wire.CodeCapabilityMissing: false,
		wire.CodeNotFound:          false,
		wire.CodeExpired:           false,
	}
	if got := slices.Sorted(slices.Values(wire.ErrorCodes)); !slices.Equal(got, slices.Sorted(maps.Keys(want))) {
		t.Fatalf("ErrorCodes = %q; this table covers %q", got, slices.Sorted(maps.Keys(want)))
	}
	for c, w := range want {
		if got := c.Retryable(); got != w {
			t.Errorf("%s.Retryable() = %v, want %v", c, got, w)
		}
		if e := wire.NewError(c, "x %d", 1); e.Retryable != w || e.Code != c || e.Message != "x 1" {
			t.Errorf("NewError(%s) = %+v", c, e)
		}
	}
	if wire.ErrorCode("BOGUS").Retryable() {
		t.Error("unknown code is retryable")
	}
}

// checkReply checks what every reply to orig from self carries.
func checkReply(t *testing.T, r, orig *wire.Envelope, self string, ty wire.MessageType) {
	t.Helper()
	if r.MessageType != ty || r.SenderID != self || r.ACL != wire.Version {
		t.Errorf("type %q, sender %q, acl %q, want %q, %q, %q", r.MessageType, r.SenderID, r.ACL, ty, self, wire.Version)
	}
	if r.MessageID == "" || r.MessageID == orig.MessageID {
		t.Errorf("message_id %q, want a new id", r.MessageID)
	}
	if r.InReplyTo != orig.MessageID || r.ReceiverID != orig.SenderID || r.ReceiverType != orig.SenderType {
		t.Errorf("in_reply_to %q, receiver %q/%q, want %q, %q/%q", r.InReplyTo, r.ReceiverID, r.ReceiverType,
			orig.MessageID, orig.SenderID, orig.SenderType)
	}
	wantCorr := orig.Correlation
	if wantCorr == "" {
		wantCorr = orig.MessageID
	}
	if r.Correlation != wantCorr || r.WorkflowID != orig.WorkflowID || r.TaskID != orig.TaskID || r.SessionID != orig.SessionID {
		t.Errorf("ids %q %q %q %q, want %q %q %q %q", r.Correlation, r.WorkflowID, r.TaskID, r.SessionID,
			wantCorr, orig.WorkflowID, orig.TaskID, orig.SessionID)
	}
	if r.Priority != orig.Priority || !bytes.Equal(r.Context, orig.Context) {
		t.Errorf("priority %q, context %s, want %q, %s", r.Priority, r.Context, orig.Priority, orig.Context)
	}
	if r.Timestamp.IsZero() || r.Timestamp.Location() != time.UTC {
		t.Errorf("timestamp %v, want now in UTC", r.Timestamp)
	}
	if err := r.Validate(); err != nil {
		t.Errorf("reply does not validate: %v", err)
	}
}

func TestEnvelope_Replies(t *testing.T) {
	t.Parallel()
	withCorr := validEnvelope()
	noCorr := validEnvelope()
	noCorr.Correlation = ""
	for name, orig := range map[string]*wire.Envelope{"with correlation": withCorr, "without correlation": noCorr} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			payload := json.RawMessage(`{"tasks":[]}`)
			resp := orig.NewResponse("planner_1", "plan_complete", payload)
			checkReply(t, resp, orig, "planner_1", wire.TypeResponse)
			if resp.Status != wire.StatusSuccess || resp.Action != "plan_complete" || !bytes.Equal(resp.Payload, payload) || resp.Error != nil {
				t.Errorf("response status %q, action %q, payload %s, error %v", resp.Status, resp.Action, resp.Payload, resp.Error)
			}

			ack := orig.NewAck("planner_1", nil, 1500*time.Millisecond)
			checkReply(t, ack, orig, "planner_1", wire.TypeAck)
			if ack.Status != wire.StatusACK || ack.Error != nil || ack.Action != orig.Action ||
				ack.Metadata["processing_time_ms"] != "1500" {
				t.Errorf("ack status %q, error %v, action %q, metadata %v", ack.Status, ack.Error, ack.Action, ack.Metadata)
			}

			reason := wire.NewError(wire.CodeBusy, "queue full")
			nack := orig.NewAck("planner_1", reason, 0)
			checkReply(t, nack, orig, "planner_1", wire.TypeAck)
			if nack.Status != wire.StatusNACK || nack.Error != reason || nack.Metadata["processing_time_ms"] != "0" {
				t.Errorf("nack status %q, error %v, metadata %v", nack.Status, nack.Error, nack.Metadata)
			}
		})
	}
}

// TestEnvelope_NewErrorReply checks the reply's status: rejected when the
// error is not retryable (retrying cannot help), failed when it is.
func TestEnvelope_NewErrorReply(t *testing.T) {
	t.Parallel()
	orig := validEnvelope()
	type tcase struct {
		name string
		give *wire.Error
		want string
	}
	var cases []tcase
	for _, c := range wire.ErrorCodes {
		want := wire.StatusFailed
		if !c.Retryable() {
			want = wire.StatusRejected
		}
		cases = append(cases, tcase{string(c), wire.NewError(c, "because"), want})
	}
	cases = append(cases,
		tcase{"BUSY marked permanent", &wire.Error{Code: wire.CodeBusy, Retryable: false}, wire.StatusRejected},
		tcase{"INVALID marked retryable", &wire.Error{Code: wire.CodeInvalid, Retryable: true}, wire.StatusFailed},
	)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := orig.NewErrorReply("planner_1", tc.give)
			checkReply(t, r, orig, "planner_1", wire.TypeError)
			if r.Status != tc.want || r.Error != tc.give || r.Action != orig.Action {
				t.Errorf("status %q, error %v, action %q, want %q, %v, %q", r.Status, r.Error, r.Action, tc.want, tc.give, orig.Action)
			}
		})
	}
}

func TestNewCorrelationID(t *testing.T) {
	t.Parallel()
	at := time.Date(2023, 8, 21, 16, 0, 12, 0, time.FixedZone("CEST", 2*3600)) // unix 1692626412
	// sha256("hello") = 2cf24dba5fb0a30e...
	if got, want := wire.NewCorrelationID("session_user_1692633600", "hello", at), "session_user_1692633600_2cf24dba_1692626412"; got != want {
		t.Errorf("NewCorrelationID = %q, want %q", got, want)
	}
	format := regexp.MustCompile(`^sess-1_[0-9a-f]{8}_1692626412$`)
	a := wire.NewCorrelationID("sess-1", "list devices in datacenter-01", at)
	b := wire.NewCorrelationID("sess-1", "list devices in datacenter-02", at)
	for _, id := range []string{a, b} {
		if !format.MatchString(id) {
			t.Errorf("%q does not match %s", id, format)
		}
	}
	if a == b {
		t.Errorf("different queries give the same id %q", a)
	}
	if again := wire.NewCorrelationID("sess-1", "list devices in datacenter-01", at); again != a {
		t.Errorf("same inputs give %q and %q", a, again)
	}
}

func TestEnvelope_Expired(t *testing.T) {
	t.Parallel()
	ts := envelopeTime
	for _, tc := range []struct {
		name string
		ttl  int64
		now  time.Time
		want bool
	}{
		{"no ttl, long after", 0, ts.Add(24 * 365 * time.Hour), false},
		{"before timestamp", 1000, ts.Add(-time.Hour), false},
		{"at timestamp", 1000, ts, false},
		{"just before deadline", 1000, ts.Add(999 * time.Millisecond), false},
		{"at deadline", 1000, ts.Add(time.Second), false},
		{"just after deadline", 1000, ts.Add(time.Second + time.Nanosecond), true},
		{"long after", 30_000, ts.Add(time.Hour), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := validEnvelope()
			e.Timestamp, e.TTLMillis = ts, tc.ttl
			if got := e.Expired(tc.now); got != tc.want {
				t.Errorf("Expired(%v) with ttl %dms = %v, want %v", tc.now.Sub(ts), tc.ttl, got, tc.want)
			}
		})
	}
}
