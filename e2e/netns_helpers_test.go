//go:build linux

package e2e

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	mathbig "math/big"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agentmesh-io/agentmesh/internal/natstest"
)

// The namespace cluster: every nats-server process runs in its own network
// namespace, as if on its own host, so the network between the nodes can
// be cut without killing anything. Each namespace has two links:
//
//   - a cluster link, one veth pair per node whose outer end is a port of a
//     bridge in the test's namespace: the nodes' routes run over it, and
//     taking a node's bridge port down partitions it from the others
//     silently, as a pulled cable or a dead switch port would (no RST, no
//     FIN: both sides find out through their own timeouts);
//   - a client link, a point-to-point veth pair to the test's namespace,
//     through which the test's clients reach that node alone: it stays up
//     during a partition, so clients on the cut-off side keep their
//     connection to the minority.
//
// The bridge has no address, so the test's namespace cannot route
// between the cluster link and the client links, and the namespaces have
// no default route, so no node reaches another except over the bridge.
// Loopback and these namespaces are the only addresses used.

// netnsPrefix starts the name of every namespace the tests create:
// "amnet-<pid>-<id>-<node>", so a namespace left behind by a test binary
// that died (a timeout does not run cleanups) is recognisable as ours and
// its owner as gone.
const netnsPrefix = "amnet-"

// ipTool is the iproute2 binary. Root's PATH has /usr/sbin, a test
// runner's may not.
var ipTool = func() string {
	if p, err := exec.LookPath("ip"); err == nil {
		return p
	}
	for _, p := range []string{"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip"} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return "ip"
}()

