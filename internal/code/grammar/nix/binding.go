// Package nix is the Nix grammar for tree-sitter: the generated parser of
// github.com/nix-community/tree-sitter-nix at tag v0.3.0 (commit ea1d87f,
// MIT licence, LICENSE here), copied unchanged into src/. That repository
// publishes no Go binding, so this file is ours; the official grammars of
// the other languages come as Go modules.
package nix

// #cgo CPPFLAGS: -I${SRCDIR}/src
// #cgo CFLAGS: -std=c11 -fPIC -w
// #include "src/parser.c"
// #include "src/scanner.c"
import "C"

import "unsafe"

// Language returns the TSLanguage pointer.
func Language() unsafe.Pointer {
	return unsafe.Pointer(C.tree_sitter_nix())
}
