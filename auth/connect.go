package auth

import (
	"bytes"
	"fmt"
	"os"

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

// SeedFileOptions returns the nats.Options that authenticate with the nkey
// seed file at path (nats.NkeyOptionFromSeed: the seed is read from the
// file for each signature and not kept, so a rotated file takes effect at
// the next reconnect). For a file [Bundle.WriteDir] wrote, which records
// the user's inbox, they also set that private inbox prefix, as
// [Credentials.Options] does. The connection name is left to the caller.
func SeedFileOptions(path string) ([]nats.Option, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("auth: %w", err)
	}
	inbox := headerValue(data, headerInbox)
	clear(data)
	o, err := nats.NkeyOptionFromSeed(path)
	if err != nil {
		return nil, fmt.Errorf("auth: %s: %w", path, err)
	}
	opts := []nats.Option{o}
	if inbox != "" {
		opts = append(opts, nats.CustomInboxPrefix(inbox))
	}
	return opts, nil
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

// headerValue returns the value of the comment line of data that starts
// with header, or "". It reads the lines as bytes, so no string of the
// seed line is made (one could not be wiped).
func headerValue(data []byte, header string) string {
	for line := range bytes.Lines(data) {
		if v, ok := bytes.CutPrefix(bytes.TrimSpace(line), []byte(header)); ok {
			return string(v)
		}
	}
	return ""
}
