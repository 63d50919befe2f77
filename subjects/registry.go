package subjects

import (
	"fmt"
	"strings"
)

// The keys of the registry bucket ([Scheme.RegistryBucket]) name what they
// hold in their first token.
const (
	// KeyInstance is an agent instance's record: "agent.<agent>.<instance>".
	KeyInstance = "agent"
	// KeyHealth is the degraded mark senders set on an agent: "health.<agent>".
	KeyHealth = "health"
	// KeyUnavailable is the unavailable mark set on an agent that stopped
	// answering: "unavailable.<agent>".
	KeyUnavailable = "unavailable"
	// KeyHost is a hosting process's record, which renews the liveness of
	// the group members it runs: "host.<group>.<instance>".
	KeyHost = "host"
)

// RegistryKey is a parsed key of the registry bucket.
type RegistryKey struct {
	Kind     string // KeyInstance, KeyHealth, KeyUnavailable or KeyHost
	Agent    string // not for KeyHost
	Instance string // KeyInstance and KeyHost only
	Group    string // KeyHost only
}

// InstanceKey returns the registry key of an instance of agent.
func InstanceKey(agent, instance string) (string, error) {
	if err := firstErr(ValidateToken("agent id", agent), ValidateToken("instance", instance)); err != nil {
		return "", err
	}
	return KeyInstance + "." + agent + "." + instance, nil
}

// HostKey returns the registry key of the record of instance of group,
// the process hosting the group's members.
func HostKey(group, instance string) (string, error) {
	if err := firstErr(ValidateToken("group", group), ValidateToken("instance", instance)); err != nil {
		return "", err
	}
	return KeyHost + "." + group + "." + instance, nil
}

// InstancesFilter returns the key filter matching every instance of agent.
func InstancesFilter(agent string) (string, error) {
	if err := ValidateToken("agent id", agent); err != nil {
		return "", err
	}
	return KeyInstance + "." + agent + ".*", nil
}

// MarkKey returns the registry key of a mark (KeyHealth or KeyUnavailable)
// on agent.
func MarkKey(kind, agent string) (string, error) {
	if err := firstErr(oneOf("mark", kind, []string{KeyHealth, KeyUnavailable}), ValidateToken("agent id", agent)); err != nil {
		return "", err
	}
	return kind + "." + agent, nil
}

// MarksFilter returns the key filter matching every mark of kind.
func MarksFilter(kind string) (string, error) {
	if err := oneOf("mark", kind, []string{KeyHealth, KeyUnavailable}); err != nil {
		return "", err
	}
	return kind + ".*", nil
}

// ParseRegistryKey splits a key built by [InstanceKey], [MarkKey] or [HostKey].
// Errors match [ErrInvalidSubject].
func ParseRegistryKey(key string) (RegistryKey, error) {
	t := strings.Split(key, ".")
	var k RegistryKey
	var err error
	switch {
	case len(t) == 3 && t[0] == KeyInstance:
		k, err = RegistryKey{Kind: KeyInstance, Agent: t[1], Instance: t[2]}, firstErr(ValidateToken("agent id", t[1]), ValidateToken("instance", t[2]))
	case len(t) == 2 && (t[0] == KeyHealth || t[0] == KeyUnavailable):
		k, err = RegistryKey{Kind: t[0], Agent: t[1]}, ValidateToken("agent id", t[1])
	case len(t) == 3 && t[0] == KeyHost:
		k, err = RegistryKey{Kind: KeyHost, Group: t[1], Instance: t[2]}, firstErr(ValidateToken("group", t[1]), ValidateToken("instance", t[2]))
	default:
		return RegistryKey{}, fmt.Errorf("%w: registry key %q is not agent.<agent>.<instance>, health.<agent>, unavailable.<agent> or host.<group>.<instance>", ErrInvalidSubject, key)
	}
	if err != nil {
		return RegistryKey{}, fmt.Errorf("%w: registry key %q: %w", ErrInvalidSubject, key, err)
	}
	return k, nil
}

// KVSubject returns the subject that stores key in KV bucket. A publish to
// it is a put, for writes that need headers the KV API does not set, such
// as a per-key TTL.
func KVSubject(bucket, key string) string { return "$KV." + bucket + "." + key }
