package auth

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/nats-io/nkeys"

	"github.com/agentmesh-io/agentmesh/subjects"
)

// Default names used when [Options] leaves them empty.
const (
	DefaultAccount   = "MESH"       // the account every mesh user belongs to
	DefaultMonitorID = "ackmonitor" // the ack monitor's user and sender id
	DefaultAdminName = "admin"      // the administrator's user name
)

// ServerConfigFile is the name [Bundle.WriteDir] gives the server
// authorization; include it from nats-server.conf.
const ServerConfigFile = "server-auth.conf"

// CredentialsExt is the extension of the per-user seed files
// [Bundle.WriteDir] writes: "<name>.nk".
const CredentialsExt = ".nk"

// ErrInvalidSpec is matched (errors.Is) by every error [Generate] returns
// for bad input; the message names the offending agent.
var ErrInvalidSpec = errors.New("auth: invalid spec")

// AgentSpec describes one agent to give credentials to.
type AgentSpec struct {
	// ID is the agent id, a subject token ([A-Za-z0-9_-]{1,64}). It is the
	// user's name, the only sender token it may publish as, the prefix of
	// its consumers and of its inbox.
	ID string
	// Topics are the topics the agent consumes. They do not change its
	// permissions (publishing is allowed on any topic, as this agent);
	// [Provision] writes them into the filters of the agent's consumers,
	// because an isolated agent cannot update its consumers itself.
	Topics []string
}

// Options tune [Generate]. The zero value is usable.
type Options struct {
	// Scheme names subjects, streams and buckets. Default: subjects.Default.
	Scheme subjects.Scheme
	// Account is the account all users live in. Default: DefaultAccount.
	Account string
	// MonitorID is the ack monitor's user name and sender id. Default:
	// DefaultMonitorID. It must not be one of the agents.
	MonitorID string
	// AdminName is the administrator's user name. Default: DefaultAdminName.
	AdminName string
	// Registration grants agents the registry rights agentkit's
	// registration needs (WithRegistration(true), its default): write
	// their own instance records, write any agent's health mark, watch
	// the whole bucket. Default false: agents must run with
	// agentkit.WithRegistration(false). See the package documentation for
	// what these rights give away.
	Registration bool
	// Payloads grants agents read and write access to the object store of
	// large envelopes (agentkit's claim check). Default false: envelopes
	// must fit the server's max payload. Every agent can then read every
	// offloaded envelope, of any sender and receiver.
	Payloads bool
}

func (o *Options) setDefaults() {
	if o.Scheme.Prefix() == "" {
		o.Scheme = subjects.Default
	}
	if o.Account == "" {
		o.Account = DefaultAccount
	}
	if o.MonitorID == "" {
		o.MonitorID = DefaultMonitorID
	}
	if o.AdminName == "" {
		o.AdminName = DefaultAdminName
	}
}

// Role says what a [User] is for.
type Role string

// The roles.
const (
	RoleAgent   Role = "agent"   // one agent, isolated from the others
	RoleMonitor Role = "monitor" // the ack monitor
	RoleAdmin   Role = "admin"   // provisioning and operations: no restriction
)

// User is one NATS user of the generated authorization.
type User struct {
	Name        string       // the agent id, the monitor id or the admin name
	Role        Role         // what the user is for
	Spec        AgentSpec    // the agent's spec; only for RoleAgent
	Permissions *Permissions // nil for the admin: everything is allowed
	Credentials Credentials  // the user's nkey pair
}

// Bundle is the generated authorization of one mesh: the users, their
// permissions and their secrets. It holds nkey seeds: keep it, and the
// files [Bundle.WriteDir] writes, secret.
type Bundle struct {
	Options Options // with defaults applied
	Users   []User  // the agents in the order given, then the monitor, then the admin
}

