package config

import "fmt"

// Storage is the [storage] section: the bound on the data directory
// (database, WAL, artifacts, releases). Zero max_bytes leaves it unbounded
// (the default). Past warn_at of the bound klbr-core runs `gc` by itself;
// at the bound it refuses new artifacts and keeps admitting inputs.
type Storage struct {
	MaxBytes int64   `toml:"max_bytes"` // bytes; 0: unbounded
	WarnAt   float64 `toml:"warn_at"`   // fraction of max_bytes, (0, 1); default 0.8
}

// Storage bounds.
const (
	DefaultStorageWarnAt = 0.8
	// MinStorageBytes is the smallest bound accepted: below it the
	// database alone would pass it.
	MinStorageBytes = 16 << 20
)

// Resolved returns s with an omitted (zero) warn_at at its default.
func (s Storage) Resolved() Storage {
	if s.WarnAt == 0 {
		s.WarnAt = DefaultStorageWarnAt
	}
	return s
}

// WarnBytes is the usage past which klbr-core collects by itself; 0 when
// the data directory is unbounded.
func (s Storage) WarnBytes() int64 {
	r := s.Resolved()
	return int64(float64(r.MaxBytes) * r.WarnAt)
}

// storage checks [storage]. A warn_at written as 0 is refused (0 in a File
// built in code means the default).
func (v *validator) storage(s *Storage) {
	if m := s.MaxBytes; m < 0 || (m > 0 && m < MinStorageBytes) || (m == 0 && v.index.has("storage.max_bytes")) {
		v.fail("storage.max_bytes", fmt.Sprintf("%d is out of range: at least %d (16 MiB), or leave it out for no bound", m, MinStorageBytes), "storage")
	}
	// NaN fails both comparisons, so it is refused too.
	if w := s.WarnAt; !(w > 0 && w < 1) && (w != 0 || v.index.has("storage.warn_at")) {
		v.fail("storage.warn_at", fmt.Sprintf("%v is out of range: a fraction of max_bytes above 0 and below 1 (default %v)", w, DefaultStorageWarnAt), "storage")
	}
}
