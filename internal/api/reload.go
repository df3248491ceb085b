package api

// Reloaded is the answer to POST /v1/reload (klbr-core reload, SIGHUP):
// what the reread klbr.toml changed at once, and what changed in the file
// but waits for a restart of klbr-core.
type Reloaded struct {
	Config string `json:"config"` // the file reread
	// Applied names each live setting that changed (e.g. "agent.route: main -> spare").
	Applied []string `json:"applied"`
	// Restart names each changed setting that only a restart applies, and why.
	Restart []string `json:"restart"`
	// Agent is the agent's state after the reload, as status shows it.
	Agent string `json:"agent"`
	// Seconds is how long the reload took.
	Seconds float64 `json:"seconds"`
}