// Generate validates specs and returns a bundle with a fresh nkey pair
// and the permissions of every agent, of the monitor and of the admin.
// Errors match [ErrInvalidSpec] and name the bad agent.
func Generate(specs []AgentSpec, opts Options) (*Bundle, error) {
	opts.setDefaults()
	for _, f := range []struct{ what, v string }{
		{"account", opts.Account}, {"monitor id", opts.MonitorID}, {"admin name", opts.AdminName},
	} {
		if err := subjects.ValidateToken(f.what, f.v); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidSpec, err)
		}
	}
	if opts.AdminName == opts.MonitorID {
		return nil, fmt.Errorf("%w: admin name and monitor id are both %q", ErrInvalidSpec, opts.AdminName)
	}
	if len(specs) == 0 {
		return nil, fmt.Errorf("%w: no agents", ErrInvalidSpec)
	}
	seen := map[string]bool{opts.MonitorID: true, opts.AdminName: true}
	b := &Bundle{Options: opts}
	for i, sp := range specs {
		if err := subjects.ValidateToken("agent id", sp.ID); err != nil {
			return nil, fmt.Errorf("%w: agent %d %q: %w", ErrInvalidSpec, i, sp.ID, err)
		}
		if seen[sp.ID] {
			return nil, fmt.Errorf("%w: agent %q: id used twice (or by the monitor or admin)", ErrInvalidSpec, sp.ID)
		}
		seen[sp.ID] = true
		for _, t := range sp.Topics {
			if err := subjects.ValidateToken("topic", t); err != nil {
				return nil, fmt.Errorf("%w: agent %q: %w", ErrInvalidSpec, sp.ID, err)
			}
		}
		sp.Topics = slices.Clone(sp.Topics)
		u, err := newUser(sp.ID, RoleAgent, agentPermissions(opts.Scheme, sp.ID, opts))
		if err != nil {
			return nil, err
		}
		u.Spec = sp
		b.Users = append(b.Users, u)
	}
	mon, err := newUser(opts.MonitorID, RoleMonitor, monitorPermissions(opts.Scheme, opts.MonitorID))
	if err != nil {
		return nil, err
	}
	adm, err := newUser(opts.AdminName, RoleAdmin, nil)
	if err != nil {
		return nil, err
	}
	b.Users = append(b.Users, mon, adm)
	return b, nil
}

func newUser(name string, role Role, p *Permissions) (User, error) {
	kp, err := nkeys.CreateUser()
	if err != nil {
		return User{}, fmt.Errorf("auth: nkey for %q: %w", name, err)
	}
	pub, err := kp.PublicKey()
	if err != nil {
		return User{}, fmt.Errorf("auth: nkey for %q: %w", name, err)
	}
	seed, err := kp.Seed()
	if err != nil {
		return User{}, fmt.Errorf("auth: nkey for %q: %w", name, err)
	}
	return User{Name: name, Role: role, Permissions: p,
		Credentials: Credentials{Name: name, PublicKey: pub, Seed: slices.Clone(seed)}}, nil
}

// User returns the user called name (an agent id, the monitor id or the
// admin name).
func (b *Bundle) User(name string) (User, bool) {
	i := slices.IndexFunc(b.Users, func(u User) bool { return u.Name == name })
	if i < 0 {
		return User{}, false
	}
	return b.Users[i], true
}

// Agents returns the agent users, in the order given to [Generate].
func (b *Bundle) Agents() []User {
	return slices.DeleteFunc(slices.Clone(b.Users), func(u User) bool { return u.Role != RoleAgent })
}

// Specs returns the agents' specs, in the order given to [Generate]; pass
// them to [Provision].
func (b *Bundle) Specs() []AgentSpec {
	var specs []AgentSpec
	for _, u := range b.Agents() {
		specs = append(specs, u.Spec)
	}
	return specs
}

// Monitor returns the monitor user.
func (b *Bundle) Monitor() User { u, _ := b.User(b.Options.MonitorID); return u }

// Admin returns the admin user.
func (b *Bundle) Admin() User { u, _ := b.User(b.Options.AdminName); return u }

// ServerConfig returns the server authorization in nats-server
// configuration syntax: an accounts block with the account (JetStream
// enabled) and one nkey user per agent, the monitor and the admin, each
// with its permissions. It holds public keys only. Include it from a
// server's configuration file, or apply it to an embedded server's
// options with (*server.Options).ProcessConfigString, which, unlike
// accounts built in Go, enables JetStream for the account.
func (b *Bundle) ServerConfig() string {
	var w strings.Builder
	w.WriteString("# agentmesh authorization, generated by auth.Generate.\n")
	w.WriteString("# Public keys only; the seeds are in the <user>" + CredentialsExt + " files.\n")
	fmt.Fprintf(&w, "accounts {\n  %s {\n    jetstream: enabled\n    users: [\n", b.Options.Account)
	for _, u := range b.Users {
		fmt.Fprintf(&w, "      # %s %s\n", u.Role, u.Name)
		fmt.Fprintf(&w, "      {\n        nkey: %q\n", u.Credentials.PublicKey)
		if p := u.Permissions; p != nil {
			w.WriteString("        permissions: {\n")
			writeList(&w, "publish", p.Publish)
			writeList(&w, "subscribe", p.Subscribe)
			w.WriteString("        }\n")
		}
		w.WriteString("      }\n")
	}
	w.WriteString("    ]\n  }\n}\n")
	return w.String()
}

func writeList(w *strings.Builder, name string, subs []string) {
	fmt.Fprintf(w, "          %s: { allow: [\n", name)
	for _, s := range subs {
		fmt.Fprintf(w, "            %q\n", s)
	}
	w.WriteString("          ] }\n")
}