// runIP runs ip with args and returns its output in the error when it
// fails.
func runIP(args ...string) error {
	out, err := exec.Command(ipTool, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// netnsCluster is a procCluster whose nodes run in network namespaces.
type netnsCluster struct {
	*procCluster
	id      string   // random, in every name the cluster creates
	bridge  string   // the cluster links' bridge, in the test's namespace
	ports   []string // node i's bridge port (outer end of its cluster link)
	clients []string // node i's client link, outer end
	// clusterIPs are the nodes' addresses on the bridge, where their
	// routes listen.
	clusterIPs []string
}

// runNetnsCluster starts an n-node cluster of nats-server processes, each
// in its own network namespace, waits until every node is healthy and
// removes the processes, links and namespaces when the test ends, whether
// it passed or not. It skips in -short mode, when not root, and when a
// namespace cannot be created (a CI sandbox may forbid it).
func runNetnsCluster(t *testing.T, n int) *netnsCluster {
	t.Helper()
	if testing.Short() {
		t.Skip("skipping the network-namespace cluster in -short mode (CI runs it without -short)")
	}
	if os.Geteuid() != 0 {
		t.Skip("the network-namespace cluster needs root (ip netns)")
	}
	removeStaleNetns(t)
	b := make([]byte, 3)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	id := hex.EncodeToString(b)
	c := &netnsCluster{
		procCluster: &procCluster{t: t, bin: natsServerBinary(t), base: t.TempDir()},
		id:          id,
		bridge:      "am" + id + "br",
	}
	// Cleanups run last in, first out: the network goes after the
	// processes, which are killed before their directories are removed.
	t.Cleanup(c.teardown)
	t.Cleanup(c.killAll)
	if err := c.network(n); err != nil {
		if errors.Is(err, errNoNetns) {
			t.Skipf("cannot create network namespaces here: %v", err)
		}
		t.Fatalf("namespace cluster network: %v", err)
	}
	if err := c.startNodes(); err != nil {
		t.Fatalf("namespace cluster: %v", err)
	}
	natstest.WaitFor(t, 60*time.Second, func() error {
		for _, nd := range c.nodes {
			if err := nd.healthy(); err != nil {
				return err
			}
		}
		return nil
	})
	return c
}

// errNoNetns is the first namespace failing to be created: the sandbox
// does not allow it, which skips the test rather than failing it.
var errNoNetns = errors.New("ip netns add failed")

// nsName is the name of node i's namespace.
func (c *netnsCluster) nsName(i int) string {
	return fmt.Sprintf("%s%d-%s-%d", netnsPrefix, os.Getpid(), c.id, i+1)
}

// network creates the namespaces and links of n nodes. Interface names
// carry the cluster's id (at most 15 bytes: "am" + 6 hex + 2), so
// concurrent tests never share one. The cluster subnet lives only inside
// the namespaces; the client links' subnet is a random 10.x.y.0/24 not
// routed in the test's namespace yet.
func (c *netnsCluster) network(n int) error {
	for i := range n {
		if err := runIP("netns", "add", c.nsName(i)); err != nil {
			if i == 0 {
				return fmt.Errorf("%w: %w", errNoNetns, err)
			}
			return err
		}
		c.nodes = append(c.nodes, &procNode{netns: c.nsName(i)})
		if err := runIP("-n", c.nsName(i), "link", "set", "lo", "up"); err != nil {
			return err
		}
	}
	clientNet, err := freeSubnet()
	if err != nil {
		return err
	}
	clusterNet := fmt.Sprintf("10.%d.%d", 100+randInt(100), randInt(256))
	if err := runIP("link", "add", c.bridge, "type", "bridge"); err != nil {
		return err
	}
	if err := runIP("link", "set", c.bridge, "up"); err != nil {
		return err
	}
	for i, nd := range c.nodes {
		ns := nd.netns
		port, inner := fmt.Sprintf("am%sc%d", c.id, i+1), fmt.Sprintf("am%sd%d", c.id, i+1)
		cli, cliInner := fmt.Sprintf("am%sk%d", c.id, i+1), fmt.Sprintf("am%sl%d", c.id, i+1)
		c.ports, c.clients = append(c.ports, port), append(c.clients, cli)
		clusterIP := fmt.Sprintf("%s.%d", clusterNet, 11+i)
		outerIP, innerIP := fmt.Sprintf("%s.%d", clientNet, 4*i+1), fmt.Sprintf("%s.%d", clientNet, 4*i+2)
		for _, args := range [][]string{
			{"link", "add", port, "type", "veth", "peer", "name", inner},
			{"link", "set", inner, "netns", ns},
			{"link", "set", port, "master", c.bridge},
			{"link", "set", port, "up"},
			{"-n", ns, "addr", "add", clusterIP + "/24", "dev", inner},
			{"-n", ns, "link", "set", inner, "up"},
			{"link", "add", cli, "type", "veth", "peer", "name", cliInner},
			{"link", "set", cliInner, "netns", ns},
			{"addr", "add", outerIP + "/30", "dev", cli},
			{"link", "set", cli, "up"},
			{"-n", ns, "addr", "add", innerIP + "/30", "dev", cliInner},
			{"-n", ns, "link", "set", cliInner, "up"},
		} {
			if err := runIP(args...); err != nil {
				return err
			}
		}
		nd.name = fmt.Sprintf("N-%d", i+1)
		nd.host, nd.port, nd.cport, nd.hport = innerIP, 4222, 6222, 8222
		nd.clientURL = fmt.Sprintf("nats://%s:%d", innerIP, nd.port)
		nd.healthzURL = fmt.Sprintf("http://%s:%d/healthz", innerIP, nd.hport)
		c.clusterIPs = append(c.clusterIPs, clusterIP)
	}
	return nil
}

// startNodes writes every node's configuration and starts the nodes. Each
// namespace has its own ports, so the fixed ones are free.
func (c *netnsCluster) startNodes() error {
	routes := make([]string, len(c.nodes))
	for i, nd := range c.nodes {
		routes[i] = fmt.Sprintf("%q", fmt.Sprintf("nats-route://%s:%d", c.clusterIPs[i], nd.cport))
	}
	for i, nd := range c.nodes {
		dir, err := os.MkdirTemp(c.base, "node-")
		if err != nil {
			return err
		}
		nd.dir, nd.conf, nd.logPath = dir, filepath.Join(dir, "node.conf"), filepath.Join(dir, "node.log")
		// no_advertise keeps the other nodes' client addresses out of
		// what a client is told, so a client of one node stays on it.
		conf := fmt.Sprintf(`server_name: %q
listen: "%s:%d"
http: "%s:%d"
jetstream { store_dir: %q, max_memory_store: 256MB, max_file_store: 2GB }
cluster {
  name: "NMESH"
  listen: "%s:%d"
  no_advertise: true
  routes: [%s]
}
`, nd.name, nd.host, nd.port, nd.host, nd.hport, filepath.Join(dir, "store"), c.clusterIPs[i], nd.cport, strings.Join(routes, ", "))
		if err := os.WriteFile(nd.conf, []byte(conf), 0o600); err != nil {
			return err
		}
	}
	for _, nd := range c.nodes {
		if err := c.launch(nd); err != nil {
			return err
		}
	}
	return nil
}

// teardown removes the cluster's links and namespaces; the processes are
// gone by then. Errors are logged, not fatal: a link is also removed with
// its namespace or its peer, so some removals find nothing left.
func (c *netnsCluster) teardown() {
	for _, l := range append(append([]string{c.bridge}, c.ports...), c.clients...) {
		_ = runIP("link", "del", l)
	}
	for _, nd := range c.nodes {
		if err := runIP("netns", "del", nd.netns); err != nil {
			c.t.Logf("namespace cluster teardown: %v", err)
		}
	}
}

// Cut takes node i's bridge port down: the node and its clients stay up,
// but nothing passes between it and the other nodes. It returns when the
// port was taken down.
func (c *netnsCluster) Cut(i int) time.Time {
	c.t.Helper()
	if err := runIP("link", "set", c.ports[i], "down"); err != nil {
		c.t.Fatalf("cut %s: %v", c.nodes[i].name, err)
	}
	return time.Now()
}

// Heal brings node i's bridge port up again and returns when it did.
func (c *netnsCluster) Heal(i int) time.Time {
	c.t.Helper()
	if err := runIP("link", "set", c.ports[i], "up"); err != nil {
		c.t.Fatalf("heal %s: %v", c.nodes[i].name, err)
	}
	return time.Now()
}

// ConnectOnly connects to the listed nodes only, ignoring any server the
// cluster tells of, reconnecting forever, and closes the connection when
// the test ends: a client that must stay on one side of a partition.
func (c *netnsCluster) ConnectOnly(nodes []int, opts ...nats.Option) *nats.Conn {
	c.t.Helper()
	var urls []string
	for _, i := range nodes {
		urls = append(urls, c.nodes[i].clientURL)
	}
	all := append([]nats.Option{nats.DontRandomize(), nats.MaxReconnects(-1), nats.IgnoreDiscoveredServers()}, opts...)
	nc, err := nats.Connect(strings.Join(urls, ","), all...)
	if err != nil {
		c.t.Fatalf("connect to %v: %v", urls, err)
	}
	c.t.Cleanup(nc.Close)
	return nc
}

// freeSubnet returns the first three octets of a random 10.x.y.0/24 that
// no route of the test's namespace covers yet.
func freeSubnet() (string, error) {
	out, err := exec.Command(ipTool, "-4", "route", "show", "table", "all").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("ip route: %w: %s", err, bytes.TrimSpace(out))
	}
	for range 100 {
		net := fmt.Sprintf("10.%d.%d", 200+randInt(50), randInt(256))
		if !bytes.Contains(out, []byte(net+".")) {
			return net, nil
		}
	}
	return "", errors.New("no free 10.x.y.0/24 for the client links")
}

// randInt returns a random integer in [0, n).
func randInt(n int64) int {
	v, err := rand.Int(rand.Reader, mathbig.NewInt(n))
	if err != nil {
		panic(err)
	}
	return int(v.Int64())
}

// removeStaleNetns deletes the namespaces (and their bridge) of test
// binaries that died without cleaning up: their name says their pid,
// which no longer runs. Namespaces of running tests are left alone.
func removeStaleNetns(t *testing.T) {
	out, err := exec.Command(ipTool, "netns", "list").Output()
	if err != nil {
		return // no namespaces or no ip: runNetnsCluster finds out
	}
	for _, line := range strings.Split(string(out), "\n") {
		name, _, _ := strings.Cut(strings.TrimSpace(line), " ")
		rest, ok := strings.CutPrefix(name, netnsPrefix)
		if !ok {
			continue
		}
		parts := strings.Split(rest, "-")
		if len(parts) != 3 {
			continue
		}
		pid, err := strconv.Atoi(parts[0])
		if err != nil || pid <= 0 || syscall.Kill(pid, 0) != syscall.ESRCH {
			continue
		}
		_ = runIP("link", "del", "am"+parts[1]+"br")
		if err := runIP("netns", "del", name); err == nil {
			t.Logf("removed namespace %s of a test binary (pid %d) that is gone", name, pid)
		}
	}
}

// logWarnings logs the last warnings and errors of every node's log, for
// a failed test: where a node stopped catching up or lost its routes.
func (c *netnsCluster) logWarnings() {
	for _, nd := range c.nodes {
		b, err := os.ReadFile(nd.logPath)
		if err != nil {
			continue
		}
		var lines []string
		for _, l := range strings.Split(string(b), "\n") {
			if strings.Contains(l, "[WRN]") || strings.Contains(l, "[ERR]") {
				lines = append(lines, l)
			}
		}
		c.t.Logf("%s (%s) warnings and errors, last %d of %d:\n%s", nd.name, nd.netns, min(40, len(lines)), len(lines), strings.Join(lines[max(0, len(lines)-40):], "\n"))
	}
}

// streamStates returns what each node stores of stream, as its own
// monitoring endpoint tells: messages, last sequence and the leader it
// knows. For failures.
func (c *netnsCluster) streamStates(stream string) string {
	var out []string
	client := http.Client{Timeout: 2 * time.Second}
	for _, nd := range c.nodes {
		resp, err := client.Get(fmt.Sprintf("http://%s:%d/jsz?accounts=true&streams=true", nd.host, nd.hport))
		if err != nil {
			out = append(out, fmt.Sprintf("%s: %v", nd.name, err))
			continue
		}
		var jsz struct {
			Accounts []struct {
				Streams []struct {
					Name  string `json:"name"`
					State struct {
						Msgs    uint64 `json:"messages"`
						LastSeq uint64 `json:"last_seq"`
					} `json:"state"`
					Cluster struct {
						Leader string `json:"leader"`
					} `json:"cluster"`
				} `json:"stream_detail"`
			} `json:"account_details"`
		}
		err = json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&jsz)
		resp.Body.Close()
		if err != nil {
			out = append(out, fmt.Sprintf("%s: %v", nd.name, err))
			continue
		}
		for _, a := range jsz.Accounts {
			for _, s := range a.Streams {
				if s.Name == stream {
					out = append(out, fmt.Sprintf("%s: %d messages, last %d, leader %q", nd.name, s.State.Msgs, s.State.LastSeq, s.Cluster.Leader))
				}
			}
		}
	}
	return strings.Join(out, "; ")
}
