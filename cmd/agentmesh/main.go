// Command agentmesh is the agentmesh CLI: a demo on an embedded NATS
// server, an embedded development stack, sending messages, tracing
// conversations, dead letters, the agent registry, ack statistics,
// benchmarks, the streams' replicas and the migration of a mesh created by
// an older version.
//
//	go run ./cmd/agentmesh demo
//	agentmesh --help
//
// Exit codes: 0 success, 1 failure, 2 usage error; demo also 3, its
// workflows did not end as expected.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/agentmesh-io/agentmesh/cmd/internal/buildinfo"
	"github.com/agentmesh-io/agentmesh/config"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// Exit codes.
const (
	exitOK       = 0
	exitFailure  = 1
	exitUsage    = 2
	exitExpected = 3
)

// exitError carries an exit code with an error.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

func usageErr(err error) error { return &exitError{code: exitUsage, err: err} }

func exitCode(err error) int {
	var ee *exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	if s := err.Error(); strings.HasPrefix(s, "unknown command") || strings.HasPrefix(s, "unknown flag") ||
		strings.HasPrefix(s, "unknown shorthand flag") || strings.Contains(s, "accepts ") || strings.HasPrefix(s, "required flag") {
		return exitUsage
	}
	return exitFailure
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run executes the CLI with args and returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	app := &app{stdout: stdout, stderr: stderr}
	root := app.rootCmd()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return exitOK
	}
	fmt.Fprintln(stderr, "agentmesh:", err)
	return exitCode(err)
}

// app holds what every command shares: the loaded configuration and the
// output streams.
type app struct {
	stdout, stderr io.Writer

	configPath string
	server     string
	creds      string
	cfg        *config.Config
	// serverGiven says the user named a server (flag, NATS_URL or config),
	// so demo uses it instead of an embedded one.
	serverGiven bool
}

// exitCodesHelp ends every command's help; demo adds its own code 3.
const exitCodesHelp = `
Exit codes:
  0  success
  1  failure (connection, server or I/O error)
  2  usage error (unknown command or flag, bad argument, invalid configuration)`

const demoExitCodesHelp = exitCodesHelp + `
  3  the demo's workflows did not end as expected`

func (a *app) rootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "agentmesh",
		Short: "agentmesh: reliable messaging for AI agents over NATS JetStream",
		Long: `agentmesh runs and inspects an agent mesh: a demo on an embedded NATS server,
a development stack, sending messages, tracing conversations, dead letters,
the agent registry, ack statistics, benchmarks, the streams' replicas and
the migration of a mesh created by an older version.

Configuration: defaults < --config FILE (YAML, see deploy/agentmesh.example.yaml)
< AGENTMESH_* environment < NATS_URL / NATS_CREDS < flags.` + exitCodesHelp,
		SilenceUsage:      true,
		SilenceErrors:     true,
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error { return a.load(cmd) },
	}
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error { return usageErr(err) })
	pf := root.PersistentFlags()
	pf.StringVar(&a.configPath, "config", os.Getenv("AGENTMESH_CONFIG"), "configuration file (YAML) [$AGENTMESH_CONFIG]")
	pf.StringVarP(&a.server, "server", "s", "", "NATS server URLs, comma separated [$NATS_URL]")
	pf.StringVar(&a.creds, "creds", "", "NATS credentials file: JWT creds or an nkey seed file such as auth/<user>.nk [$NATS_CREDS]")
	root.Version = buildinfo.Line("agentmesh")
	root.SetVersionTemplate("{{.Version}}\n")
	root.AddCommand(a.versionCmd(), a.demoCmd(), a.upCmd(), a.sendCmd(false), a.sendCmd(true), a.traceCmd(),
		a.dlqCmd(), a.agentsCmd(), a.statsCmd(), a.benchCmd(), a.authCmd(), a.migrateCmd(), a.streamsCmd())
	usageArgs(root)
	return root
}

// usageArgs makes the argument checks of c and its subcommands return
// usage errors (exit 2).
func usageArgs(c *cobra.Command) {
	if check := c.Args; check != nil {
		c.Args = func(cmd *cobra.Command, args []string) error {
			if err := check(cmd, args); err != nil {
				return usageErr(err)
			}
			return nil
		}
	}
	for _, sub := range c.Commands() {
		usageArgs(sub)
	}
}

// load reads the configuration, applies NATS_URL, NATS_CREDS and the
// persistent flags on top, and validates the result.
func (a *app) load(cmd *cobra.Command) error {
	cfg, err := config.Read(a.configPath)
	if err != nil {
		if errors.Is(err, config.ErrInvalid) {
			return usageErr(err)
		}
		return err
	}
	if _, ok := os.LookupEnv(config.EnvPrefix + "NATS_URLS"); ok || a.configPath != "" && len(cfg.NATS.URLs) > 0 && cfg.NATS.URLs[0] != config.Default().NATS.URLs[0] {
		a.serverGiven = true
	}
	if u := os.Getenv("NATS_URL"); u != "" {
		cfg.NATS.URLs, a.serverGiven = splitURLs(u), true
	}
	if c := os.Getenv("NATS_CREDS"); c != "" {
		cfg.NATS.Creds = c
	}
	if a.server != "" {
		cfg.NATS.URLs, a.serverGiven = splitURLs(a.server), true
	}
	if a.creds != "" {
		cfg.NATS.Creds = a.creds
	}
	if err := cfg.Validate(); err != nil {
		return usageErr(err)
	}
	a.cfg = cfg
	return nil
}

func splitURLs(s string) []string {
	var out []string
	for u := range strings.SplitSeq(s, ",") {
		if u = strings.TrimSpace(u); u != "" {
			out = append(out, u)
		}
	}
	return out
}

// connect dials the configured servers. A server that does not answer is
// most often one not started yet: the error says how to start one.
func (a *app) connect(ctx context.Context, name string) (*nats.Conn, error) {
	n := a.cfg.NATS
	n.Name = name
	ctx, cancel := context.WithTimeout(ctx, n.ConnectTimeout)
	defer cancel()
	nc, err := n.Connect(ctx)
	var ce *config.ConnectError
	if errors.As(err, &ce) && errors.Is(err, nats.ErrNoServers) {
		return nil, fmt.Errorf("%w; start one with `agentmesh up`, or name one with --server or NATS_URL", err)
	}
	return nc, err
}

// jetStream dials and returns a JetStream context; close nc when done.
func (a *app) jetStream(ctx context.Context, name string) (*nats.Conn, jetstream.JetStream, error) {
	nc, err := a.connect(ctx, name)
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, js, nil
}

// watchedJetStream is jetStream for a command that reports permission
// denials (see watchDenials): ctx ends at the first denial; done stops
// the watch and closes the connection.
func (a *app) watchedJetStream(ctx context.Context, name string) (context.Context, jetstream.JetStream, func(), error) {
	nc, js, err := a.jetStream(ctx, name)
	if err != nil {
		return ctx, nil, nil, err
	}
	ctx, stop := watchDenials(ctx, nc)
	return ctx, js, func() { stop(); nc.Close() }, nil
}

func (a *app) scheme() subjects.Scheme {
	s, _ := a.cfg.Scheme() // validated in load
	return s
}

// opTimeout bounds one CLI operation that has no natural end.
func opTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, 30*time.Second)
}
