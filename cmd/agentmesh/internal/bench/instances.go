package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
)

// InstancesConfig configures an instances run: one agent id, registered,
// run as one instance and as two (each on its own connection) that take
// turns or consume at once, receiving a burst of Messages sent with
// SendBatch, once with a trivial handler and once with one that holds its
// worker for Hold.
type InstancesConfig struct {
	// URL is the NATS server every connection goes to. Required.
	URL string
	// Messages per run. Default: 20000.
	Messages int
	// Payload is the payload size in bytes. Default: 512.
	Payload int
	// Hold is how long the holding handler keeps its worker: the
	// workload under which a second instance's workers would add
	// throughput. Default: 1ms.
	Hold time.Duration
	// RunTimeout bounds each run. Default: 2m.
	RunTimeout time.Duration
	// Progress receives each run's progress, as in [Config]; nil shows
	// none.
	Progress io.Writer
}

func (c *InstancesConfig) setDefaults() {
	if c.Messages == 0 {
		c.Messages = 20000
	}
	if c.Payload == 0 {
		c.Payload = 512
	}
	if c.Hold == 0 {
		c.Hold = time.Millisecond
	}
	if c.RunTimeout == 0 {
		c.RunTimeout = 2 * time.Minute
	}
}

// Validate reports whether c is usable.
func (c *InstancesConfig) Validate() error {
	switch {
	case c.URL == "":
		return errors.New("bench: InstancesConfig.URL is required")
	case c.Messages < 1:
		return fmt.Errorf("bench: messages %d must be at least 1", c.Messages)
	case c.Payload < 16:
		return fmt.Errorf("bench: payload %d must be at least 16 bytes", c.Payload)
	case c.Hold < 0:
		return fmt.Errorf("bench: hold %v must not be negative", c.Hold)
	}
	return nil
}

// How the instances of an instances run consume.
const (
	ConsumeAlone      = "alone"      // one instance
	ConsumeTurns      = "turns"      // two, the eldest consuming (agentkit's default)
	ConsumeConcurrent = "concurrent" // two, both consuming (WithConcurrentInstances)
)

// InstancesResult is one run: a handler kind with one way of consuming.
type InstancesResult struct {
	// Handler is "trivial", or "hold" for the handler keeping its worker
	// for HoldMs.
	Handler   string  `json:"handler"`
	HoldMs    float64 `json:"hold_ms"`
	Instances int     `json:"instances"`
	Consume   string  `json:"consume"`
	// Messages were handled in Seconds, from the first send to the last
	// message's first handling.
	Messages  int     `json:"messages"`
	Seconds   float64 `json:"seconds"`
	MsgPerSec float64 `json:"msg_per_sec"`
	// Runs counts the handler's runs on each instance, eldest first, and
	// Duplicates the runs beyond the first of a message, read once the
	// instances stopped.
	Runs       []int64 `json:"runs_per_instance"`
	Duplicates int64   `json:"duplicate_runs"`
	P50ms      float64 `json:"p50_ms"`
	P99ms      float64 `json:"p99_ms"`
	// RatioToAlone and RatioToConcurrent are MsgPerSec over that of the
	// same handler's alone and concurrent runs.
	RatioToAlone      float64 `json:"ratio_to_alone"`
	RatioToConcurrent float64 `json:"ratio_to_concurrent"`
}

// RunInstances runs, for the trivial and the holding handler in turn, one
// instance, two taking turns and two consuming at once, and returns one
// result per run.
func RunInstances(ctx context.Context, cfg InstancesConfig) ([]InstancesResult, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	payload := makePayload(cfg.Payload)
	tty := isTerminal(cfg.Progress)
	runID := time.Now().UnixNano() % 1_000_000
	var out []InstancesResult
	for _, hold := range []time.Duration{0, cfg.Hold} {
		first := len(out)
		for _, consume := range []string{ConsumeAlone, ConsumeTurns, ConsumeConcurrent} {
			r := InstancesResult{Handler: "trivial", Instances: 2, Consume: consume}
			if hold > 0 {
				r.Handler, r.HoldMs = "hold", float64(hold)/float64(time.Millisecond)
			}
			if consume == ConsumeAlone {
				r.Instances = 1
			}
			runID++
			rctx, cancel := context.WithTimeout(ctx, cfg.RunTimeout)
			p := startProgress(cfg.Progress, tty, fmt.Sprintf("instances / %s / %d, %s", r.Handler, r.Instances, consume))
			env := &runEnv{cfg: Config{URL: cfg.URL, Messages: cfg.Messages, Payload: cfg.Payload}, id: fmt.Sprintf("i%d", runID), payload: payload, progress: p}
			err := instancesRun(rctx, env, hold, &r)
			p.stop()
			cancel()
			if err != nil {
				return out, fmt.Errorf("bench: instances / %s / %s: %w", r.Handler, consume, err)
			}
			out = append(out, r)
		}
		runs := out[first:]
		for i := range runs {
			if a := runs[0].MsgPerSec; a > 0 {
				runs[i].RatioToAlone = runs[i].MsgPerSec / a
			}
			if c := runs[2].MsgPerSec; c > 0 {
				runs[i].RatioToConcurrent = runs[i].MsgPerSec / c
			}
		}
	}
	return out, nil
}

