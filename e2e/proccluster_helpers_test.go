//go:build linux

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/internal/natstest"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// The separate-process cluster: every JetStream node is its own
// nats-server process, so a node can be killed with SIGKILL, as a crash or
// an OOM kill would end it, instead of shutting down in-process (which
// closes routes and clients politely and steps leaders down first).

// natsServer is the nats-server binary the tests run, built once per test
// binary from the module cache at the version the tests link.
var natsServer struct {
	once sync.Once
	path string
	err  error
}

// natsServerBinary builds the nats-server binary on first use and returns
// its path; a test skips when it cannot be built (no go tool, no module
// cache), since the separate-process tests measure NATS itself, not
// agentmesh's build.
func natsServerBinary(t *testing.T) string {
	t.Helper()
	natsServer.once.Do(func() {
		goTool, err := exec.LookPath("go")
		if err != nil {
			natsServer.err = err
			return
		}
		dir, err := os.MkdirTemp("", "agentmesh-e2e-nats-server-")
		if err != nil {
			natsServer.err = err
			return
		}
		natsServer.path = filepath.Join(dir, "nats-server")
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		// The tests' module file pins the same nats-server the embedded
		// tests link, so both kinds of test run one server version.
		cmd := exec.CommandContext(ctx, goTool, "build", "-modfile=go_test.mod", "-o", natsServer.path, "github.com/nats-io/nats-server/v2")
		cmd.Dir = ".." // the module root: go_test.mod is there
		if out, err := cmd.CombinedOutput(); err != nil {
			natsServer.err = fmt.Errorf("%w: %s", err, bytes.TrimSpace(out))
		}
	})
	if natsServer.err != nil {
		t.Skipf("cannot build nats-server for the separate-process cluster: %v", natsServer.err)
	}
	return natsServer.path
}

// TestMain removes the nats-server binary the separate-process tests
// built, which lives outside any test's temporary directory so that every
// test of the binary shares it.
func TestMain(m *testing.M) {
	code := m.Run()
	if natsServer.path != "" {
		os.RemoveAll(filepath.Dir(natsServer.path))
	}
	os.Exit(code)
}

// errPortTaken is a node failing to start because one of its ports was
// taken between reserving and binding it.
var errPortTaken = errors.New("port taken")

// procNode is one nats-server process of a procCluster.
type procNode struct {
	name                  string
	host                  string // the client port's address, which the test dials
	port, cport, hport    int    // client, cluster and monitoring ports
	netns                 string // the network namespace the process runs in; "": the test's own
	dir                   string
	conf                  string
	logPath               string
	cmd                   *exec.Cmd
	exited                chan struct{} // closed when cmd has been waited for
	killedAt, restartedAt time.Time
	restarts              int
	clientURL, healthzURL string
	mu                    sync.Mutex // guards cmd and exited against the cleanup
}

// procCluster is a JetStream cluster of separate nats-server processes on
// 127.0.0.1, each with its own store and log in a temporary directory.
type procCluster struct {
	t     *testing.T
	bin   string
	base  string // holds every node's directory; removed after the nodes are killed
	nodes []*procNode
}

// runProcCluster starts an n-node cluster of nats-server processes, waits
// until every node is healthy (JetStream meta leader elected and known
// everywhere) and kills every process when the test ends. It skips in
// -short mode and when the binary cannot be built. Ports are reserved
// free and the whole cluster starts again on fresh ports when one was
// taken in the meantime.
func runProcCluster(t *testing.T, n int) *procCluster {
	t.Helper()
	if testing.Short() {
		t.Skip("skipping the separate-process cluster in -short mode (CI runs it without -short)")
	}
	// The directory is made before the kill is registered, so it is removed
	// after (cleanups run last in, first out), not under running nodes.
	c := &procCluster{t: t, bin: natsServerBinary(t), base: t.TempDir()}
	t.Cleanup(c.killAll)
	for attempt := 1; ; attempt++ {
		err := c.start(n)
		if err == nil {
			break
		}
		c.killAll()
		if !errors.Is(err, errPortTaken) || attempt == 3 {
			t.Fatalf("separate-process cluster: %v", err)
		}
		t.Logf("separate-process cluster: %v; starting again on other ports", err)
	}
	natstest.WaitFor(t, 30*time.Second, func() error {
		for _, nd := range c.nodes {
			if err := nd.healthy(); err != nil {
				return err
			}
		}
		return nil
	})
	return c
}

