package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// ScaleConfig configures a scale run: for each count in Agents, that many
// registered agents with heartbeats and handlers on one server, spread
// over Runtimes connections as Runtimes processes would spread them, are
// started, left idle, loaded and drained.
type ScaleConfig struct {
	// URL is the NATS server every connection goes to. Required.
	URL string
	// Agents lists the agent counts to run, one row each, in order.
	// Required.
	Agents []int
	// Runtimes is how many connections the agents share, agent i on
	// connection i mod Runtimes. Default: 20.
	Runtimes int
	// Messages is the size of the burst, and of the raw 1-agent run its
	// rate is compared with. Default: 20000.
	Messages int
	// Payload is the payload size in bytes. Default: 512.
	Payload int
	// Idle is the window over which idle CPU is measured. Default: 10s.
	Idle time.Duration
	// Rate is the offered request rate of the request phase, per second.
	// Default: 500.
	Rate int
	// RequestTime is how long the request phase offers requests.
	// Default: 5s.
	RequestTime time.Duration
	// PerAgent has each agent read five consumers of its own, instead of
	// the agents of one connection sharing one [agentkit.Group], as the
	// process hosting them would.
	PerAgent bool
	// PhaseTimeout bounds each phase (start, burst, requests, drain) of
	// one count. Default: 5m.
	PhaseTimeout time.Duration
	// Progress receives each phase's progress, as in [Config]; nil shows
	// none.
	Progress io.Writer
}

// ScaleDefaultAgents are the counts the goals are stated for.
var ScaleDefaultAgents = []int{100, 300, 1000}

func (c *ScaleConfig) setDefaults() {
	if c.Runtimes == 0 {
		c.Runtimes = 20
	}
	if c.Messages == 0 {
		c.Messages = 20000
	}
	if c.Payload == 0 {
		c.Payload = 512
	}
	if c.Idle == 0 {
		c.Idle = 10 * time.Second
	}
	if c.Rate == 0 {
		c.Rate = 500
	}
	if c.RequestTime == 0 {
		c.RequestTime = 5 * time.Second
	}
	if c.PhaseTimeout == 0 {
		c.PhaseTimeout = 5 * time.Minute
	}
}

// Validate reports whether c is usable.
func (c *ScaleConfig) Validate() error {
	switch {
	case c.URL == "":
		return errors.New("bench: ScaleConfig.URL is required")
	case len(c.Agents) == 0:
		return errors.New("bench: scale needs at least one agent count")
	case c.Runtimes < 1:
		return fmt.Errorf("bench: runtimes %d must be at least 1", c.Runtimes)
	case c.Messages < 1:
		return fmt.Errorf("bench: messages %d must be at least 1", c.Messages)
	case c.Payload < 16:
		return fmt.Errorf("bench: payload %d must be at least 16 bytes", c.Payload)
	case c.Idle < 0:
		return fmt.Errorf("bench: idle window %v must not be negative", c.Idle)
	case c.Rate < 1:
		return fmt.Errorf("bench: request rate %d must be at least 1", c.Rate)
	case c.RequestTime <= 0:
		return fmt.Errorf("bench: request time %v must be positive", c.RequestTime)
	}
	for _, n := range c.Agents {
		if n < 1 {
			return fmt.Errorf("bench: agent count %d must be at least 1", n)
		}
	}
	return nil
}

// ScaleReport is the outcome of a scale run.
type ScaleReport struct {
	// Raw is the raw nats.go 1-agent run of the same Messages, the
	// reference of each row's BurstRatioToRaw.
	Raw Result `json:"raw_1_agent"`
	// Results holds one row per agent count, in the order run.
	Results []ScaleResult `json:"results"`
}

