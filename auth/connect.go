package auth

import (
	"fmt"

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
		nats.Name(c.Name),
	}, nil
}
