// Package version says which build of klbr this is.
package version

import "runtime/debug"

// Version is set at link time (-ldflags "-X github.com/klbr-dev/klbr/internal/version.Version=…").
var Version = "dev"

// Revision is the VCS revision the binary was built from, or "unknown".
func Revision() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" {
				return s.Value
			}
		}
	}
	return "unknown"
}
