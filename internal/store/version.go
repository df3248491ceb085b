package store

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// ErrSQLiteVersion reports a SQLite runtime without the WAL-reset corruption fix.
var ErrSQLiteVersion = errors.New("sqlite runtime lacks the WAL-reset fix")

// CheckSQLiteVersion accepts a runtime that carries the WAL-reset fix:
// 3.51.3 or later, or the 3.50.7+ and 3.44.6+ backport branches.
func CheckSQLiteVersion(v string) error {
	parts := strings.Split(v, ".")
	if len(parts) != 3 {
		return fmt.Errorf("%w: cannot read version %q", ErrSQLiteVersion, v)
	}
	var n [3]int
	for i, p := range parts {
		x, err := strconv.Atoi(p)
		if err != nil || x < 0 {
			return fmt.Errorf("%w: cannot read version %q", ErrSQLiteVersion, v)
		}
		n[i] = x
	}
	major, minor, patch := n[0], n[1], n[2]
	ok := major > 3 ||
		(major == 3 && (minor > 51 || (minor == 51 && patch >= 3))) ||
		(major == 3 && minor == 50 && patch >= 7) ||
		(major == 3 && minor == 44 && patch >= 6)
	if !ok {
		return fmt.Errorf("%w: found %s, need 3.51.3+ (or 3.50.7+, 3.44.6+); rebuild klbr-core without the libsqlite3 tag so the bundled SQLite is used", ErrSQLiteVersion, v)
	}
	return nil
}