// ScaleResult is one agent count's row. CPU and RSS are nil where the
// platform does not expose them.
type ScaleResult struct {
	Agents   int `json:"agents"`
	Runtimes int `json:"runtimes"`
	// Consumers is "group" when each runtime's agents share its group's
	// consumers, "agent" when each agent reads its own.
	Consumers string `json:"consumers"`
	// Started is how many agents started; below Agents when Error says
	// why the start stopped.
	Started int `json:"started"`
	// StartSeconds is the wall time from the first agent's New to the
	// last Start returning (or to the failure).
	StartSeconds float64 `json:"start_seconds"`
	// StoppedIn names the phase that failed (one of ScalePhases; "" when
	// every phase ran) and Error says why; the agents that had started
	// were stopped, and the figures of that phase and the later ones are
	// zero.
	StoppedIn string `json:"stopped_in,omitempty"`
	Error     string `json:"error,omitempty"`

	// IdleSeconds is the idle window; IdleCPUPercent the process's CPU
	// time over it (server and agents: the server runs in this process
	// unless --external) in percent of one core; RSSBytes the process's
	// resident memory at its end.
	IdleSeconds    float64  `json:"idle_seconds"`
	IdleCPUPercent *float64 `json:"idle_cpu_percent"`
	RSSBytes       *int64   `json:"rss_bytes"`

	// MeshConsumers and RegistryConsumers count the consumers on the
	// message stream and on the registry bucket's stream; RegistryKeys
	// the registry bucket's keys. Read after the idle window.
	MeshConsumers     int `json:"mesh_consumers"`
	RegistryConsumers int `json:"registry_consumers"`
	RegistryKeys      int `json:"registry_keys"`

	// The burst: BurstMessages sent with SendBatch round robin over the
	// agents, first send to last handle.
	BurstMessages   int     `json:"burst_messages"`
	BurstSeconds    float64 `json:"burst_seconds"`
	BurstMsgPerSec  float64 `json:"burst_msg_per_sec"`
	BurstRatioToRaw float64 `json:"burst_ratio_to_raw"`

	// Requests paced at RequestRate per second to random agents, each
	// answered through the stream; round-trip percentiles.
	RequestRate  int     `json:"request_rate"`
	Requests     int     `json:"requests"`
	RequestP50ms float64 `json:"request_p50_ms"`
	RequestP99ms float64 `json:"request_p99_ms"`

	// DrainSeconds is the wall time to Drain every agent, parallel at a
	// time.
	DrainSeconds float64 `json:"drain_seconds"`
}

// parallel bounds how many agents start, or drain, at once: enough to
// overlap their round trips to the server, few enough that the start-up
// of one does not queue behind hundreds of others.
const parallel = 8

// Scale actions: the burst's messages (sendBatches sends "work") and the
// requests.
const (
	scaleWork = "work"
	scalePing = "ping"
)

// RunScale runs the raw 1-agent reference, then one scale row per count
// in cfg.Agents. A row whose agents fail to start, or whose phase fails,
// says so in its Error and the run goes on with the next count; RunScale
// itself fails only when the server cannot be used at all or ctx ends.
func RunScale(ctx context.Context, cfg ScaleConfig) (*ScaleReport, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	payload := makePayload(cfg.Payload)
	tty := isTerminal(cfg.Progress)
	runID := time.Now().UnixNano() % 1_000_000
	report := &ScaleReport{Raw: Result{Scenario: Scenario1Agent, Impl: ImplRaw}}

	raw, err := scaleRaw(ctx, cfg, fmt.Sprintf("b%d", runID), payload, tty)
	if err != nil {
		return nil, fmt.Errorf("bench: raw 1-agent reference: %w", err)
	}
	report.Raw.Messages, report.Raw.Seconds = raw.n, raw.elapsed.Seconds()
	if report.Raw.Seconds > 0 {
		report.Raw.MsgPerSec = float64(raw.n) / report.Raw.Seconds
	}
	report.Raw.P50ms, report.Raw.P90ms, report.Raw.P99ms = raw.percentile(50), raw.percentile(90), raw.percentile(99)

	for i, n := range cfg.Agents {
		r := &scaleRun{cfg: cfg, n: n, payload: payload, tty: tty}
		res, err := r.run(ctx, fmt.Sprintf("s%d_%d", runID, i))
		if err != nil {
			return report, fmt.Errorf("bench: scale %d agents: %w", n, err)
		}
		if report.Raw.MsgPerSec > 0 {
			res.BurstRatioToRaw = res.BurstMsgPerSec / report.Raw.MsgPerSec
		}
		report.Results = append(report.Results, res)
	}
	return report, nil
}

