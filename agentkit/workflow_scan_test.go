package agentkit_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/internal/natstest"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// scanMesh returns a mesh whose message stream holds n messages from
// alice to bob, every tenth of correlation id "corr_scan", and a
// JetStream on it.
func scanMesh(t *testing.T, n int) (*mesh, jetstream.JetStream) {
	t.Helper()
	m := newMesh(t)
	js, err := jetstream.New(m.conn())
	if err != nil {
		t.Fatal(err)
	}
	if err := agentkit.EnsureStream(ctx(t), js, agentkit.StreamConfig(subjects.Default, 1)); err != nil {
		t.Fatal(err)
	}
	subject, err := subjects.Default.Direct("bob", "normal", "alice")
	if err != nil {
		t.Fatal(err)
	}
	// A window of publishes at a time, each waited for: past the client's
	// limit of outstanding acks, PublishMsgAsync gives up after a short
	// stall, which a loaded server easily outlasts.
	const window = 500
	for i := range n {
		msg := &nats.Msg{Subject: subject, Header: nats.Header{}}
		msg.Header.Set(wire.HeaderMsgID, fmt.Sprintf("msg_%d", i))
		msg.Header.Set(wire.HeaderType, string(wire.TypeNotification))
		if i%10 == 0 {
			msg.Header.Set(wire.HeaderCorrelation, "corr_scan")
		}
		if _, err := js.PublishMsgAsync(msg); err != nil {
			t.Fatal(err)
		}
		if (i+1)%window == 0 || i == n-1 {
			select {
			case <-js.PublishAsyncComplete():
			case <-ctx(t).Done():
				t.Fatal("publishing the stream's messages")
			}
		}
	}
	return m, js
}

// consumers returns the consumers of the message stream.
func consumers(t *testing.T, js jetstream.JetStream) []*jetstream.ConsumerInfo {
	t.Helper()
	stream, err := js.Stream(ctx(t), subjects.Default.Stream())
	if err != nil {
		t.Fatal(err)
	}
	var out []*jetstream.ConsumerInfo
	infos := stream.ListConsumers(ctx(t))
	for info := range infos.Info() {
		out = append(out, info)
	}
	if err := infos.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// WorkflowStatus reads every batch of the stream and leaves no consumer
// behind on it.
func TestWorkflowStatus_LeavesNoConsumer(t *testing.T) {
	t.Parallel()
	_, js := scanMesh(t, 1000) // four batches
	wf, err := agentkit.WorkflowStatus(ctx(t), js, subjects.Default, "corr_scan", time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if len(wf.Messages) != 100 || wf.Messages[99].MessageID != "msg_990" {
		t.Fatalf("%d messages", len(wf.Messages))
	}
	if left := consumers(t, js); len(left) != 0 {
		t.Fatalf("WorkflowStatus left %d consumers on the stream, the first %s", len(left), left[0].Name)
	}
}

// A scan whose ctx ends midway stops with ctx's error instead of reading
// the rest of the stream.
func TestWorkflowStatus_HonoursCancel(t *testing.T) {
	t.Parallel()
	m, js := scanMesh(t, 2000) // eight batches of about 50 KiB
	// The scan reads over a link that stops after 32 KiB, within its
	// first batch, until the test lets it go on: however fast the
	// machine, the scan is midway when its ctx ends.
	link := &gatedLink{budget: 32 << 10, open: make(chan struct{})}
	t.Cleanup(link.release)
	scanJS, err := jetstream.New(natstest.Connect(t, m.s, nats.SetCustomDialer(link)))
	if err != nil {
		t.Fatal(err)
	}
	scanCtx, cancel := context.WithCancel(ctx(t))
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := agentkit.WorkflowStatus(scanCtx, scanJS, subjects.Default, "corr_scan", time.Time{})
		done <- err
	}()
	eventually(t, 10*time.Second, "the scan's first batch sent", func() bool {
		for _, c := range consumers(t, js) {
			if c.Delivered.Stream >= 256 {
				return true
			}
		}
		return false
	})
	cancel()
	link.release()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("WorkflowStatus after cancel: %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("WorkflowStatus still scanning 10s after cancel")
	}
	eventually(t, 5*time.Second, "the scan's consumer deleted", func() bool { return len(consumers(t, js)) == 0 })
}

// gatedLink dials one connection that receives budget bytes from the
// server, then nothing until release.
type gatedLink struct {
	budget int
	open   chan struct{}
	once   sync.Once
}

func (l *gatedLink) release() { l.once.Do(func() { close(l.open) }) }

func (l *gatedLink) Dial(network, address string) (net.Conn, error) {
	c, err := net.Dial(network, address)
	if err != nil {
		return nil, err
	}
	return &gatedConn{Conn: c, link: l, closed: make(chan struct{})}, nil
}

type gatedConn struct {
	net.Conn
	link      *gatedLink
	read      int // bytes read; only the connection's reader reads
	closed    chan struct{}
	closeOnce sync.Once
}

// Read reads what is left of the budget, and once it is spent waits for
// the release (or Close) before reading on.
func (c *gatedConn) Read(p []byte) (int, error) {
	if left := c.link.budget - c.read; left > 0 {
		n, err := c.Conn.Read(p[:min(len(p), left)])
		c.read += n
		return n, err
	}
	select {
	case <-c.link.open:
	case <-c.closed:
		return 0, net.ErrClosed
	}
	return c.Conn.Read(p)
}

func (c *gatedConn) Close() error {
	c.closeOnce.Do(func() { close(c.closed) })
	return c.Conn.Close()
}
