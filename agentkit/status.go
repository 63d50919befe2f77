package agentkit

import (
	"time"

	"github.com/agentmesh-io/agentmesh/agentkit/registry"
)

// AgentStatus is an agent's lifecycle state in the registry; see
// [registry.Status].
type AgentStatus = registry.Status

// The lifecycle states, those of package registry.
const (
	StatusInitializing = registry.StatusInitializing
	StatusReady        = registry.StatusReady
	StatusBusy         = registry.StatusBusy
	StatusStopping     = registry.StatusStopping
	StatusStopped      = registry.StatusStopped
	StatusUnavailable  = registry.StatusUnavailable
)

// Capability is something an agent can do; see [registry.Capability].
type Capability = registry.Capability

// registryTTLFloor is the smallest per-key TTL the server accepts: three
// heartbeats must span more.
const registryTTLFloor = time.Second