// scaleRaw runs the comparison's raw 1-agent scenario with the burst's
// message count.
func scaleRaw(ctx context.Context, cfg ScaleConfig, id string, payload []byte, tty bool) (*measurement, error) {
	ctx, cancel := context.WithTimeout(ctx, cfg.PhaseTimeout)
	defer cancel()
	p := startProgress(cfg.Progress, tty, "scale / raw 1-agent reference")
	defer p.stop()
	env := &runEnv{cfg: Config{URL: cfg.URL, Messages: cfg.Messages, Payload: cfg.Payload}, id: id, payload: payload, progress: p}
	return rawThroughput(ctx, env, 1)
}

// scaleRun is one agent count's run.
type scaleRun struct {
	cfg     ScaleConfig
	n       int
	payload []byte
	tty     bool

	scheme subjects.Scheme
	js     jetstream.JetStream // on the driver's connection
	cs     []*nats.Conn        // cs[0] the driver's, then one per runtime
	driver *agentkit.Agent     // sends the burst and the requests
	ids    []string
	agents []*agentkit.Agent // the started ones
	groups []*agentkit.Group // one per runtime, unless cfg.PerAgent
	burst  atomic.Pointer[measurement]
}

// run runs every phase for r.n agents under the scheme named prefix and
// removes what it created: the agents, their stream and registry bucket.
// It returns an error only when it cannot set up, or ctx ends.
func (r *scaleRun) run(ctx context.Context, prefix string) (res ScaleResult, err error) {
	res = ScaleResult{Agents: r.n, Runtimes: min(r.cfg.Runtimes, r.n), RequestRate: r.cfg.Rate, Consumers: "group"}
	if r.cfg.PerAgent {
		res.Consumers = "agent"
	}
	if r.scheme, err = subjects.New(prefix); err != nil {
		return res, err
	}
	cs, closeAll, err := conns(r.cfg.URL, res.Runtimes+1)
	if err != nil {
		return res, err
	}
	defer closeAll()
	r.cs = cs
	if r.js, err = jetstream.New(cs[0]); err != nil {
		return res, err
	}
	// As agents create it (an account's consumer cap included), retried
	// like every stream of the bench: the previous row has just deleted
	// its streams, and the server may fail to create the store at once.
	for attempt := 1; ; attempt++ {
		err = agentkit.EnsureStream(ctx, r.js, agentkit.StreamConfig(r.scheme, 1))
		if err == nil || attempt == storeAttempts || !storeFailed(err) {
			break
		}
	}
	if err != nil {
		return res, err
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		r.js.DeleteKeyValue(dctx, r.scheme.RegistryBucket())
		deleteStream(r.js, r.scheme.Stream())
	}()
	if !r.cfg.PerAgent {
		r.groups = make([]*agentkit.Group, len(cs)-1)
		for i := range r.groups {
			if r.groups[i], err = agentkit.NewGroup(cs[1+i], fmt.Sprintf("rt%d", i), agentkit.WithGroupScheme(r.scheme)); err != nil {
				return res, err
			}
		}
	}
	// Whatever phase stops the row, every agent it started stops before
	// their groups close and their stream goes; after the drain phase
	// none is left to stop.
	defer func() {
		r.stopAll()
		for _, g := range r.groups {
			g.Close()
		}
	}()

	// The driver is started first, so a start that fails is always one of
	// the measured agents'. It does not register: it is the benchmark's
	// instrument, not one of the agents measured.
	r.driver, err = agentkit.New(cs[0], "driver", agentkit.WithScheme(r.scheme), agentkit.WithRegistration(false))
	if err != nil {
		return res, err
	}
	if err := r.phase(ctx, func(ctx context.Context) error { return r.driver.Start(ctx) }); err != nil {
		if ctx.Err() != nil {
			return res, ctx.Err()
		}
		res.StoppedIn, res.Error = ScalePhases[0], fmt.Sprintf("driver: %v", err)
		return res, nil
	}

	steps := []func(context.Context, *ScaleResult) error{r.start, r.idle, r.serverState, r.runBurst, r.requests, r.drain}
	for i, step := range steps {
		err := r.phase(ctx, func(pctx context.Context) error { return step(pctx, &res) })
		if ctx.Err() != nil {
			return res, ctx.Err()
		}
		if err != nil {
			res.StoppedIn, res.Error = ScalePhases[i], err.Error()
			break
		}
	}
	return res, nil
}

