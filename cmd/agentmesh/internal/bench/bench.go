// Package bench is the engine of `agentmesh bench`: raw nats.go and
// agentkit moving the same messages over one NATS server in one run, so
// their ratios mean something even on a noisy machine. The comparison
// with Watermill (watermill-nats/v2 pkg/jetstream, with its default
// DoubleAck and with AckAsync) runs on the same engine from this
// package's tests, so the shipped binary does not link Watermill.
//
// # Scenarios
//
//	1-agent, 10-agents, 100-agents  a burst of Messages sent round robin to
//	                                N receiving agents; msg/s end to end and the
//	                                send→handle latency of every message (the
//	                                burst queues, so latency grows with N)
//	request-response                requests at a fixed offered Rate, each
//	                                answered through the stream; round-trip latency
//	critical-behind-backlog         Messages low-priority messages are stored, the
//	                                receiver starts, then 10 critical messages are
//	                                sent; the latency of the critical ones
//
// The methodology is agentkit/bench_test.go's: raw is PublishAsync from one
// goroutine → Consume → Ack; raw-mesh is the same on agentkit's stream and
// consumer configuration (each receiver's normal-priority consumer, with its
// direct and broadcast filters and every ack sampled), the broker's share of
// agentkit's cost; agentkit-batch is SendBatch of 256; agentkit
// is Send from 64 goroutines each waiting for its stream ack; Watermill
// (in the tests) publishes synchronously from 64 goroutines. agentkit's agents run
// without registration: the registry and its heartbeats are control
// plane, not the message path compared here. Payloads are Payload bytes
// of JSON (512 by default).
package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Scenario names.
const (
	Scenario1Agent    = "1-agent"
	Scenario10Agents  = "10-agents"
	Scenario100Agents = "100-agents"
	ScenarioRequest   = "request-response"
	ScenarioBacklog   = "critical-behind-backlog"
)

// Scenarios lists every scenario in run order.
var Scenarios = []string{Scenario1Agent, Scenario10Agents, Scenario100Agents, ScenarioRequest, ScenarioBacklog}

// Implementation names.
const (
	ImplRaw           = "raw"
	ImplRawMesh       = "raw-mesh"
	ImplAgentkitBatch = "agentkit-batch"
	ImplAgentkit      = "agentkit"
	// The group implementations host the receivers as one process
	// would: in one agentkit.Group on one connection, sharing its five
	// consumers, each declaring no fan-out action.
	ImplGroupBatch = "agentkit-group-batch"
	ImplGroup      = "agentkit-group"
)

// Impls lists every implementation in table order.
var Impls = []string{ImplRaw, ImplRawMesh, ImplAgentkitBatch, ImplAgentkit, ImplGroupBatch, ImplGroup}

// Config configures a benchmark run.
type Config struct {
	// URL is the NATS server every side connects to. Required.
	URL string
	// Messages per run. Default: 20000.
	Messages int
	// Payload is the payload size in bytes. Default: 512.
	Payload int
	// Rate is the offered request rate of request-response, per second;
	// that scenario sends min(Messages, 3 × Rate) requests. Default: 1000.
	Rate int
	// Scenarios and Impls select what runs. Default: all.
	Scenarios []string
	Impls     []string
	// Progress receives the progress of each run (e.g. os.Stderr): on a
	// terminal one line redrawn in place, elsewhere plain lines; nil shows
	// none.
	Progress io.Writer
	// RunTimeout bounds each run. Default: 2m.
	RunTimeout time.Duration

	// maxAgents, when positive, caps the receivers of the N-agents
	// scenarios, so tests cover each scenario's code path without paying
	// for its scale.
	maxAgents int
	// others are implementations beyond Impls, listed and run after them:
	// comparisons with libraries the shipped binary must not link, which
	// this package's tests add.
	others []other
}

// other is an implementation outside Impls.
type other struct {
	name string
	// run runs scenario sc; agents is the receivers of an N-agents
	// scenario.
	run func(ctx context.Context, env *runEnv, sc string, agents int) (*measurement, error)
}

// implNames lists every implementation c can run, in table order.
func (c *Config) implNames() []string {
	names := slices.Clone(Impls)
	for _, o := range c.others {
		names = append(names, o.name)
	}
	return names
}

