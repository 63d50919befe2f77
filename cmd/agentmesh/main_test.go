package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/dlq"
	"github.com/agentmesh-io/agentmesh/internal/natstest"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// cli runs the CLI in-process and returns its exit code and output.
func cli(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	code := run(ctx, args, &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestHelp_EveryCommand(t *testing.T) {
	t.Setenv("NATS_URL", "")
	for _, args := range [][]string{{"--help"}, {"demo", "--help"}, {"up", "--help"}, {"send", "--help"}, {"request", "--help"},
		{"trace", "--help"}, {"dlq", "--help"}, {"dlq", "ls", "--help"}, {"dlq", "replay", "--help"}, {"agents", "--help"},
		{"stats", "--help"}, {"bench", "--help"}, {"auth", "--help"}, {"migrate", "--help"}, {"streams", "--help"}} {
		code, out, errOut := cli(t, args...)
		if code != exitOK || !strings.Contains(out, "Usage:") {
			t.Errorf("%v: exit %d, stdout %q, stderr %q", args, code, out, errOut)
		}
	}
	if _, out, _ := cli(t, "--help"); !strings.Contains(out, "2  usage error") || strings.Contains(out, "3  the demo") {
		t.Errorf("root help does not document the exit codes, or lists the demo's:\n%s", out)
	}
	if _, out, _ := cli(t, "demo", "--help"); !strings.Contains(out, "3  the demo's workflows did not end as expected") {
		t.Errorf("demo help does not document its exit code 3:\n%s", out)
	}
}

func TestExitCodes_Usage(t *testing.T) {
	t.Setenv("NATS_URL", "")
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	os.WriteFile(bad, []byte("mesh:\n  prefix: Team-A\n"), 0o600)
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"nope"}, "unknown command"},
		{[]string{"demo", "--nope"}, "unknown flag"},
		{[]string{"trace"}, "one correlation id"},
		{[]string{"--config", bad, "agents"}, `mesh.prefix "Team-A"`},
		{[]string{"send", "--to", "x"}, "--to and --action"},
		{[]string{"send", "--to", "x", "--action", "a", "--payload", "{"}, "not valid JSON"},
		{[]string{"send", "--to", "x", "--action", "a", "--priority", "urgent"}, "urgent"},
		{[]string{"dlq", "replay"}, "--all"},
		{[]string{"bench", "--messages", "-1"}, "messages"},
		{[]string{"bench", "--messages", "0"}, "messages 0"},
		{[]string{"send", "--file", "env.json", "--to", "x"}, "--to conflicts with --file"},
		{[]string{"send", "--file", "env.json", "--priority", "high"}, "--priority conflicts with --file"},
		{[]string{"request", "--file", "env.json", "--ttl", "1m"}, "--ttl conflicts with --file"},
		{[]string{"dlq", "ls", "--limit", "-1"}, "--limit -1"},
		{[]string{"dlq", "ls", "--limit", "0"}, "--limit 0"},
		{[]string{"dlq", "replay", "0"}, "sequence 0"},
		{[]string{"demo", "--serve", "--every", "0"}, "--every 0s"},
		{[]string{"demo", "--every", "-1s"}, "--every -1s"},
		{[]string{"auth"}, "requires at least 1 arg"},
		{[]string{"agents", "extra"}, "unknown command"},
		{[]string{"request", "--to", "x", "--action", "a", "--timeout", "0"}, "--timeout 0s"},
	} {
		code, _, errOut := cli(t, tt.args...)
		if code != exitUsage || !strings.Contains(errOut, tt.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit 2 and %q", tt.args, code, errOut, tt.want)
		}
	}
}