// ScalePhases names the phases of a scale row, in order.
var ScalePhases = []string{"start", "idle", "server state", "burst", "requests", "drain"}

// ran reports whether phase ran to its end in row.
func (row *ScaleResult) ran(phase string) bool {
	if row.StoppedIn == "" {
		return true
	}
	return slices.Index(ScalePhases, phase) < slices.Index(ScalePhases, row.StoppedIn)
}

// phase runs f with the phase timeout.
func (r *scaleRun) phase(ctx context.Context, f func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.PhaseTimeout)
	defer cancel()
	return f(ctx)
}

// progress starts the progress display of one phase.
func (r *scaleRun) progress(phase string, m *measurement) *progress {
	p := startProgress(r.cfg.Progress, r.tty, fmt.Sprintf("scale %d agents / %s", r.n, phase))
	p.track(m)
	return p
}

// newAgent creates agent i, registered (the default) with its heartbeats,
// on its runtime's connection and in its group, handling the burst and
// the requests, which are direct messages: it declares no fan-out action,
// so it has no fan-out consumers.
func (r *scaleRun) newAgent(i int) (*agentkit.Agent, error) {
	rt := i % (len(r.cs) - 1)
	opts := []agentkit.Option{agentkit.WithScheme(r.scheme), agentkit.WithFanoutActions()}
	if r.groups != nil {
		opts = append(opts, agentkit.WithGroup(r.groups[rt]))
	}
	a, err := agentkit.New(r.cs[1+rt], r.ids[i], opts...)
	if err != nil {
		return nil, err
	}
	err = errors.Join(
		a.HandleFunc(scaleWork, func(ctx context.Context, msg *agentkit.Message) error {
			if m := r.burst.Load(); m != nil {
				m.recordOnce(msg.MessageID, time.Since(msg.Timestamp))
			}
			return nil
		}),
		a.HandleFunc(scalePing, func(ctx context.Context, msg *agentkit.Message) error {
			return msg.Reply(ctx, "pong", msg.Payload)
		}))
	return a, err
}

// start creates and starts every agent, parallel at a time, and stops
// handing out agents at the first failure.
func (r *scaleRun) start(ctx context.Context, res *ScaleResult) error {
	r.ids = make([]string, r.n)
	for i := range r.ids {
		r.ids[i] = fmt.Sprintf("a%d", i)
	}
	started := make([]*agentkit.Agent, r.n)
	m := newMeasurement(r.n)
	p := r.progress("start", m)
	t0 := time.Now()
	err := bounded(r.n, parallel, func(i int) error {
		t := time.Now()
		a, err := r.newAgent(i)
		if err == nil {
			err = a.Start(ctx)
		}
		if err != nil {
			return fmt.Errorf("agent %s: %w", r.ids[i], err)
		}
		started[i] = a
		m.record(time.Since(t))
		return nil
	})
	res.StartSeconds = time.Since(t0).Seconds()
	p.stop()
	for _, a := range started {
		if a != nil {
			r.agents = append(r.agents, a)
		}
	}
	res.Started = len(r.agents)
	if err != nil {
		return fmt.Errorf("%d of %d agents started: %w", res.Started, r.n, err)
	}
	return nil
}

