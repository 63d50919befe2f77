package natstest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Cluster is an embedded JetStream cluster: route ports reserved up front,
// every node routing to every node (itself included), and a meta leader
// elected before it is returned.
type Cluster struct {
	// Servers are the nodes, S-1 to S-n; a stopped node's entry stays in
	// place until [Cluster.Restart] replaces it.
	Servers []*server.Server
	// Opts are the options each node was started with; Restart reuses
	// them, so a node comes back with its store directory.
	Opts []*server.Options
}

// RunCluster starts an n-node JetStream cluster named "MESH" on 127.0.0.1
// with random client ports and a store per node in tb.TempDir(), waits
// for its meta leader and shuts every node down when the test ends.
func RunCluster(tb testing.TB, n int, opts ...Option) *Cluster {
	tb.Helper()
	return StartCluster(tb, n, func(ports []int) []*server.Options {
		all := make([]*server.Options, n)
		for i := range n {
			o := nodeOptions(tb, fmt.Sprintf("S-%d", i+1))
			o.Cluster = server.ClusterOpts{Name: "MESH", Host: "127.0.0.1", Port: ports[i]}
			o.Routes = RoutesTo(ports)
			for _, opt := range opts {
				opt(o)
			}
			all[i] = o
		}
		return all
	})
}

// StartCluster reserves n cluster ports, asks build for the nodes'
// options on them (fixed cluster ports and routes to every node), starts
// the nodes, waits for the meta leader and registers the shutdowns on tb.
// A port taken between its reservation and the start is not the test's
// fault, so the cluster starts again on fresh ports, up to three times.
func StartCluster(tb testing.TB, n int, build func(ports []int) []*server.Options) *Cluster {
	tb.Helper()
	for attempt := 1; ; attempt++ {
		c, err := startCluster(build(ReservePorts(tb, n)))
		if err == nil {
			tb.Cleanup(c.shutdown)
			c.WaitForMetaLeader(tb, 20*time.Second)
			return c
		}
		if !errors.Is(err, ErrPortTaken) || attempt == 3 {
			tb.Fatalf("natstest: start cluster: %v", err)
		}
		tb.Logf("natstest: start cluster: %v; starting again on other ports", err)
	}
}

// startCluster starts a server per options, shutting down those it
// started if one fails.
func startCluster(opts []*server.Options) (*Cluster, error) {
	c := &Cluster{}
	for _, o := range opts {
		s, err := start(o)
		if err != nil {
			c.shutdown()
			return nil, err
		}
		c.Opts = append(c.Opts, o)
		c.Servers = append(c.Servers, s)
	}
	return c, nil
}

// shutdown stops every node and waits until each has stopped.
func (c *Cluster) shutdown() {
	for _, s := range c.Servers {
		s.Shutdown()
		s.WaitForShutdown()
	}
}

// RoutesTo returns route URLs to every port on 127.0.0.1.
func RoutesTo(ports []int) []*url.URL {
	routes := make([]string, len(ports))
	for i, p := range ports {
		routes[i] = fmt.Sprintf("nats://127.0.0.1:%d", p)
	}
	return server.RoutesFromStr(strings.Join(routes, ","))
}

// ReservePorts finds n free TCP ports by listening on :0 and closing.
func ReservePorts(tb testing.TB, n int) []int {
	tb.Helper()
	ports := make([]int, n)
	ls := make([]net.Listener, n)
	for i := range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			tb.Fatalf("natstest: reserve port: %v", err)
		}
		ls[i] = l
		ports[i] = l.Addr().(*net.TCPAddr).Port
	}
	for _, l := range ls {
		l.Close()
	}
	return ports
}

// WaitForMetaLeader polls until one running node is the JetStream meta
// leader and every running node knows the cluster is current.
func (c *Cluster) WaitForMetaLeader(tb testing.TB, timeout time.Duration) {
	tb.Helper()
	WaitFor(tb, timeout, func() error {
		leaders := 0
		for _, s := range c.Servers {
			if !s.Running() {
				continue
			}
			if s.JetStreamIsLeader() {
				leaders++
			}
			if !s.JetStreamIsCurrent() {
				return fmt.Errorf("%s is not current", s.Name())
			}
		}
		if leaders != 1 {
			return fmt.Errorf("%d meta leaders", leaders)
		}
		return nil
	})
}