func TestStats_Unreachable(t *testing.T) {
	t.Setenv("NATS_URL", "")
	code, _, errOut := cli(t, "stats", "--monitor", "http://127.0.0.1:1")
	if code != exitFailure || !strings.Contains(errOut, "unreachable") {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
}

func TestStats_FromMonitorAPI(t *testing.T) {
	t.Setenv("NATS_URL", "")
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/api/v1/summary":
			w.Write([]byte(`{"monitor":"m1","active":true,"window_seconds":300,"window":{"sent":100,"acked":93,"timed_out":7,"ack_rate":0.93,"timeout_rate":0.07}}`))
		case "/api/v1/agents":
			w.Write([]byte(`{"agents":[{"agent":"planner_1","window":{"sent":100,"acked":93},"priorities":[{"priority":"high","window":{"sent":100}}]}]}`))
		case "/api/v1/alerts":
			w.Write([]byte(`{"alerts":[{"agent":"planner_1","kind":"timeout_rate","severity":"warning","value":0.07,"threshold":0.05,"samples":100}]}`))
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	code, out, errOut := cli(t, "stats", "--monitor", srv.URL)
	if code != exitOK || !strings.Contains(out, "planner_1") || !strings.Contains(out, "93.0") || !strings.Contains(out, "timeout_rate") {
		t.Fatalf("exit %d\n%s\n%s", code, out, errOut)
	}
}

// TestAgainstServer drives send, request, trace, agents and dlq against an
// embedded server with a planner agent.
func TestAgainstServer(t *testing.T) {
	srv := natstest.RunServer(t)
	t.Setenv("NATS_URL", srv.ClientURL())
	nc := natstest.Connect(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	code, out, _ := cli(t, "agents")
	if code != exitOK || !strings.Contains(out, "no registry") {
		t.Fatalf("agents without registry: %d %q", code, out)
	}
	code, out, _ = cli(t, "dlq", "ls")
	if code != exitOK || !strings.Contains(out, "no dead letters") {
		t.Fatalf("dlq ls without stream: %d %q", code, out)
	}

	got := make(chan *wire.Envelope, 10)
	planner, _ := agentkit.New(nc, "planner_1", agentkit.WithType("planner"))
	planner.HandleFunc("plan_workflow", func(ctx context.Context, m *agentkit.Message) error {
		got <- m.Envelope
		return m.Reply(ctx, "plan_complete", map[string]string{"plan": "ok"})
	})
	if err := planner.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer planner.Stop()

	code, out, errOut := cli(t, "request", "--to", "planner_1", "--action", "plan_workflow", "--priority", "high",
		"--payload", `{"target_customer_id":"CUST001"}`, "--correlation", "corr_cli", "--workflow", "wf_1", "--timeout", "20s")
	if code != exitOK {
		t.Fatalf("request: exit %d: %s", code, errOut)
	}
	var reply wire.Envelope
	if err := json.Unmarshal([]byte(out), &reply); err != nil || reply.Action != "plan_complete" || reply.Correlation != "corr_cli" {
		t.Fatalf("request printed %q (%v)", out, err)
	}

	code, out, errOut = cli(t, "send", "--to", "planner_1", "--action", "plan_workflow", "--correlation", "corr_cli",
		"--payload", `{"n":2}`, "--ttl", "1m", "--task", "t9")
	if code != exitOK || !strings.Contains(out, "message_id=") {
		t.Fatalf("send: exit %d %q %q", code, out, errOut)
	}
	<-got
	select {
	case e := <-got:
		if e.TaskID != "t9" || e.TTLMillis != 60000 || e.Priority != wire.PriorityNormal {
			t.Errorf("sent envelope %+v", e)
		}
	case <-ctx.Done():
		t.Fatal("send did not arrive")
	}

	// --file: validated like a received envelope.
	file := filepath.Join(t.TempDir(), "env.json")
	env := wire.NewEnvelope(wire.TypeRequest, "ops", "plan_workflow")
	env.ReceiverID, env.Correlation = "planner_1", "corr_file"
	data, _ := env.Encode()
	os.WriteFile(file, data, 0o600)
	if code, _, errOut := cli(t, "send", "--file", file); code != exitOK {
		t.Fatalf("send --file: %d %s", code, errOut)
	}
	// The same file again: the stream keeps the first, and send says so.
	if code, out, errOut := cli(t, "send", "--file", file); code != exitFailure || !strings.Contains(errOut, "already holds message_id "+env.MessageID) || out != "" {
		t.Fatalf("send --file twice: %d %q %s", code, out, errOut)
	}
	env = wire.NewEnvelope(wire.TypeNotification, "ops", "status")
	data, _ = env.Encode()
	os.WriteFile(file, data, 0o600)
	if code, out, errOut := cli(t, "send", "--from", "ops", "--file", file); code != exitOK || !strings.Contains(out, "to broadcast") {
		t.Fatalf("send --file without receiver or topic: %d %q %s", code, out, errOut)
	}
	os.WriteFile(file, []byte(`{"acl":"1"}`), 0o600)
	if code, _, errOut := cli(t, "send", "--file", file); code != exitUsage || !strings.Contains(errOut, "invalid envelope") {
		t.Fatalf("send --file invalid: %d %s", code, errOut)
	}

	// The planner answers in the background: wait until both replies are stored.
	js, _ := jetstream.New(nc)
	natstest.WaitFor(t, 10*time.Second, func() error {
		code, out, _ = cli(t, "trace", "corr_cli")
		if strings.Count(out, "plan_complete") < 2 {
			return errMsg(out)
		}
		return nil
	})
	if code != exitOK || !strings.Contains(out, "cli → planner_1  request plan_workflow [high]") ||
		!strings.Contains(out, "└─ ") {
		t.Fatalf("trace:\n%s", out)
	}
	if code, _, errOut := cli(t, "trace", "no_such_corr"); code != exitFailure || !strings.Contains(errOut, "no messages") {
		t.Fatalf("trace unknown: %d %s", code, errOut)
	}

	// agents: the planner registered itself.
	natstest.WaitFor(t, 10*time.Second, func() error {
		code, out, _ = cli(t, "agents")
		if !strings.Contains(out, "planner_1") {
			return errMsg(out)
		}
		return nil
	})

	// dlq: a dead letter as the monitor writes it, then replayed.
	scheme := subjects.Default
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: scheme.DLQStream(), Subjects: scheme.DLQSubjects()}); err != nil {
		t.Fatal(err)
	}
	orig := wire.NewEnvelope(wire.TypeRequest, "orch_1", "plan_workflow")
	orig.ReceiverID, orig.Priority, orig.Correlation = "planner_1", wire.PriorityHigh, "corr_dlq"
	body, _ := orig.Encode()
	dlqSubj, _ := scheme.DLQ("planner_1", "high", "orch_1")
	origSubj, _ := scheme.Direct("planner_1", "high", "orch_1")
	h := nats.Header{}
	h.Set(wire.HeaderMsgID, orig.MessageID+":planner_1_high")
	h.Set(wire.HeaderAction, "plan_workflow")
	h.Set(wire.HeaderCorrelation, "corr_dlq")
	h.Set(dlq.HeaderOriginalID, orig.MessageID)
	h.Set(dlq.HeaderReason, "max_deliveries")
	h.Set(dlq.HeaderStatus, "TIMEOUT")
	h.Set(dlq.HeaderDeliveries, "4")
	h.Set(dlq.HeaderSubject, origSubj)
	ack, err := js.PublishMsg(ctx, &nats.Msg{Subject: dlqSubj, Header: h, Data: body})
	if err != nil {
		t.Fatal(err)
	}
	code, out, _ = cli(t, "dlq", "ls")
	if code != exitOK || !strings.Contains(out, orig.MessageID) || !strings.Contains(out, "TIMEOUT") || !strings.Contains(out, "max_deliveries") {
		t.Fatalf("dlq ls:\n%s", out)
	}
	seq := strings.TrimSpace(strings.Fields(strings.Split(out, "\n")[1])[0])
	if seq != "1" || ack.Sequence != 1 {
		t.Fatalf("dlq seq %q", seq)
	}
	code, out, errOut = cli(t, "dlq", "replay", seq)
	if code != exitOK || !strings.Contains(out, "replayed dead letter 1 to "+origSubj) {
		t.Fatalf("dlq replay: %d %q %q", code, out, errOut)
	}
	for replayed := false; !replayed; {
		select {
		case e := <-got: // earlier sends may still arrive first
			replayed = e.MessageID == orig.MessageID && e.Correlation == "corr_dlq"
		case <-ctx.Done():
			t.Fatal("replayed message not handled")
		}
	}
	code, out, _ = cli(t, "dlq", "replay", "--all")
	if code != exitOK || !strings.Contains(out, "already replayed") {
		t.Fatalf("second replay is not a duplicate: %q", out)
	}
}