// instancesRun runs the burst and fills r in once instancesBurst has
// stopped the instances, so that no handler still writes what is read.
func instancesRun(ctx context.Context, env *runEnv, hold time.Duration, r *InstancesResult) error {
	m := newMeasurement(env.cfg.Messages)
	runs := make([]atomic.Int64, r.Instances)
	if err := instancesBurst(ctx, env, hold, r, m, runs); err != nil {
		return err
	}
	r.Messages, r.Seconds = m.n, m.elapsed.Seconds()
	if r.Seconds > 0 {
		r.MsgPerSec = float64(m.n) / r.Seconds
	}
	r.P50ms, r.P99ms = m.percentile(50), m.percentile(99)
	var total int64
	for i := range runs {
		n := runs[i].Load()
		r.Runs = append(r.Runs, n)
		total += n
	}
	r.Duplicates = total - int64(m.n)
	return nil
}

// instancesBurst starts r.Instances instances of one registered agent,
// the second once the first consumes, waits until as many consume as
// r.Consume wants, sends the burst, waits until m has every message and
// stops the instances; runs counts the handler's runs on each.
func instancesBurst(ctx context.Context, env *runEnv, hold time.Duration, r *InstancesResult, m *measurement, runs []atomic.Int64) error {
	k, cs, err := newAkMesh(ctx, env, 1+r.Instances)
	if err != nil {
		return err
	}
	js, err := jetstream.New(cs[0])
	if err != nil {
		k.close()
		return err
	}
	closeMesh := k.close
	k.close = func() {
		dctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		js.DeleteKeyValue(dctx, k.scheme.RegistryBucket())
		closeMesh()
	}
	defer k.stop()

	opts := []agentkit.Option{agentkit.WithScheme(k.scheme)}
	if r.Consume == ConsumeConcurrent {
		opts = append(opts, agentkit.WithConcurrentInstances())
	}
	instances := make([]*agentkit.Agent, r.Instances)
	for i := range instances {
		a, err := agentkit.New(cs[1+i], "worker", opts...)
		if err != nil {
			return err
		}
		k.agents = append(k.agents, a)
		err = a.HandleFunc("work", func(ctx context.Context, msg *agentkit.Message) error {
			runs[i].Add(1)
			if hold > 0 {
				time.Sleep(hold) // the workload: the worker is taken
			}
			m.recordOnce(msg.MessageID, time.Since(msg.Timestamp))
			return nil
		})
		if err == nil {
			err = a.Start(ctx)
		}
		if err != nil {
			return err
		}
		// Each instance starts once the ones before it consume, so the
		// first is the eldest: the one that consumes when they take
		// turns.
		if err := awaitConsuming(ctx, instances[:i], a, r.Consume != ConsumeTurns || i == 0); err != nil {
			return err
		}
		instances[i] = a
	}
	sender, err := agentkit.New(cs[0], "sender", agentkit.WithScheme(k.scheme), agentkit.WithRegistration(false))
	if err != nil {
		return err
	}
	k.agents = append(k.agents, sender)

	env.progress.track(m)
	m.start = time.Now()
	err = sendBatches(ctx, sender, env.cfg.Messages, func(int) string { return "worker" }, wire.PriorityNormal, env.payload)
	if err != nil {
		return err
	}
	return m.wait(ctx)
}

// awaitConsuming waits until every instance in started consumes and a,
// just started, consumes or (want false) stands by.
func awaitConsuming(ctx context.Context, started []*agentkit.Agent, a *agentkit.Agent, want bool) error {
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for {
		ok := a.Consuming() == want
		for _, s := range started {
			ok = ok && s.Consuming()
		}
		if ok {
			return nil
		}
		select {
		case <-t.C:
		case <-ctx.Done():
			return fmt.Errorf("instances did not settle (the new one consuming: %v, want %v): %w", a.Consuming(), want, ctx.Err())
		}
	}
}

// InstancesWarnings returns a warning when a run lasted under
// MinStableSeconds (its ratios are then not stable); an empty slice when
// every one lasted long enough.
func InstancesWarnings(results []InstancesResult) []string {
	var short []string
	for _, r := range results {
		if r.Seconds < MinStableSeconds {
			short = append(short, fmt.Sprintf("%s/%d/%s %.2fs", r.Handler, r.Instances, r.Consume, r.Seconds))
		}
	}
	if len(short) == 0 {
		return []string{}
	}
	return []string{fmt.Sprintf("instances: runs under %gs (%s): msg/s and ratios are not stable; run more messages",
		MinStableSeconds, strings.Join(short, ", "))}
}

// WriteInstancesTable writes the instances runs as an aligned table, one
// row per run, followed by what the columns mean.
func WriteInstancesTable(w io.Writer, results []InstancesResult) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "handler\tinstances\tconsume\tmessages\tmsg/s\tvs alone\tvs concurrent\truns per instance\tduplicate runs\tp50 ms\tp99 ms\t")
	for _, r := range results {
		handler := r.Handler
		if r.HoldMs > 0 {
			handler = fmt.Sprintf("hold %gms", r.HoldMs)
		}
		runs := make([]string, len(r.Runs))
		for i, n := range r.Runs {
			runs[i] = strconv.FormatInt(n, 10)
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%.0f\t%.2f\t%.2f\t%s\t%d\t%.1f\t%.1f\t\n", handler, r.Instances, r.Consume, r.Messages,
			r.MsgPerSec, r.RatioToAlone, r.RatioToConcurrent, strings.Join(runs, " / "), r.Duplicates, r.P50ms, r.P99ms)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintln(w, `
One agent id, registered, as one instance (alone) or two on connections of their own,
taking turns (agentkit's default: only the eldest consumes) or consuming at once
(WithConcurrentInstances); one sender, SendBatch of 256. msg/s: messages handled per
second, first send to last first handling. vs alone, vs concurrent: msg/s over that of the
same handler's alone and concurrent runs. runs per instance: handler runs on each
instance, eldest first; duplicate runs: runs beyond a message's first. Latency: send →
first handling. Ratios compare runs of this process only.`)
	return err
}
