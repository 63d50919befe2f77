package ackmonitor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/agentkit/protocol"
	"github.com/agentmesh-io/agentmesh/agentkit/registry"
)

// ActionEscalation is the action of the envelope the monitor sends to a
// sender's director when a message is exhausted (the specification's
// "escalate to parent director").
const ActionEscalation = protocol.ActionEscalation

// Escalation is the payload of an escalation envelope; the type lives in
// package protocol so directors need not import the monitor.
type Escalation = protocol.Escalation

// DirectorResolver names the director an agent escalates to.
type DirectorResolver interface {
	Director(ctx context.Context, agent string) (string, error)
}

// DirectorFunc adapts a function to [DirectorResolver].
type DirectorFunc func(ctx context.Context, agent string) (string, error)

// Director calls f.
func (f DirectorFunc) Director(ctx context.Context, agent string) (string, error) {
	return f(ctx, agent)
}

// RegistryDirectors resolves directors from the agent registry: the JSON
// field "director" of key <agent> in KV bucket Bucket or, failing that,
// the director the agent's live instances declare ([registry.Director]);
// Default when the bucket, the keys or the field are missing.
type RegistryDirectors struct {
	JS      jetstream.JetStream
	Bucket  string
	Default string

	mu sync.Mutex
	kv jetstream.KeyValue
}

// Director implements [DirectorResolver].
func (r *RegistryDirectors) Director(ctx context.Context, agent string) (string, error) {
	r.mu.Lock()
	kv := r.kv
	r.mu.Unlock()
	if kv == nil {
		var err error
		kv, err = r.JS.KeyValue(ctx, r.Bucket)
		if errors.Is(err, jetstream.ErrBucketNotFound) {
			return r.Default, nil
		}
		if err != nil {
			return "", fmt.Errorf("ackmonitor: registry %s: %w", r.Bucket, err)
		}
		r.mu.Lock()
		r.kv = kv
		r.mu.Unlock()
	}
	// An operator's plain <agent> key names a director for an agent that
	// does not declare one (or is not an agentkit agent).
	if d, err := directorAt(ctx, kv, agent); d != "" || err != nil {
		return d, err
	}
	d, err := registry.Director(ctx, kv, agent)
	if err != nil {
		return "", fmt.Errorf("ackmonitor: registry %s: %w", r.Bucket, err)
	}
	if d != "" {
		return d, nil
	}
	return r.Default, nil
}

// directorAt returns the "director" field of key, or "" when the key or
// the field is missing.
func directorAt(ctx context.Context, kv jetstream.KeyValue, key string) (string, error) {
	e, err := kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("ackmonitor: registry key %s: %w", key, err)
	}
	var rec struct {
		Director string `json:"director"`
	}
	if json.Unmarshal(e.Value(), &rec) != nil {
		return "", nil
	}
	return rec.Director, nil
}
