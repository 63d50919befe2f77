package agentkit

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestFastBatchResult reads each kind of reply a fast batch can get.
func TestFastBatchResult(t *testing.T) {
	reply := func(v any) *nats.Msg {
		data, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return &nats.Msg{Data: data}
	}
	status := func(code, text string) *nats.Msg {
		return &nats.Msg{Header: nats.Header{"Status": {code}, "Description": {text}}}
	}
	for _, tc := range []struct {
		name    string
		msg     *nats.Msg
		stored  int
		wantErr bool
		is      error // if set, the error must match it
	}{
		{"commit ack", reply(fastBatchReply{Batch: "b1", Count: 7}), 7, false, nil},
		{"flow control", reply(fastBatchReply{Type: "ack"}), -1, false, nil},
		{"another batch's ack", reply(fastBatchReply{Batch: "b2", Count: 7}), 0, true, errFastBatchUnsupported},
		{"batch publish disabled", reply(fastBatchReply{Error: &jetstream.APIError{ErrorCode: jsBatchPublishDisabled}}), 0, true, errFastBatchUnsupported},
		{"stream error", reply(fastBatchReply{Error: &jetstream.APIError{Code: 503, ErrorCode: 10077}}), 0, true, &jetstream.APIError{ErrorCode: 10077}},
		{"no responders", status("503", ""), 0, true, nats.ErrNoResponders},
		{"other status", status("408", "Request Timeout"), 0, true, nil},
		{"not JSON", &nats.Msg{Data: []byte("?")}, 0, true, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stored, err := fastBatchResult(tc.msg, "b1")
			if stored != tc.stored {
				t.Errorf("stored %d, want %d", stored, tc.stored)
			}
			if (err != nil) != tc.wantErr || (tc.is != nil && !errors.Is(err, tc.is)) {
				t.Errorf("err = %v, want error %v (matching %v)", err, tc.wantErr, tc.is)
			}
		})
	}
}