// idle leaves the agents idle for the idle window and measures the
// process's CPU time over it and its resident memory at its end.
func (r *scaleRun) idle(ctx context.Context, res *ScaleResult) error {
	if r.cfg.Progress != nil {
		fmt.Fprintf(r.cfg.Progress, "scale %d agents / idle: %v\n", r.n, r.cfg.Idle)
	}
	cpu0, cpuOK := cpuTime()
	t0 := time.Now()
	t := time.NewTimer(r.cfg.Idle)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		return ctx.Err()
	}
	wall := time.Since(t0)
	res.IdleSeconds = wall.Seconds()
	if cpu1, ok := cpuTime(); cpuOK && ok && wall > 0 {
		pct := 100 * float64(cpu1-cpu0) / float64(wall)
		res.IdleCPUPercent = &pct
	}
	if rss, ok := rssBytes(); ok {
		res.RSSBytes = &rss
	}
	return nil
}

// serverState counts the consumers of the message stream and of the
// registry bucket's stream, then the registry's keys (counting first: the
// key listing is a consumer of its own while it runs).
func (r *scaleRun) serverState(ctx context.Context, res *ScaleResult) error {
	kv, err := r.js.KeyValue(ctx, r.scheme.RegistryBucket())
	if err != nil {
		return err
	}
	// A bucket's stream is KV_<bucket>: the key-value store's naming,
	// which every client library shares.
	for name, n := range map[string]*int{r.scheme.Stream(): &res.MeshConsumers, "KV_" + r.scheme.RegistryBucket(): &res.RegistryConsumers} {
		st, err := r.js.Stream(ctx, name)
		if err != nil {
			return fmt.Errorf("stream %s: %w", name, err)
		}
		*n = st.CachedInfo().State.Consumers
	}
	keys, err := kv.Keys(ctx)
	if err != nil && !errors.Is(err, jetstream.ErrNoKeysFound) {
		return err
	}
	res.RegistryKeys = len(keys)
	return nil
}

// runBurst sends Messages round robin over the agents with SendBatch and
// measures until every one is handled.
func (r *scaleRun) runBurst(ctx context.Context, res *ScaleResult) error {
	m := newMeasurement(r.cfg.Messages)
	p := r.progress("burst", m)
	defer p.stop()
	r.burst.Store(m)
	m.start = time.Now()
	err := sendBatches(ctx, r.driver, r.cfg.Messages, func(i int) string { return r.ids[i%r.n] }, wire.PriorityNormal, r.payload)
	if err == nil {
		err = m.wait(ctx)
	}
	if err != nil {
		return err
	}
	res.BurstMessages, res.BurstSeconds = m.n, m.elapsed.Seconds()
	if res.BurstSeconds > 0 {
		res.BurstMsgPerSec = float64(m.n) / res.BurstSeconds
	}
	return nil
}

// requests offers Rate requests per second for RequestTime, each to a
// random agent, and records their round trips.
func (r *scaleRun) requests(ctx context.Context, res *ScaleResult) error {
	n := max(1, int(int64(r.cfg.Rate)*int64(r.cfg.RequestTime)/int64(time.Second)))
	m := newMeasurement(n)
	p := r.progress("requests", m)
	defer p.stop()
	var wg sync.WaitGroup
	var failed atomic.Pointer[error]
	// The bound only keeps a stalled server from piling up goroutines; at
	// the offered rate far fewer are in flight.
	sem := make(chan struct{}, 2000)
	m.start = time.Now()
	err := pace(ctx, n, r.cfg.Rate, func(int) {
		to := r.ids[rand.IntN(r.n)]
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			t0 := time.Now()
			if _, err := r.driver.Request(ctx, to, scalePing, r.payload); err != nil {
				failed.CompareAndSwap(nil, &err)
				return
			}
			m.record(time.Since(t0))
		})
	})
	wg.Wait()
	if err != nil {
		return err
	}
	if e := failed.Load(); e != nil {
		return *e
	}
	if err := m.wait(ctx); err != nil {
		return err
	}
	res.Requests = m.n
	res.RequestP50ms, res.RequestP99ms = m.percentile(50), m.percentile(99)
	return nil
}

