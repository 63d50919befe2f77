package bench

// CapAgents caps the receivers of c's N-agents scenarios at n.
func CapAgents(c *Config, n int) { c.maxAgents = n }

// WithWatermill adds the Watermill comparison's implementations to c.
func WithWatermill(c *Config) { withWatermill(c) }

// ImplNames lists every implementation c can run, in table order.
func ImplNames(c *Config) []string { return c.implNames() }

// ImplWatermill names the Watermill comparison's default-ack implementation.
const ImplWatermill = implWatermill