type errMsg string

func (e errMsg) Error() string { return string(e) }

// TestDemo_ExternalServer runs `agentmesh demo` against a server given
// with --server (no embedded server, no monitor).
func TestDemo_ExternalServer(t *testing.T) {
	srv := natstest.RunServer(t)
	t.Setenv("NATS_URL", "")
	code, out, errOut := cli(t, "demo", "--server", srv.ClientURL())
	if code != exitOK || !strings.Contains(out, "both workflows ended as expected") || !strings.Contains(out, "└─ ") {
		t.Fatalf("exit %d\n%s\n%s", code, out, errOut)
	}
}

// TestDemo_Embedded runs `agentmesh demo` as a newcomer would: embedded
// server and ack monitor, escalation included.
func TestDemo_Embedded(t *testing.T) {
	t.Setenv("NATS_URL", "")
	t.Setenv("AGENTMESH_MONITOR_HTTP_ADDR", "127.0.0.1:0")
	code, out, errOut := cli(t, "demo")
	if code != exitOK || !strings.Contains(out, "escalation → received from ackmonitor") || !strings.Contains(out, "ack monitor (http://") {
		t.Fatalf("exit %d\n%s\n%s", code, out, errOut)
	}
}

// TestUp_RunsUntilCancelled starts `agentmesh up`, connects to the URL it
// prints, and stops it like Ctrl-C would; the store survives a restart.
func TestUp_RunsUntilCancelled(t *testing.T) {
	t.Setenv("NATS_URL", "")
	t.Setenv("AGENTMESH_MONITOR_HTTP_ADDR", "127.0.0.1:0")
	dir := t.TempDir()
	monDir := filepath.Join(t.TempDir(), "ledger") // does not exist yet
	t.Setenv("AGENTMESH_MONITOR_DATA_DIR", monDir)
	for round := range 2 {
		var out, errOut natstest.SyncBuffer
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan int, 1)
		go func() { done <- run(ctx, []string{"up", "--data", dir, "--listen", "127.0.0.1:0"}, &out, &errOut) }()
		var url string
		natstest.WaitFor(t, 30*time.Second, func() error {
			for _, line := range strings.Split(out.String(), "\n") {
				if u, ok := strings.CutPrefix(line, "export NATS_URL="); ok {
					url = u
					return nil
				}
			}
			return errMsg("no URL yet: " + out.String() + errOut.String())
		})
		nc, err := nats.Connect(url)
		if err != nil {
			t.Fatal(err)
		}
		js, _ := jetstream.New(nc)
		jctx, jcancel := context.WithTimeout(context.Background(), 10*time.Second)
		if round == 0 {
			if _, err := js.CreateStream(jctx, jetstream.StreamConfig{Name: "KEEP", Subjects: []string{"keep"}}); err != nil {
				t.Fatal(err)
			}
		} else if _, err := js.Stream(jctx, "KEEP"); err != nil {
			t.Fatalf("stream did not survive the restart: %v", err)
		}
		jcancel()
		nc.Close()
		if !strings.Contains(out.String(), "ack monitor dashboard: http://") {
			t.Errorf("no dashboard URL:\n%s", out.String())
		}
		cancel()
		select {
		case code := <-done:
			if code != exitOK {
				t.Fatalf("up exited %d: %s", code, errOut.String())
			}
		case <-time.After(30 * time.Second):
			t.Fatal("up did not stop")
		}
		if _, err := os.Stat(filepath.Join(monDir, "ackmonitor.db")); err != nil {
			t.Fatalf("ledger not in monitor.data_dir: %v", err)
		}
	}
}

