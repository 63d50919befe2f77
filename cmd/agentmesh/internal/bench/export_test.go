package bench

// CapAgents caps the receivers of c's N-agents scenarios at n.
func CapAgents(c *Config, n int) { c.maxAgents = n }
