package auth

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// Credentials are one user's secret: an nkey seed. The server knows only
// the public key and checks a signature of a random nonce at connect time,
// so the seed never crosses the wire.
type Credentials struct {
	// Name is the user: an agent id, the monitor id or the admin name.
	Name string
	// PublicKey is the user's public nkey ("U..."), the one the server
	// configuration lists.
	PublicKey string
	// Seed is the private nkey seed ("SU..."). Keep it secret.
	Seed []byte
	// InboxPrefix is the prefix of the user's reply subjects. Default:
	// InboxPrefix(Name), the only inbox an agent may subscribe to.
	InboxPrefix string
}

func (c Credentials) inbox() string {
	if c.InboxPrefix != "" {
		return c.InboxPrefix
	}
	return InboxPrefix(c.Name)
}

// Options returns the nats.Options that connect as c: nkey authentication
// signed with the seed, the private inbox prefix (without it every request
// and JetStream call of an agent fails, because its permissions allow
// subscribing only below that prefix) and the connection name. Add TLS,
// URLs and an error handler (see [Watcher]) as needed.
func (c Credentials) Options() ([]nats.Option, error) {
	opts, err := c.authOptions()
	if err != nil {
		return nil, err
	}
	return append(opts, nats.Name(c.Name)), nil
}

// authOptions are [Credentials.Options] without the connection name.
func (c Credentials) authOptions() ([]nats.Option, error) {
	kp, err := nkeys.FromSeed(c.Seed)
	if err != nil {
		return nil, fmt.Errorf("auth: credentials of %q: %w", c.Name, err)
	}
	pub, err := kp.PublicKey()
	if err != nil {
		return nil, fmt.Errorf("auth: credentials of %q: %w", c.Name, err)
	}
	if !nkeys.IsValidPublicUserKey(pub) {
		return nil, fmt.Errorf("auth: credentials of %q: not a user nkey", c.Name)
	}
	return []nats.Option{
		nats.Nkey(pub, kp.Sign),
		nats.CustomInboxPrefix(c.inbox()),
	}, nil
}

// SeedFileOptions returns the nats.Options that authenticate with the nkey
// seed file at path. For a file [Bundle.WriteDir] wrote (it records the
// user's inbox), they also set the user's private inbox prefix, as
// [Credentials.Options] does; any other seed file gets nkey authentication
// only. The connection name is left to the caller.
func SeedFileOptions(path string) ([]nats.Option, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("auth: %w", err)
	}
	generated := hasHeader(data, headerInbox)
	clear(data)
	if !generated {
		o, err := nats.NkeyOptionFromSeed(path)
		if err != nil {
			return nil, fmt.Errorf("auth: %s: %w", path, err)
		}
		return []nats.Option{o}, nil
	}
	c, err := LoadCredentials(path)
	if err != nil {
		return nil, err
	}
	defer clear(c.Seed)
	return c.authOptions()
}

// IsSeedFile reports whether data is an nkey seed file (such as the ones
// [Bundle.WriteDir] writes) rather than a JWT credentials file: it holds a
// seed and no user JWT.
func IsSeedFile(data []byte) bool {
	if bytes.Contains(data, []byte("BEGIN NATS USER JWT")) {
		return false
	}
	kp, err := nkeys.ParseDecoratedNKey(data)
	if err != nil {
		return false
	}
	kp.Wipe()
	return true
}

// hasHeader reports whether a line of data starts with header.
func hasHeader(data []byte, header string) bool {
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		if strings.HasPrefix(strings.TrimSpace(sc.Text()), header) {
			return true
		}
	}
	return false
}