func (c *Config) setDefaults() {
	if c.Messages == 0 {
		c.Messages = 20000
	}
	if c.Payload == 0 {
		c.Payload = 512
	}
	if c.Rate == 0 {
		c.Rate = 1000
	}
	if len(c.Scenarios) == 0 {
		c.Scenarios = Scenarios
	}
	if len(c.Impls) == 0 {
		c.Impls = c.implNames()
	}
	if c.RunTimeout == 0 {
		c.RunTimeout = 2 * time.Minute
	}
}

// Validate reports whether c is usable.
func (c *Config) Validate() error {
	switch {
	case c.URL == "":
		return errors.New("bench: Config.URL is required")
	case c.Messages < 1:
		return fmt.Errorf("bench: messages %d must be at least 1", c.Messages)
	case c.Payload < 16:
		return fmt.Errorf("bench: payload %d must be at least 16 bytes", c.Payload)
	case c.Rate < 1:
		return fmt.Errorf("bench: rate %d must be at least 1", c.Rate)
	}
	for _, s := range c.Scenarios {
		if !slices.Contains(Scenarios, s) {
			return fmt.Errorf("bench: unknown scenario %q (%s)", s, strings.Join(Scenarios, ", "))
		}
	}
	names := c.implNames()
	for _, s := range c.Impls {
		if !slices.Contains(names, s) {
			return fmt.Errorf("bench: unknown implementation %q (%s)", s, strings.Join(names, ", "))
		}
	}
	return nil
}

// Result is one scenario run by one implementation.
type Result struct {
	Scenario string `json:"scenario"`
	Impl     string `json:"impl"`
	// Messages is how many messages were measured (handled, or answered).
	Messages int `json:"messages"`
	// Seconds is the run's duration from the first send to the last handle.
	Seconds float64 `json:"seconds"`
	// MsgPerSec is Messages / Seconds.
	MsgPerSec float64 `json:"msg_per_sec"`
	// RatioToRaw is MsgPerSec relative to raw's in the same scenario (0
	// when raw did not run).
	RatioToRaw float64 `json:"ratio_to_raw"`
	// Latency percentiles in milliseconds: send → handle, or the request's
	// round trip, or (critical-behind-backlog) the critical messages only.
	P50ms float64 `json:"p50_ms"`
	P90ms float64 `json:"p90_ms"`
	P99ms float64 `json:"p99_ms"`
	// Skipped says why the combination did not run.
	Skipped string `json:"skipped,omitempty"`
}

// Run runs every selected scenario with every selected implementation, in
// order, and returns one result per pair.
func Run(ctx context.Context, cfg Config) ([]Result, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	payload := makePayload(cfg.Payload)
	tty := isTerminal(cfg.Progress)
	var out []Result
	runID := time.Now().UnixNano() % 1_000_000
	for _, sc := range cfg.Scenarios {
		for _, impl := range cfg.Impls {
			r := Result{Scenario: sc, Impl: impl}
			if why := skip(sc, impl); why != "" {
				r.Skipped = why
				out = append(out, r)
				continue
			}
			runID++
			rctx, cancel := context.WithTimeout(ctx, cfg.RunTimeout)
			p := startProgress(cfg.Progress, tty, sc+" / "+impl)
			env := &runEnv{cfg: cfg, id: fmt.Sprintf("b%d", runID), payload: payload, progress: p}
			m, err := runOne(rctx, env, sc, impl)
			p.stop()
			cancel()
			if err != nil {
				return out, fmt.Errorf("bench: %s / %s: %w", sc, impl, err)
			}
			r.Messages, r.Seconds = m.n, m.elapsed.Seconds()
			if r.Seconds > 0 {
				r.MsgPerSec = float64(m.n) / r.Seconds
			}
			r.P50ms, r.P90ms, r.P99ms = m.percentile(50), m.percentile(90), m.percentile(99)
			out = append(out, r)
		}
	}
	for i := range out {
		for _, raw := range out {
			if raw.Scenario == out[i].Scenario && raw.Impl == ImplRaw && raw.MsgPerSec > 0 {
				out[i].RatioToRaw = out[i].MsgPerSec / raw.MsgPerSec
			}
		}
	}
	return out, nil
}

// MinStableSeconds is the shortest run whose msg/s, and ratio to raw, is
// worth comparing. Besides its messages, a run's window holds one-off
// costs: consumers' first pulls, connections warming up, a garbage
// collection, on a busy machine the scheduler's delays. They add up to
// tens or hundreds of milliseconds, which fade into a run of a second or
// more but can swing the ratios of shorter runs several-fold.
const MinStableSeconds = 1.0

