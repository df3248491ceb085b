// Package datadir operates on a klbr data directory as a whole: online
// backup with a manifest of hashes, restore into an empty directory,
// consistency check, garbage collection under retention settings, and
// import from another deployment or from the previous runtime's files.
// The database parts go through package store (SQLite lives there); this
// package owns the files around it.
package datadir
