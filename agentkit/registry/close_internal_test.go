package registry

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/internal/natstest"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// blockedKVCallbacks counts the goroutines blocked in a KV watcher's
// callback on a full Updates channel.
func blockedKVCallbacks() int {
	buf := make([]byte, 1<<24)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "[chan send") && strings.Contains(g, "jetstream.(*kvs).WatchFiltered") {
			n++
		}
	}
	return n
}

// Close of a registry whose watch has fallen behind (a full Updates
// channel, as during a large initial load or a burst of heartbeats) leaves
// no goroutine blocked in the KV watcher. Whether the watcher's callback is
// still blocked at the moment the watch stops depends on the server's flow
// control, so the test tries several times. Not parallel: it counts the
// goroutines of the whole process.
func TestRegistry_CloseReleasesLaggingWatch(t *testing.T) {
	s := natstest.RunServer(t)
	js, err := jetstream.New(natstest.Connect(t, s))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for try := range 5 {
		r, err := Open(ctx, js, subjects.Default, 1, true)
		if err != nil {
			t.Fatal(err)
		}
		before := blockedKVCallbacks()
		// Hold the cache: the watch stops taking entries and the
		// watcher's channel (256) fills.
		r.mu.Lock()
		for i := range 1000 {
			if _, err := r.kv.Put(ctx, fmt.Sprintf("health.a%d", i), []byte(`{"degraded":true}`)); err != nil {
				r.mu.Unlock()
				t.Fatal(err)
			}
		}
		natstest.Eventually(t, 10*time.Second, "the watcher's channel full", func() bool { return blockedKVCallbacks() > before })
		r.cancel()
		r.mu.Unlock()
		r.Close()
		natstest.Eventually(t, 5*time.Second, fmt.Sprintf("try %d: the watcher's callback released", try), func() bool { return blockedKVCallbacks() <= before })
	}
}