// MinStableMessages is the fewest messages per run whose ratios are worth
// comparing: in shorter runs the same one-off costs decide the ratio, and
// runs of a thousand messages have swung from a fifth of raw's rate to
// several times it between two invocations.
const MinStableMessages = 10_000

// MessagesWarning returns a warning when runs of messages messages are
// too short for stable ratios, else "".
func MessagesWarning(messages int) string {
	if messages >= MinStableMessages {
		return ""
	}
	return fmt.Sprintf("--messages %d: runs below %d messages give ratios to raw that vary several-fold between invocations; compare runs of at least %d",
		messages, MinStableMessages, MinStableMessages)
}

// Warnings returns one warning per scenario whose rates rest on runs
// shorter than MinStableSeconds, raw's included (every ratio of the
// scenario divides by it); an empty slice when every run lasted long
// enough. critical-behind-backlog measures only latency and is never
// warned about.
func Warnings(results []Result) []string {
	out := []string{}
	var short []string
	flush := func(sc string) {
		if len(short) > 0 {
			out = append(out, fmt.Sprintf("%s: runs under %gs (%s): msg/s and ratios to raw are not stable; run more messages",
				sc, MinStableSeconds, strings.Join(short, ", ")))
		}
		short = short[:0]
	}
	for i, r := range results {
		if r.Skipped == "" && r.Scenario != ScenarioBacklog && r.Seconds < MinStableSeconds {
			short = append(short, fmt.Sprintf("%s %.2fs", r.Impl, r.Seconds))
		}
		if i == len(results)-1 || results[i+1].Scenario != r.Scenario {
			flush(r.Scenario)
		}
	}
	return out
}

// skip says why impl does not run sc, or "".
func skip(sc, impl string) string {
	if impl == ImplRawMesh && (sc == ScenarioRequest || sc == ScenarioBacklog) {
		return "a throughput reference only"
	}
	if impl == ImplAgentkitBatch && (sc == ScenarioRequest || sc == ScenarioBacklog) {
		return "same as agentkit (requests are individual; the backlog is always sent with SendBatch)"
	}
	if (impl == ImplGroupBatch || impl == ImplGroup) && (sc == Scenario1Agent || sc == ScenarioRequest || sc == ScenarioBacklog) {
		return "one receiving agent: a group would read the same consumers"
	}
	return ""
}

func runOne(ctx context.Context, env *runEnv, sc, impl string) (*measurement, error) {
	agents := map[string]int{Scenario1Agent: 1, Scenario10Agents: 10, Scenario100Agents: 100}
	if c := env.cfg.maxAgents; c > 0 {
		for sc, n := range agents {
			agents[sc] = min(n, c)
		}
	}
	switch impl {
	case ImplRaw:
		switch sc {
		case ScenarioRequest:
			return rawRequest(ctx, env)
		case ScenarioBacklog:
			return rawBacklog(ctx, env)
		default:
			return rawThroughput(ctx, env, agents[sc])
		}
	case ImplRawMesh:
		return rawMeshThroughput(ctx, env, agents[sc])
	case ImplAgentkit, ImplAgentkitBatch:
		switch sc {
		case ScenarioRequest:
			return agentkitRequest(ctx, env)
		case ScenarioBacklog:
			return agentkitBacklog(ctx, env)
		default:
			return agentkitThroughput(ctx, env, agents[sc], impl == ImplAgentkitBatch, false)
		}
	case ImplGroup, ImplGroupBatch:
		return agentkitThroughput(ctx, env, agents[sc], impl == ImplGroupBatch, true)
	}
	for _, o := range env.cfg.others {
		if o.name == impl {
			return o.run(ctx, env, sc, agents[sc])
		}
	}
	return nil, fmt.Errorf("unknown implementation %q", impl)
}

// runEnv is what one run needs.
type runEnv struct {
	cfg      Config
	id       string // unique per run: stream, prefix and topic names derive from it
	payload  []byte
	progress *progress
}

func makePayload(n int) []byte {
	return []byte(`{"data":"` + strings.Repeat("x", n-11) + `"}`)
}