// WriteDir writes the server authorization (ServerConfigFile, mode 0644:
// public keys only) and one seed file per user ("<name>.nk", mode 0600)
// into dir, creating it (0700) if needed. Existing files are replaced.
// Hand each seed file to its user only: admin.nk opens everything.
func (b *Bundle) WriteDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("auth: %w", err)
	}
	if err := writeFile(filepath.Join(dir, ServerConfigFile), []byte(b.ServerConfig()), 0o644); err != nil {
		return err
	}
	for _, u := range b.Users {
		if err := writeFile(filepath.Join(dir, u.Name+CredentialsExt), u.Credentials.fileContents(b.Options.Account), 0o600); err != nil {
			return err
		}
	}
	return nil
}

// KeepSeeds replaces the fresh nkey pair of every user that already has
// a seed file in dir ("<name>.nk", as [Bundle.WriteDir] writes it) with
// that file's, and returns the names of the users kept. Regenerating the
// authorization (new agents, changed topics or rights) then leaves the
// running users' credentials, and the keys the server knows for them,
// as they were; only new users get new keys. A missing dir or file is
// not an error; an unreadable seed file, or one of another user, is.
func (b *Bundle) KeepSeeds(dir string) ([]string, error) {
	var kept []string
	for i := range b.Users {
		u := &b.Users[i]
		path := filepath.Join(dir, u.Name+CredentialsExt)
		if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
			continue
		}
		c, err := LoadCredentials(path)
		if err != nil {
			return nil, err
		}
		if c.Name != u.Name {
			return nil, fmt.Errorf("auth: %s holds the seed of user %q, not %q", path, c.Name, u.Name)
		}
		u.Credentials = c
		kept = append(kept, u.Name)
	}
	return kept, nil
}

// writeFile replaces path with data through a temporary file, so a reader
// never sees half a file and the mode holds even if path existed.
func writeFile(path string, data []byte, mode os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".auth-*")
	if err != nil {
		return fmt.Errorf("auth: %w", err)
	}
	defer os.Remove(tmp.Name()) // no-op after the rename
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return fmt.Errorf("auth: %w", err)
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("auth: write %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("auth: write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("auth: %w", err)
	}
	return nil
}

// Header keys of a seed file, read back by [LoadCredentials].
const (
	headerUser  = "# user: "
	headerInbox = "# inbox: "
)

func (c Credentials) fileContents(account string) []byte {
	var w bytes.Buffer
	fmt.Fprintf(&w, "# agentmesh nkey seed of user %q in account %s. Keep it secret.\n", c.Name, account)
	w.WriteString("# Connect with auth.LoadCredentials(file) and Credentials.Options(), or with\n")
	fmt.Fprintf(&w, "# nats.NkeyOptionFromSeed(file) plus nats.CustomInboxPrefix(%q).\n", c.inbox())
	w.WriteString(headerUser + c.Name + "\n")
	w.WriteString(headerInbox + c.inbox() + "\n")
	w.Write(c.Seed)
	w.WriteString("\n")
	return w.Bytes()
}

// LoadCredentials reads a seed file written by [Bundle.WriteDir].
func LoadCredentials(path string) (Credentials, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Credentials{}, fmt.Errorf("auth: %w", err)
	}
	defer clear(data)
	var c Credentials
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case strings.HasPrefix(line, headerUser):
			c.Name = strings.TrimPrefix(line, headerUser)
		case strings.HasPrefix(line, headerInbox):
			c.InboxPrefix = strings.TrimPrefix(line, headerInbox)
		}
	}
	kp, err := nkeys.ParseDecoratedNKey(data)
	if err != nil {
		return Credentials{}, fmt.Errorf("auth: %s: %w", path, err)
	}
	defer kp.Wipe()
	seed, err := kp.Seed()
	if err != nil {
		return Credentials{}, fmt.Errorf("auth: %s: %w", path, err)
	}
	c.Seed = slices.Clone(seed) // Wipe overwrites the key pair's own copy
	if c.PublicKey, err = kp.PublicKey(); err != nil || !nkeys.IsValidPublicUserKey(c.PublicKey) {
		return Credentials{}, fmt.Errorf("auth: %s: not a user nkey seed", path)
	}
	if c.Name == "" {
		c.Name = strings.TrimSuffix(filepath.Base(path), CredentialsExt)
	}
	if err := subjects.ValidateToken("user", c.Name); err != nil {
		return Credentials{}, fmt.Errorf("auth: %s: %w", path, err)
	}
	if c.InboxPrefix == InboxPrefix(c.Name) {
		c.InboxPrefix = "" // the default
	}
	return c, nil
}
