#!/usr/bin/env bash
# Größe
set -euo pipefail
NAME="héllo"
export LEVEL=3

greet() {
  echo "$NAME $1"
}

function main {
  greet world
}

main "$@"