// start writes the configuration of n nodes on fresh ports and starts
// them.
func (c *procCluster) start(n int) error {
	ports := natstest.ReservePorts(c.t, 3*n)
	c.nodes = make([]*procNode, n)
	routes := make([]string, n)
	for i := range n {
		routes[i] = fmt.Sprintf("%q", fmt.Sprintf("nats-route://127.0.0.1:%d", ports[3*i+1]))
	}
	for i := range n {
		dir, err := os.MkdirTemp(c.base, "node-")
		if err != nil {
			return err
		}
		nd := &procNode{name: fmt.Sprintf("P-%d", i+1), host: "127.0.0.1", port: ports[3*i], cport: ports[3*i+1], hport: ports[3*i+2],
			dir: dir, conf: filepath.Join(dir, "node.conf"), logPath: filepath.Join(dir, "node.log")}
		nd.clientURL = fmt.Sprintf("nats://127.0.0.1:%d", nd.port)
		nd.healthzURL = fmt.Sprintf("http://127.0.0.1:%d/healthz", nd.hport)
		conf := fmt.Sprintf(`server_name: %q
listen: "127.0.0.1:%d"
http: "127.0.0.1:%d"
jetstream { store_dir: %q, max_memory_store: 256MB, max_file_store: 2GB }
cluster {
  name: "PMESH"
  listen: "127.0.0.1:%d"
  routes: [%s]
}
`, nd.name, nd.port, nd.hport, filepath.Join(dir, "store"), nd.cport, strings.Join(routes, ", "))
		if err := os.WriteFile(nd.conf, []byte(conf), 0o600); err != nil {
			return err
		}
		c.nodes[i] = nd
	}
	for _, nd := range c.nodes {
		if err := c.launch(nd); err != nil {
			return err
		}
	}
	return nil
}

// launch starts nd's process and waits until it accepts client
// connections. The process dies with the test binary (Pdeathsig), so a
// test killed on timeout leaves no server behind.
func (c *procCluster) launch(nd *procNode) error {
	logf, err := os.OpenFile(nd.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close() // the child holds its own descriptor
	cmd := exec.Command(c.bin, "-c", nd.conf)
	if nd.netns != "" {
		// ip execs the server once it has entered the namespace, so the
		// process is the server itself and Pdeathsig still applies.
		cmd = exec.Command(ipTool, "netns", "exec", nd.netns, c.bin, "-c", nd.conf)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", nd.name, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	nd.mu.Lock()
	nd.cmd, nd.exited = cmd, exited
	nd.mu.Unlock()

	deadline := time.Now().Add(20 * time.Second)
	for {
		select {
		case <-exited:
			log := nd.logTail()
			if strings.Contains(log, "address already in use") {
				return fmt.Errorf("%s: %w: %s", nd.name, errPortTaken, log)
			}
			return fmt.Errorf("%s exited at start: %s", nd.name, log)
		default:
		}
		conn, err := net.DialTimeout("tcp", net.JoinHostPort(nd.host, strconv.Itoa(nd.port)), time.Second)
		if err == nil {
			conn.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not accepting connections after 20s: %w; log: %s", nd.name, err, nd.logTail())
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// logTail returns the end of nd's log, for failures.
func (nd *procNode) logTail() string {
	b, _ := os.ReadFile(nd.logPath)
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// healthy reports whether nd's /healthz says its JetStream is current:
// meta leader known, and its streams and consumers caught up.
func (nd *procNode) healthy() error {
	client := http.Client{Timeout: time.Second}
	resp, err := client.Get(nd.healthzURL)
	if err != nil {
		return fmt.Errorf("%s: %w", nd.name, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		var body struct {
			Error string `json:"error"`
		}
		_ = json.NewDecoder(io.LimitReader(resp.Body, 1<<16)).Decode(&body)
		return fmt.Errorf("%s: healthz %d: %s", nd.name, resp.StatusCode, body.Error)
	}
	return nil
}

// killAll kills every running node; it is the cluster's cleanup.
func (c *procCluster) killAll() {
	for _, nd := range c.nodes {
		nd.kill()
	}
}

// kill sends SIGKILL to nd's process and waits until it has exited.
func (nd *procNode) kill() {
	nd.mu.Lock()
	cmd, exited := nd.cmd, nd.exited
	nd.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	<-exited
}

// Kill sends SIGKILL to node i, waits until the process is gone and
// returns the moment the signal was sent.
func (c *procCluster) Kill(i int) time.Time {
	nd := c.nodes[i]
	nd.mu.Lock()
	cmd, exited := nd.cmd, nd.exited
	nd.mu.Unlock()
	nd.killedAt = time.Now()
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		c.t.Fatalf("kill %s: %v", nd.name, err)
	}
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		c.t.Fatalf("%s still running 10s after SIGKILL", nd.name)
	}
	return nd.killedAt
}

// Restart starts node i again on its ports and store and waits until it
// is healthy again (caught up on every stream and consumer).
func (c *procCluster) Restart(i int) {
	c.t.Helper()
	nd := c.nodes[i]
	var err error
	for attempt := 1; attempt <= 3; attempt++ {
		if err = c.launch(nd); err == nil || !errors.Is(err, errPortTaken) {
			break
		}
	}
	if err != nil {
		c.t.Fatalf("restart: %v", err)
	}
	nd.restarts++
	natstest.WaitFor(c.t, 30*time.Second, nd.healthy)
	nd.restartedAt = time.Now()
}

// URLs returns the client URLs of the nodes, first the one at index first
// (with nats.DontRandomize a client connects there first).
func (c *procCluster) URLs(first int) string {
	urls := []string{c.nodes[first].clientURL}
	for i, nd := range c.nodes {
		if i != first {
			urls = append(urls, nd.clientURL)
		}
	}
	return strings.Join(urls, ",")
}

// Connect connects to node first (then the others), reconnecting forever,
// and closes the connection when the test ends.
func (c *procCluster) Connect(first int, opts ...nats.Option) *nats.Conn {
	c.t.Helper()
	all := append([]nats.Option{nats.DontRandomize(), nats.MaxReconnects(-1)}, opts...)
	nc, err := nats.Connect(c.URLs(first), all...)
	if err != nil {
		c.t.Fatalf("connect to the separate-process cluster: %v", err)
	}
	c.t.Cleanup(nc.Close)
	return nc
}

// Index returns the index of the node named name, or -1.
func (c *procCluster) Index(name string) int {
	for i, nd := range c.nodes {
		if nd.name == name {
			return i
		}
	}
	return -1
}

// leaderQueryTimeout bounds one leader query: a group without a leader
// does not answer, and the poll asks again.
const leaderQueryTimeout = 500 * time.Millisecond

// StreamLeader returns the name of stream's leader ("" and an error when
// it has none or does not answer within leaderQueryTimeout).
func (c *procCluster) StreamLeader(js jetstream.JetStream, stream string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), leaderQueryTimeout)
	defer cancel()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return "", err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return "", err
	}
	if info.Cluster == nil || info.Cluster.Leader == "" {
		return "", fmt.Errorf("stream %s has no leader", stream)
	}
	return info.Cluster.Leader, nil
}

// ConsumerLeader returns the name of the leader of stream's consumer.
func (c *procCluster) ConsumerLeader(js jetstream.JetStream, stream, consumer string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), leaderQueryTimeout)
	defer cancel()
	cons, err := js.Consumer(ctx, stream, consumer)
	if err != nil {
		return "", err
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return "", err
	}
	if info.Cluster == nil || info.Cluster.Leader == "" {
		return "", fmt.Errorf("consumer %s has no leader", consumer)
	}
	return info.Cluster.Leader, nil
}

