package subjects

import (
	"fmt"
	"strings"
)

// StateKey returns the key of the shared-state bucket ([Scheme.StateBucket])
// that holds entity id of kind: "<kind in lower case>.<id>", e.g. "task.t1".
// Kinds are spelled as the shared state's entity_type (TASK, AGENT, ...);
// which kinds exist is the state store's business, so any token will do.
func StateKey(kind, id string) (string, error) {
	if err := firstErr(ValidateToken("entity kind", kind), ValidateToken("entity id", id)); err != nil {
		return "", err
	}
	return strings.ToLower(kind) + "." + id, nil
}

// StateFilter returns the key filter matching every entity of kind in the
// shared-state bucket.
func StateFilter(kind string) (string, error) {
	if err := ValidateToken("entity kind", kind); err != nil {
		return "", err
	}
	return strings.ToLower(kind) + ".>", nil
}

// ParseStateKey splits a key built by [StateKey] into the entity kind, in
// upper case as entity_type spells it, and the id. Errors match
// [ErrInvalidSubject].
func ParseStateKey(key string) (kind, id string, err error) {
	kind, id, ok := strings.Cut(key, ".")
	if !ok {
		return "", "", fmt.Errorf("%w: state key %q is not <kind>.<id>", ErrInvalidSubject, key)
	}
	if err := firstErr(ValidateToken("entity kind", kind), ValidateToken("entity id", id)); err != nil {
		return "", "", fmt.Errorf("%w: state key %q: %w", ErrInvalidSubject, key, err)
	}
	return strings.ToUpper(kind), id, nil
}

// SessionKey returns the key of the sessions bucket
// ([Scheme.SessionsBucket]) that holds session id: the id itself, which
// must be a token.
func SessionKey(id string) (string, error) {
	if err := ValidateToken("session id", id); err != nil {
		return "", err
	}
	return id, nil
}
