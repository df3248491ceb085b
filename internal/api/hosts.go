package api

import "github.com/klbr-dev/klbr/internal/hosts"

// Hosts is what GET /v1/hosts answers: each [hosts.NAME], asked now.
type Hosts struct {
	Hosts []HostReport `json:"hosts"`
}

// HostReport is one host as it answered, and what keeps it from running
// klbr's work (problems with warn set only say what is worth a look).
type HostReport struct {
	hosts.Info
	Problems []hosts.Problem `json:"problems"`
}

// Ready reports whether the host can run work: it answered and nothing but
// warnings was found.
func (r HostReport) Ready() bool {
	if !r.Reachable {
		return false
	}
	for _, p := range r.Problems {
		if !p.Warn {
			return false
		}
	}
	return true
}
