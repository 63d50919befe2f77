package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/auth"
)

// reloadHint says whether the server must reload its configuration for
// the authorization written to confPath (was before, now after) to apply:
// the server reads it only at start and on reload, and until then refuses
// the new keys as an "Authorization Violation" that names no cause.
func reloadHint(w io.Writer, confPath, before, after string) {
	abs, err := filepath.Abs(confPath)
	if err != nil {
		abs = confPath
	}
	switch {
	case before == after:
		fmt.Fprintln(w, "server authorization unchanged: nothing to reload")
	case before == "":
		fmt.Fprintf(w, "new server authorization: include %s from the server's configuration file, then start the server,\n"+
			"or reload a running one: nats-server --signal reload (kill -HUP <pid>)\n", abs)
	default:
		fmt.Fprintf(w, "server authorization changed: reload the server so it applies %s:\n"+
			"  nats-server --signal reload   (or kill -HUP <pid>)\n"+
			"until then the server refuses the changed keys (Authorization Violation)\n", abs)
	}
}

func (a *app) authCmd() *cobra.Command {
	var (
		out          string
		topics       []string
		registration bool
		payloads     bool
		provision    bool
		rotate       bool
	)
	cmd := &cobra.Command{
		Use:   "auth AGENT...",
		Short: "Generate per-agent credentials and the server's authorization",
		Long: `auth writes, into --out, the NATS server authorization (server-auth.conf:
account MESH with one nkey user per agent, the ack monitor and an admin) and
one seed file per user (<name>.nk, mode 0600). Each agent may publish only
with itself as the sender token of the subject scheme, pull and ack only its
own consumers, and use only its private inbox prefix _INBOX_<agent>; it
cannot create or delete streams or consumers. With --provision, auth also
connects (as an administrator: --server and --creds, e.g. the admin.nk of an
earlier run; it may be in --out, which is rewritten once connected) and creates the message
stream and every agent's consumers, which the agents then bind to with
agentkit.WithProvisioning(false).

Seeds already in --out are kept, so running auth again (to add an agent, a
topic or a right) does not lock out users the server already knows; only new
users get new keys. --rotate replaces every seed. Whenever server-auth.conf
changes, the server enforces it only after it reloads its configuration
(nats-server --signal reload): auth says so. Until then new users, and with
--rotate everyone, get "Authorization Violation".

Topics: --topic AGENT=TOPIC (repeatable) adds TOPIC to AGENT's consumers.` + exitCodesHelp,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			specs := make([]auth.AgentSpec, len(args))
			index := map[string]int{}
			for i, id := range args {
				specs[i], index[id] = auth.AgentSpec{ID: id}, i
			}
			for _, t := range topics {
				id, topic, ok := strings.Cut(t, "=")
				i, known := index[id]
				if !ok || !known || topic == "" {
					return usageErr(fmt.Errorf("--topic %q: want AGENT=TOPIC for one of the agents", t))
				}
				specs[i].Topics = append(specs[i].Topics, topic)
			}
			b, err := auth.Generate(specs, auth.Options{Scheme: a.scheme(), Registration: registration, Payloads: payloads})
			if err != nil {
				return usageErr(err)
			}
			var js jetstream.JetStream
			ctx, cancel := opTimeout(cmd.Context())
			defer cancel()
			if provision {
				// Connect first: the credentials it connects with may be
				// in out, which WriteDir rewrites.
				var nc *nats.Conn
				if nc, js, err = a.jetStream(ctx, "agentmesh-auth"); err != nil {
					return err
				}
				defer nc.Close()
			}
			kept := 0
			if !rotate {
				names, err := b.KeepSeeds(out)
				if err != nil {
					return fmt.Errorf("%w (--rotate replaces every seed)", err)
				}
				kept = len(names)
			}
			confPath := filepath.Join(out, auth.ServerConfigFile)
			before, _ := os.ReadFile(confPath)
			if err := b.WriteDir(out); err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "wrote %s and %d credentials (%d agents, monitor %q, admin %q): %d kept, %d new\n",
				confPath, len(b.Users), len(args), b.Monitor().Name, b.Admin().Name, kept, len(b.Users)-kept)
			reloadHint(w, confPath, string(before), b.ServerConfig())
			if !provision {
				return nil
			}
			// The consumers as agents configured from the same file would
			// make them (config.AgentOptions).
			policies := make(map[wire.Priority]agentkit.DeliveryPolicy, len(wire.Priorities))
			for _, p := range wire.Priorities {
				policies[p] = a.cfg.Agent.Policy(p)
			}
			if err := auth.Provision(ctx, js, a.scheme(), specs, auth.ProvisionOptions{
				Replicas: a.cfg.Mesh.Replicas, Registry: registration, Payloads: payloads,
				Policies: policies, SampleFrequency: strconv.Itoa(a.cfg.Monitor.SampleFrequency),
			}); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "provisioned stream %s and %d consumers\n", a.scheme().Stream(), 5*len(args))
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&out, "out", "auth", "directory to write the authorization and credentials to")
	f.StringArrayVar(&topics, "topic", nil, "AGENT=TOPIC: a topic the agent consumes (repeatable)")
	f.BoolVar(&registration, "registration", false, "grant the registry rights agentkit's registration needs (see the auth package doc for what they give away)")
	f.BoolVar(&payloads, "payloads", false, "grant access to the object store of large envelopes")
	f.BoolVar(&provision, "provision", false, "also create the stream and the agents' consumers on the server")
	f.BoolVar(&rotate, "rotate", false, "replace every seed in --out, not only create the missing ones")
	return cmd
}
