package ackmonitor_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/agentmesh-io/agentmesh/ackmonitor"
	"github.com/agentmesh-io/agentmesh/agentkit"
)

// A message to an agent that does not exist is stored and waits for good:
// the monitor counts it by receiver and lists the receiver in the API.
// Messages to an agent that exists are not counted.
func TestUnknownReceivers_Visible(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	st := openStore(t, sqliteStore)
	ctx := testCtx(t)
	m.agent("worker", map[string]agentkit.HandlerFunc{"ok": func(context.Context, *agentkit.Message) error { return nil }})
	client := m.agent("client", nil)
	mon := startMonitor(t, m.s, fastConfig(st))
	for _, to := range []string{"ghost", "worker", "ghost"} {
		if _, err := client.Send(ctx, to, "ok", nil); err != nil {
			t.Fatal(err)
		}
	}
	srv := httptest.NewServer(mon.Handler())
	t.Cleanup(srv.Close)
	metrics := func() string {
		res, err := http.Get(srv.URL + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return string(b)
	}
	eventually(t, 20*time.Second, "the messages to ghost counted", func() bool {
		return strings.Contains(metrics(), `ackmonitor_messages_to_unknown_agents_total{receiver="ghost"} 2`)
	})
	if strings.Contains(metrics(), `ackmonitor_messages_to_unknown_agents_total{receiver="worker"}`) {
		t.Error("a message to an existing agent counted as unknown")
	}
	var got struct {
		Receivers []ackmonitor.UnknownReceiver `json:"unknown_receivers"`
	}
	getJSON(t, srv.URL+"/api/v1/unknown_receivers", &got)
	if len(got.Receivers) != 1 || got.Receivers[0].Receiver != "ghost" || got.Receivers[0].Messages != 2 ||
		got.Receivers[0].LastSender != "client" || got.Receivers[0].LastMessageID == "" {
		t.Errorf("unknown receivers = %+v, want ghost with 2 messages from client", got.Receivers)
	}
	var summary ackmonitor.Summary
	getJSON(t, srv.URL+"/api/v1/summary", &summary)
	if summary.UnknownReceivers != 1 {
		t.Errorf("summary unknown_receivers = %d, want 1", summary.UnknownReceivers)
	}
}
