// Package citest holds the one rule tests share about missing tools: skip
// with the reason on a developer's machine, fail under CI=true, so CI can
// never pass by skipping.
package citest

import (
	"os"
	"testing"
)

// SkipOrFail skips t, saying why; under CI=true it fails t instead.
func SkipOrFail(t testing.TB, reason string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("CI=true and %s", reason)
	}
	t.Skip(reason)
}