// drain drains every agent, parallel at a time, and times the whole.
func (r *scaleRun) drain(ctx context.Context, res *ScaleResult) error {
	agents := r.agents
	r.agents = nil // drained or stopped by Drain itself: nothing left for stopAll
	m := newMeasurement(len(agents))
	p := r.progress("drain", m)
	var mu sync.Mutex
	var errs []error
	t0 := time.Now()
	bounded(len(agents), parallel, func(i int) error {
		t := time.Now()
		if err := agents[i].Drain(ctx); err != nil {
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
		}
		m.record(time.Since(t))
		return nil
	})
	res.DrainSeconds = time.Since(t0).Seconds()
	p.stop()
	if len(errs) > 0 {
		return fmt.Errorf("%d of %d agents: %w", len(errs), len(agents), errs[0])
	}
	return nil
}

// stopAll stops the agents still running and the driver.
func (r *scaleRun) stopAll() {
	agents := r.agents
	r.agents = nil
	bounded(len(agents), parallel, func(i int) error { agents[i].Stop(); return nil })
	if r.driver != nil {
		r.driver.Stop()
	}
}

// bounded calls f(i) for i in [0, n), at most limit at a time, and hands
// out no more after the first error, which it returns.
func bounded(n, limit int, f func(i int) error) error {
	var (
		next   atomic.Int64
		failed atomic.Bool
		mu     sync.Mutex
		first  error
		wg     sync.WaitGroup
	)
	for range min(limit, n) {
		wg.Go(func() {
			for !failed.Load() {
				i := next.Add(1) - 1
				if i >= int64(n) {
					return
				}
				if err := f(int(i)); err != nil {
					mu.Lock()
					first = cmpErr(first, err)
					mu.Unlock()
					failed.Store(true)
					return
				}
			}
		})
	}
	wg.Wait()
	return first
}

// userHZ is the unit of the CPU times in /proc/<pid>/stat: Linux reports
// them in USER_HZ, 100 per second on every architecture.
const userHZ = 100

// cpuTime returns the CPU time (user and system) the process has used,
// from /proc/self/stat; false where there is no such file.
func cpuTime() (time.Duration, bool) {
	b, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		return 0, false
	}
	// The command name, in parentheses, may hold spaces: fields count
	// from after its closing one. utime and stime are fields 14 and 15
	// of the whole line, so 12th and 13th after the name.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0, false
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return time.Duration(utime+stime) * time.Second / userHZ, true
}

// rssBytes returns the process's resident set size, from
// /proc/self/status; false where there is no such file.
func rssBytes() (int64, bool) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, false
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(v)
			if len(f) != 2 || f[1] != "kB" {
				return 0, false
			}
			kb, err := strconv.ParseInt(f[0], 10, 64)
			return kb * 1024, err == nil
		}
	}
	return 0, false
}

