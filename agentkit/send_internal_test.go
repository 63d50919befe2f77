package agentkit

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestRetryablePublish checks which publish failures SendBatch and Send
// repeat under the same message id.
func TestRetryablePublish(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{nats.ErrTimeout, true},
		{context.DeadlineExceeded, true},
		{nats.ErrNoResponders, true},
		{&jetstream.APIError{Code: 503, ErrorCode: 10008, Description: "JetStream system temporarily unavailable"}, true},
		{fmt.Errorf("wrapped: %w", &jetstream.APIError{Code: 409, ErrorCode: jsDuplicateInProcess, Description: "duplicate message id is in process"}), true},
		{&jetstream.APIError{Code: 400, ErrorCode: 10054, Description: "maximum messages exceeded"}, false},
		{&jetstream.APIError{Code: 400, ErrorCode: jsBatchPublishDisabled}, false},
		{fmt.Errorf("%w: no", ErrPermissionDenied), false},
		{nats.ErrConnectionClosed, false},
		{nats.ErrMaxPayload, false},
	} {
		if got := retryablePublish(tc.err); got != tc.want {
			t.Errorf("retryablePublish(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// After an attempt no stream answered (a leader being elected), the next
// waits at most electionRetry; after any other failure, the exponential
// schedule's wait.
func TestPublishRetry_ShortAfterNoStream(t *testing.T) {
	p := newPublishRetry()
	for range 8 { // far along the schedule: waits near its 2s maximum
		p.NextBackOff()
	}
	p.after(fmt.Errorf("attempt: %w", jetstream.ErrNoStreamResponse))
	if d := p.NextBackOff(); d > electionRetry {
		t.Errorf("wait after no stream answered = %v, want at most %v", d, electionRetry)
	}
	p.after(errors.New("nats: timeout"))
	if d := p.NextBackOff(); d <= electionRetry {
		t.Errorf("wait after a timeout = %v, want the schedule's (above %v)", d, electionRetry)
	}
}