// measurement collects latencies until want samples are in.
type measurement struct {
	want    int
	lat     []int64 // nanoseconds, indexed by arrival
	next    atomic.Int64
	done    chan struct{}
	once    sync.Once
	start   time.Time
	elapsed time.Duration
	n       int
	seen    sync.Map // dedup of redelivered ids, when keyed
}

func newMeasurement(want int) *measurement {
	return &measurement{want: want, lat: make([]int64, want), done: make(chan struct{})}
}

// record adds one latency sample; the want-th closes done.
func (m *measurement) record(d time.Duration) {
	i := m.next.Add(1) - 1
	if int(i) < m.want {
		m.lat[i] = int64(d)
	}
	if int(i) == m.want-1 {
		m.once.Do(func() { m.elapsed = time.Since(m.start); close(m.done) })
	}
}

// recordOnce records d the first time key is seen (redeliveries are not
// counted twice).
func (m *measurement) recordOnce(key string, d time.Duration) {
	if _, dup := m.seen.LoadOrStore(key, struct{}{}); !dup {
		m.record(d)
	}
}

func (m *measurement) count() int64 { return min(m.next.Load(), int64(m.want)) }

// wait waits until every sample is in.
func (m *measurement) wait(ctx context.Context) error {
	select {
	case <-m.done:
		m.n = m.want
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%d of %d messages handled: %w", m.count(), m.want, ctx.Err())
	}
}

// percentile returns the p-th percentile latency in milliseconds.
func (m *measurement) percentile(p int) float64 {
	if m.n == 0 {
		return 0
	}
	s := slices.Clone(m.lat[:m.n])
	slices.Sort(s)
	i := (len(s)*p + 99) / 100
	i = min(max(i-1, 0), len(s)-1)
	return float64(s[i]) / 1e6
}

// progress shows a run's progress. On a terminal it is one line,
// "<label> [====      ] 1234/20000", redrawn in place 4 times a second.
// Anywhere else (a log file, a CI console, a pipe) carriage returns would
// pile up into one unreadable line, so it writes plain lines: one as the
// run starts, one every plainEvery while it lasts (so a slow setup still
// shows signs of life) and one as it ends.
type progress struct {
	w     io.Writer
	tty   bool
	label string
	cur   atomic.Pointer[measurement]
	quit  chan struct{}
	wg    sync.WaitGroup
}

// plainEvery is how often plain progress writes a line: rarely enough
// that a log holds a few lines per run, not hundreds.
const plainEvery = 5 * time.Second

// isTerminal reports whether w is a character device, such as a terminal,
// where redrawing a line in place works.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

func startProgress(w io.Writer, tty bool, label string) *progress {
	p := &progress{w: w, tty: tty, label: label, quit: make(chan struct{})}
	if w == nil {
		return p
	}
	every := 250 * time.Millisecond
	if !tty {
		every = plainEvery
		p.draw()
	}
	p.wg.Go(func() {
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-p.quit:
				p.draw()
				if tty {
					fmt.Fprintln(p.w)
				}
				return
			case <-t.C:
				p.draw()
			}
		}
	})
	return p
}

func (p *progress) track(m *measurement) { p.cur.Store(m) }

func (p *progress) draw() {
	m := p.cur.Load()
	switch {
	case !p.tty && m == nil:
		fmt.Fprintf(p.w, "%s: setting up\n", p.label)
	case !p.tty:
		fmt.Fprintf(p.w, "%s: %d/%d\n", p.label, m.count(), m.want)
	case m == nil:
		fmt.Fprintf(p.w, "\r%-45s setting up", p.label)
	default:
		const width = 30
		n := m.count()
		filled := int(n * width / int64(max(m.want, 1)))
		fmt.Fprintf(p.w, "\r%-45s [%s%s] %d/%d   ", p.label, strings.Repeat("=", filled), strings.Repeat(" ", width-filled), n, m.want)
	}
}

func (p *progress) stop() {
	close(p.quit)
	p.wg.Wait()
}

// senders is how many goroutines concurrently runs send from: enough to
// keep the stream busy when every send waits for its stream ack.
const senders = 64

// concurrently calls send(i) for i in [0, n) from senders goroutines and
// returns the first error; a goroutine stops at its first error.
func concurrently(n int, send func(i int) error) error {
	var wg sync.WaitGroup
	var next atomic.Int64
	errs := make(chan error, senders)
	for range senders {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(n) {
					return
				}
				if err := send(int(i)); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}
