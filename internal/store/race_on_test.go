//go:build race

package store

// raceBuild: the race detector makes a write ~10x slower, so bursts are scaled down.
const raceBuild = true
