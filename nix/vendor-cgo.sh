#!/usr/bin/env bash
# Completes a `go mod vendor` tree with the C sources the tree-sitter cgo
# packages include from outside their own directories.
#
# `go mod vendor` copies each imported package's own directory and nothing
# else (golang/go#26366), but go-tree-sitter compiles src/lib.c with
# include/ and each official grammar's bindings/go includes ../../src/parser.c
# (tree-sitter-typescript: ../../{typescript,tsx}/src and ../../common). A
# vendored build then fails. This copies every .c and .h file of those
# modules (outside bindings/, tests and examples) from the module cache,
# where `go mod vendor` has just put them, into the vendor tree.
#
# nix/package.nix runs it as buildGoModule's modPostBuild (so it is part of
# the vendorHash), and nix/vendorhash_test.go runs it before hashing.
#
# Usage: vendor-cgo.sh VENDOR_DIR
set -euo pipefail
vendor=$1
cache=$(go env GOMODCACHE)
grep -E '^# github\.com/tree-sitter/[a-z0-9-]+ v' "$vendor/modules.txt" | while read -r _ mod ver _; do
  root="$cache/$mod@$ver"
  if [ ! -d "$root" ]; then
    echo "vendor-cgo: $root is not in the module cache" >&2
    exit 1
  fi
  (cd "$root" && find . \( -path ./bindings -o -path ./test -o -path ./examples -o -path ./node_modules \) -prune \
    -o -type f \( -name '*.c' -o -name '*.h' \) -print) | LC_ALL=C sort | while read -r f; do
    install -D -m 0644 "$root/$f" "$vendor/$mod/${f#./}"
  done
done