// WaitNewLeader polls leader every 10ms until it names a node other than
// old, and returns that node and when it was first seen; it fails the test
// after bound.
func (c *procCluster) WaitNewLeader(bound time.Duration, old string, leader func() (string, error)) (string, time.Time) {
	c.t.Helper()
	deadline := time.Now().Add(bound)
	var last error
	for time.Now().Before(deadline) {
		name, err := leader()
		if err == nil && name != old {
			return name, time.Now()
		}
		if err != nil {
			last = err
		} else {
			last = fmt.Errorf("leader still %s", name)
		}
		time.Sleep(10 * time.Millisecond)
	}
	c.t.Fatalf("no new leader (old %s) after %v: %v", old, bound, last)
	return "", time.Time{}
}

// MoveLeader asks the leader of a stream or consumer (api: its leader
// step-down subject) to hand leadership to node to, and waits until
// leader names it. Step-downs are refused while a group is catching up,
// so it asks again until the bound.
func (c *procCluster) MoveLeader(nc *nats.Conn, api, to string, leader func() (string, error)) {
	c.t.Helper()
	req, _ := json.Marshal(map[string]any{"placement": map[string]string{"preferred": to}})
	natstest.WaitFor(c.t, 30*time.Second, func() error {
		name, err := leader()
		if err != nil {
			return err
		}
		if name == to {
			return nil
		}
		reply, err := nc.Request(api, req, 2*time.Second)
		if err != nil {
			return err
		}
		var resp struct {
			Success bool
			Error   *jetstream.APIError
		}
		if err := json.Unmarshal(reply.Data, &resp); err != nil {
			return err
		}
		if !resp.Success {
			return fmt.Errorf("step-down to %s refused: %v", to, resp.Error)
		}
		return fmt.Errorf("leader moving from %s to %s", name, to)
	})
}

// streamStepDown and consumerStepDown are the step-down subjects of a
// scheme's message stream and of one of its consumers.
func streamStepDown(s subjects.Scheme) string {
	return subjects.API("STREAM", "LEADER", "STEPDOWN", s.Stream())
}

func consumerStepDown(s subjects.Scheme, consumer string) string {
	return subjects.API("CONSUMER", "LEADER", "STEPDOWN", s.Stream(), consumer)
}
