package kernel

import (
	"slices"
	"strings"
)

// allowedEnv are the variables the child sees, besides every KLBR_* and --keep-env names.
var allowedEnv = []string{
	"PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "USER", "LOGNAME", "TMPDIR",
	"PYTHONPATH", "PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED", "PYTHONSAFEPATH",
	"PYTHONIOENCODING",
}

// FilterEnv returns the entries of environ ("NAME=value") that the child may see: the
// allowlist, every KLBR_* variable and the names in keep. Order is kept; entries without
// '=' are dropped.
func FilterEnv(environ, keep []string) []string {
	out := make([]string, 0, len(environ))
	for _, kv := range environ {
		name, _, ok := strings.Cut(kv, "=")
		if !ok || name == "" {
			continue
		}
		if strings.HasPrefix(name, "KLBR_") || slices.Contains(allowedEnv, name) || slices.Contains(keep, name) {
			out = append(out, kv)
		}
	}
	return out
}
