//go:build !race

package code

// raceShadow is 0 without the race detector (see race_on_test.go).
const raceShadow = 0