// ClientURLs returns the client URLs of every node, comma separated.
func (c *Cluster) ClientURLs() string {
	urls := make([]string, 0, len(c.Opts))
	for i, s := range c.Servers {
		if s.Running() {
			urls = append(urls, s.ClientURL())
		} else {
			urls = append(urls, fmt.Sprintf("nats://127.0.0.1:%d", c.Opts[i].Port))
		}
	}
	return strings.Join(urls, ",")
}

// Connect connects to every node's client URL, reconnecting forever with
// a short wait, and closes the connection when the test ends.
func (c *Cluster) Connect(tb testing.TB, opts ...nats.Option) *nats.Conn {
	tb.Helper()
	all := append([]nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(50 * time.Millisecond)}, opts...)
	nc, err := nats.Connect(c.ClientURLs(), all...)
	if err != nil {
		tb.Fatalf("natstest: connect to cluster: %v", err)
	}
	tb.Cleanup(nc.Close)
	return nc
}

// Index returns the position of the node named name, or -1.
func (c *Cluster) Index(name string) int {
	for i, o := range c.Opts {
		if o.ServerName == name {
			return i
		}
	}
	return -1
}

// StreamLeader returns the index of the node leading stream.
func (c *Cluster) StreamLeader(ctx context.Context, js jetstream.JetStream, stream string) (int, error) {
	st, err := js.Stream(ctx, stream)
	if err != nil {
		return -1, err
	}
	info, err := st.Info(ctx)
	if err != nil {
		return -1, err
	}
	if info.Cluster == nil || info.Cluster.Leader == "" {
		return -1, fmt.Errorf("natstest: stream %s has no leader", stream)
	}
	i := c.Index(info.Cluster.Leader)
	if i < 0 {
		return -1, fmt.Errorf("natstest: stream %s leader %q is not a node", stream, info.Cluster.Leader)
	}
	return i, nil
}

// Shutdown stops node i and waits until it has stopped.
func (c *Cluster) Shutdown(i int) {
	c.Servers[i].Shutdown()
	c.Servers[i].WaitForShutdown()
}

// Restart starts node i again with its original options (and store).
func (c *Cluster) Restart(tb testing.TB, i int) *server.Server {
	tb.Helper()
	c.Servers[i] = Start(tb, c.Opts[i])
	return c.Servers[i]
}

// WaitStreamCurrent polls until stream has a leader and every replica is
// current, i.e. caught up with the leader.
func (c *Cluster) WaitStreamCurrent(tb testing.TB, js jetstream.JetStream, stream string, timeout time.Duration) {
	tb.Helper()
	WaitFor(tb, timeout, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		st, err := js.Stream(ctx, stream)
		if err != nil {
			return err
		}
		info, err := st.Info(ctx)
		if err != nil {
			return err
		}
		if info.Cluster == nil || info.Cluster.Leader == "" {
			return fmt.Errorf("no leader")
		}
		if len(info.Cluster.Replicas) != len(c.Servers)-1 {
			return fmt.Errorf("%d replicas", len(info.Cluster.Replicas))
		}
		for _, r := range info.Cluster.Replicas {
			if !r.Current || r.Offline {
				return fmt.Errorf("replica %s not current (lag %d)", r.Name, r.Lag)
			}
		}
		return nil
	})
}

// WaitFor polls cond every 25ms until it returns nil, failing the test
// with cond's last error after timeout.
func WaitFor(tb testing.TB, timeout time.Duration, cond func() error) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("natstest: condition not met after %v: %v", timeout, err)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// WaitForProgress polls count every 25ms until it reaches want, failing
// the test only once count has not grown for stall: a busy machine slows
// the work down, but a stuck one stops it. count's error is reported
// with the failure and otherwise retried.
func WaitForProgress(tb testing.TB, stall time.Duration, want int, what string, count func() (int, error)) {
	tb.Helper()
	best, since := -1, time.Now()
	var last error
	for {
		n, err := count()
		if err == nil && n >= want {
			return
		}
		if err == nil && n > best {
			best, since = n, time.Now()
		}
		if err != nil {
			last = err
		}
		if time.Since(since) > stall {
			tb.Fatalf("natstest: %s: %d of %d, no progress for %v (last error: %v)", what, max(best, 0), want, stall, last)
		}
		time.Sleep(25 * time.Millisecond)
	}
}