// ScaleWarnings returns a warning when the raw reference or a burst ran
// shorter than MinStableSeconds (the ratio between them is then not
// stable); an empty slice when every one lasted long enough.
func ScaleWarnings(r *ScaleReport) []string {
	out := []string{}
	var short []string
	if r.Raw.Seconds < MinStableSeconds {
		short = append(short, fmt.Sprintf("raw 1-agent %.2fs", r.Raw.Seconds))
	}
	for _, row := range r.Results {
		if row.BurstMessages > 0 && row.BurstSeconds < MinStableSeconds {
			short = append(short, fmt.Sprintf("burst of %d agents %.2fs", row.Agents, row.BurstSeconds))
		}
	}
	if len(short) > 0 {
		out = append(out, fmt.Sprintf("scale: runs under %gs (%s): burst msg/s and ratios to raw are not stable; run more messages",
			MinStableSeconds, strings.Join(short, ", ")))
	}
	return out
}

// WriteScaleTable writes the scale report as an aligned table, one row per
// agent count, followed by why any row stopped early and what the columns
// mean. Cells of phases that did not run stay empty.
func WriteScaleTable(w io.Writer, r *ScaleReport) error {
	fmt.Fprintf(w, "raw 1-agent reference: %.0f msg/s (%d messages)\n\n", r.Raw.MsgPerSec, r.Raw.Messages)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "agents\tstarted\tstart s\tidle CPU %\tRSS MB\tstream cons.\tregistry cons.\tregistry keys\tburst msg/s\tvs raw\treq p50 ms\treq p99 ms\tdrain s\t")
	var stopped []string
	for _, row := range r.Results {
		if row.Error != "" {
			stopped = append(stopped, fmt.Sprintf("  %d agents, in %s: %s", row.Agents, row.StoppedIn, row.Error))
		}
		cpu, rss := "n/a", "n/a"
		if row.IdleCPUPercent != nil {
			cpu = fmt.Sprintf("%.1f", *row.IdleCPUPercent)
		}
		if row.RSSBytes != nil {
			rss = fmt.Sprintf("%.0f", float64(*row.RSSBytes)/(1<<20))
		}
		idle, state, burst, req, drain := row.ran("idle"), row.ran("server state"), row.ran("burst"), row.ran("requests"), row.ran("drain")
		cells := []string{
			strconv.Itoa(row.Agents),
			fmt.Sprintf("%d/%d", row.Started, row.Agents),
			fmt.Sprintf("%.2f", row.StartSeconds),
			cell(idle, "%s", cpu),
			cell(idle, "%s", rss),
			cell(state, "%d", row.MeshConsumers),
			cell(state, "%d", row.RegistryConsumers),
			cell(state, "%d", row.RegistryKeys),
			cell(burst, "%.0f", row.BurstMsgPerSec),
			cell(burst && row.BurstRatioToRaw > 0, "%.2f", row.BurstRatioToRaw),
			cell(req, "%.1f", row.RequestP50ms),
			cell(req, "%.1f", row.RequestP99ms),
			cell(drain, "%.2f", row.DrainSeconds),
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t")+"\t")
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(stopped) > 0 {
		fmt.Fprintln(w, "\nStopped early:")
		for _, s := range stopped {
			fmt.Fprintln(w, s)
		}
	}
	_, err := fmt.Fprintf(w, `
Each row: that many agents, registered with heartbeats, on one NATS server over as
many connections as runtimes, and one driver agent sending the load. start s: New +
Start of every agent, %[1]d at a time. idle CPU %%: this process's CPU time over the
idle window (the embedded server runs in it), in percent of one core; RSS likewise.
stream and registry cons.: consumers on the message stream (the driver's included)
and on the registry bucket's stream. burst: the messages sent with SendBatch round
robin over the agents, first send to last handle; vs raw: its msg/s over the raw
1-agent reference's. req: round trips of requests to random agents at the offered
rate. drain s: Drain of every agent, %[1]d at a time. Goals at 1,000 agents: start
< 10 s, idle CPU < 10 %%, vs raw >= 0.50, req p99 < 50 ms at 500/s.
`, parallel)
	return err
}

// cell formats v, or leaves the cell of a phase that did not run empty.
func cell(ok bool, format string, v any) string {
	if !ok {
		return ""
	}
	return fmt.Sprintf(format, v)
}