// TestDemo_PersistentLedgerSetting runs the demo twice with a
// monitor.data_dir: the embedded mesh keeps its ledger with its own
// temporary store, so old rows do not collide with the new stream.
func TestDemo_PersistentLedgerSetting(t *testing.T) {
	t.Setenv("NATS_URL", "")
	t.Setenv("AGENTMESH_MONITOR_HTTP_ADDR", "127.0.0.1:0")
	monDir := t.TempDir()
	t.Setenv("AGENTMESH_MONITOR_DATA_DIR", monDir)
	for run := range 2 {
		if code, out, errOut := cli(t, "demo"); code != exitOK {
			t.Fatalf("run %d: exit %d\n%s\n%s", run+1, code, out, errOut)
		}
	}
	if entries, _ := os.ReadDir(monDir); len(entries) != 0 {
		t.Fatalf("the demo wrote %v into monitor.data_dir", entries)
	}
}

// A flag overrides an invalid value of the environment: the configuration
// is validated once, after the flags.
func TestLoad_FlagOverridesInvalidEnv(t *testing.T) {
	srv := natstest.RunServer(t)
	t.Setenv("NATS_URL", "")
	t.Setenv("AGENTMESH_NATS_URLS", "bogus")
	if code, out, errOut := cli(t, "-s", srv.ClientURL(), "agents"); code != exitOK || !strings.Contains(out, "no registry") {
		t.Fatalf("-s over an invalid AGENTMESH_NATS_URLS: exit %d: %s %s", code, out, errOut)
	}
	if code, _, errOut := cli(t, "agents"); code != exitUsage || !strings.Contains(errOut, "nats.urls") {
		t.Fatalf("invalid AGENTMESH_NATS_URLS alone: exit %d: %s", code, errOut)
	}
}

// TestUp_PortInUse reports a taken client port at once.
func TestUp_PortInUse(t *testing.T) {
	t.Setenv("NATS_URL", "")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	start := time.Now()
	code, _, errOut := cli(t, "up", "--data", t.TempDir(), "--listen", l.Addr().String())
	if code != exitFailure || !strings.Contains(errOut, "address already in use") || time.Since(start) > 5*time.Second {
		t.Fatalf("exit %d after %v: %s", code, time.Since(start), errOut)
	}
}

// TestSend_NoStream: send to a server without the mesh stream fails at the
// publish timeout, saying why and what creates the stream.
func TestSend_NoStream(t *testing.T) {
	t.Parallel()
	srv := natstest.RunServer(t)
	cfg := filepath.Join(t.TempDir(), "agentmesh.yaml")
	if err := os.WriteFile(cfg, []byte("agent:\n  publish_timeout: 1s\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := cli(t, "send", "--config", cfg, "-s", srv.ClientURL(), "--to", "planner_1", "--action", "plan")
	if code != exitFailure || !strings.Contains(errOut, "no response from stream") || !strings.Contains(errOut, "auth --provision") {
		t.Fatalf("exit %d, stdout %q, stderr %q; want a failure naming the stream's silence and what creates it", code, out, errOut)
	}
}
