package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/dlq"
	"github.com/agentmesh-io/agentmesh/internal/natstest"
	"github.com/agentmesh-io/agentmesh/subjects"
)

func TestDLQ_Usage(t *testing.T) {
	t.Setenv("NATS_URL", "")
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"dlq", "foo"}, `unknown command "foo"`},
		{[]string{"dlq", "replay"}, "give dead-letter sequence numbers or --all"},
		{[]string{"dlq", "replay", "--all", "3"}, "not both"},
		{[]string{"dlq", "replay", "--all", "--dry-run", "--remove"}, "--dry-run conflicts with --remove"},
		{[]string{"dlq", "rm"}, "sequence numbers"},
		{[]string{"dlq", "rm", "x"}, `sequence "x"`},
	} {
		code, _, errOut := cli(t, tt.args...)
		if code != exitUsage || !strings.Contains(errOut, tt.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit 2 and %q", tt.args, code, errOut, tt.want)
		}
	}
	if code, _, errOut := cli(t, "dlq", "replay"); strings.Contains(errOut, "not both") {
		t.Errorf("dlq replay without arguments: exit %d, %q says \"not both\"", code, errOut)
	}
	if code, out, _ := cli(t, "dlq"); code != exitOK || !strings.Contains(out, "rm") {
		t.Errorf("dlq alone: exit %d, want the help:\n%s", code, out)
	}
}

// TestDLQ_ListReplayRemove: ls --json, replay --dry-run sends nothing,
// replay --remove resolves, rm removes, a missing one is named plainly.
func TestDLQ_ListReplayRemove(t *testing.T) {
	srv := natstest.RunServer(t)
	t.Setenv("NATS_URL", srv.ClientURL())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	js, _ := jetstream.New(natstest.Connect(t, srv))
	scheme := subjects.Default
	for name, subs := range map[string][]string{scheme.Stream(): scheme.StreamSubjects(), scheme.DLQStream(): scheme.DLQSubjects()} {
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: subs}); err != nil {
			t.Fatal(err)
		}
	}
	var ids []string
	for range 3 {
		ids = append(ids, storeDeadLetter(t, ctx, js, scheme).MessageID)
	}
	origSubj, _ := scheme.Direct("planner_1", "high", "orch_1")

	code, out, errOut := cli(t, "dlq", "ls", "--json")
	var listed []struct {
		Seq       uint64        `json:"seq"`
		MessageID string        `json:"message_id"`
		Status    string        `json:"status"`
		Receiver  string        `json:"receiver"`
		Envelope  wire.Envelope `json:"envelope"`
	}
	if code != exitOK || json.Unmarshal([]byte(out), &listed) != nil || len(listed) != 3 {
		t.Fatalf("dlq ls --json: exit %d %s %s", code, out, errOut)
	}
	if l := listed[0]; l.Seq != 1 || l.MessageID != ids[0] || l.Status != "TIMEOUT" || l.Receiver != "planner_1" || l.Envelope.MessageID != ids[0] {
		t.Fatalf("dlq ls --json: first letter %+v", l)
	}

	code, out, errOut = cli(t, "dlq", "replay", "--all", "--dry-run")
	if code != exitOK || strings.Count(out, "would replay dead letter") != 3 || !strings.Contains(out, "to "+origSubj) {
		t.Fatalf("replay --dry-run: exit %d %q %q", code, out, errOut)
	}
	if st, _ := js.Stream(ctx, scheme.Stream()); st.CachedInfo().State.Msgs != 0 {
		t.Fatalf("--dry-run stored %d messages", st.CachedInfo().State.Msgs)
	}

	code, out, errOut = cli(t, "dlq", "replay", "--remove", "2")
	if code != exitOK || !strings.Contains(out, "replayed dead letter 2 to "+origSubj) || !strings.Contains(out, "removed dead letter 2") {
		t.Fatalf("replay --remove: exit %d %q %q", code, out, errOut)
	}
	code, out, errOut = cli(t, "dlq", "rm", "1")
	if code != exitOK || !strings.Contains(out, "removed dead letter 1") {
		t.Fatalf("rm: exit %d %q %q", code, out, errOut)
	}
	letters, err := dlq.Read(ctx, js, scheme, 0)
	if err != nil || len(letters) != 1 || letters[0].Seq != 3 {
		t.Fatalf("after replay --remove 2 and rm 1: %d letters (%v)", len(letters), err)
	}

	for _, args := range [][]string{{"dlq", "replay", "7"}, {"dlq", "rm", "7"}, {"dlq", "rm", "1"}} {
		seq := args[len(args)-1]
		code, _, errOut := cli(t, args...)
		if code != exitFailure || !strings.Contains(errOut, "dead letter "+seq+": not found") || strings.Contains(errOut, "API error") {
			t.Errorf("%v: exit %d, stderr %q; want exit 1 and \"dead letter %s: not found\"", args, code, errOut, seq)
		}
	}
}

// storeDeadLetter stores a dead letter of a request from orch_1 to
// planner_1 as the monitor writes it and returns the original.
func storeDeadLetter(t *testing.T, ctx context.Context, js jetstream.JetStream, scheme subjects.Scheme) *wire.Envelope {
	t.Helper()
	e := wire.NewEnvelope(wire.TypeRequest, "orch_1", "plan")
	e.ReceiverID, e.Priority = "planner_1", wire.PriorityHigh
	body, _ := e.Encode()
	orig, _ := scheme.Direct("planner_1", "high", "orch_1")
	subj, _ := scheme.DLQ("planner_1", "high", "orch_1")
	h := nats.Header{}
	h.Set(wire.HeaderMsgID, e.MessageID+":planner_1_high")
	h.Set(wire.HeaderType, string(e.MessageType))
	h.Set(wire.HeaderAction, "plan")
	h.Set(wire.HeaderCorrelation, e.Correlation)
	h.Set(dlq.HeaderReason, "max_deliveries")
	h.Set(dlq.HeaderStatus, "TIMEOUT")
	h.Set(dlq.HeaderDeliveries, "5")
	h.Set(dlq.HeaderConsumer, "planner_1_high")
	h.Set(dlq.HeaderSubject, orig)
	h.Set(dlq.HeaderOriginalID, e.MessageID)
	if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: subj, Header: h, Data: body}); err != nil {
		t.Fatal(err)
	}
	return e
}
