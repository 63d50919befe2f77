package agentkit

import (
	"errors"
	"fmt"
	"testing"

	"github.com/agentmesh-io/agentmesh/agentkit/wire"
)

// acceptResponse is a Request's accept, for the waiter tests.
func acceptResponse(r *wire.Envelope) bool { return r.MessageType == wire.TypeResponse }

func answer(id string, t wire.MessageType) *wire.Envelope {
	return &wire.Envelope{MessageType: t, InReplyTo: id}
}

// A waiter takes one answer; the answer is remembered for a later call
// under the same id, which learns it came before it, unless it is of a
// kind that call does not take.
func TestWaiters_AnswerRememberedForRetry(t *testing.T) {
	a := &Agent{send: sender{waiters: map[string]*waiter{}}}
	w, err := a.send.addWaiter("m1", acceptResponse)
	if err != nil || w == nil {
		t.Fatalf("addWaiter: %v, %v", w, err)
	}
	if _, err := a.send.addWaiter("m1", acceptResponse); !errors.Is(err, ErrDuplicateRequest) {
		t.Fatalf("second waiter on m1: %v, want ErrDuplicateRequest", err)
	}
	if got := a.send.takeWaiter(answer("m1", wire.TypeAck)); got != nil {
		t.Fatal("a Request's waiter took an ACK")
	}
	if got := a.send.takeWaiter(answer("m1", wire.TypeResponse)); got != w {
		t.Fatal("the waiter did not take its response")
	}
	if got := a.send.takeWaiter(answer("m1", wire.TypeResponse)); got != nil {
		t.Fatal("a waiter took a second answer")
	}
	if a.send.answeredBefore("m1", w) {
		t.Fatal("the answer handed to w counts as an earlier call's")
	}
	a.send.removeWaiter("m1", w)

	retry, err := a.send.addWaiter("m1", acceptResponse)
	if err != nil {
		t.Fatal(err)
	}
	if !a.send.answeredBefore("m1", retry) {
		t.Fatal("a retry does not learn that the answer came to the earlier call")
	}
	a.send.removeWaiter("m1", retry)
	ack, err := a.send.addWaiter("m1", func(r *wire.Envelope) bool { return r.MessageType == wire.TypeAck })
	if err != nil {
		t.Fatal(err)
	}
	if !a.send.answeredBefore("m1", ack) {
		t.Fatal("a call taking ACKs does not learn that one came")
	}
	a.send.removeWaiter("m1", ack)

	// A call that ended without an answer leaves nothing behind.
	w2, _ := a.send.addWaiter("m2", acceptResponse)
	a.send.removeWaiter("m2", w2)
	if _, ok := a.send.waiters["m2"]; ok {
		t.Fatal("an unanswered call's waiter kept")
	}
}

// Answers to ids nobody waits on are remembered up to maxAnswered ids,
// and forgetting never drops a waiting call.
func TestWaiters_AnswersBounded(t *testing.T) {
	a := &Agent{send: sender{waiters: map[string]*waiter{}}}
	w, _ := a.send.addWaiter("waiting", acceptResponse)
	for i := range 3 * maxAnswered {
		a.send.takeWaiter(answer(fmt.Sprint("late-", i), wire.TypeResponse))
		if n := len(a.send.waiters); n > maxAnswered {
			t.Fatalf("%d entries after %d answers, want at most %d", n, i+1, maxAnswered)
		}
	}
	for i := range 3 * maxAnswered {
		w, _ := a.send.addWaiter(fmt.Sprint("answered-", i), acceptResponse)
		a.send.takeWaiter(answer(fmt.Sprint("answered-", i), wire.TypeResponse))
		a.send.removeWaiter(fmt.Sprint("answered-", i), w)
		if n := len(a.send.waiters); n > maxAnswered {
			t.Fatalf("%d entries after %d answered calls, want at most %d", n, i+1, maxAnswered)
		}
	}
	if a.send.waiters["waiting"] != w || a.send.takeWaiter(answer("waiting", wire.TypeResponse)) != w {
		t.Fatal("the waiting call was forgotten")
	}
	a.send.failWaiters()
	if w, err := a.send.addWaiter("after", acceptResponse); w != nil || err != nil {
		t.Fatalf("addWaiter after stop: %v, %v; want nil, nil", w, err)
	}
}
