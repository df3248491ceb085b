//go:build race

package code

// raceShadow is what the race detector's shadow memory adds to the resident
// set of a process whose Go heap holds the hostile requests: the memory
// test allows it on top of the parse budget, which is C heap and unshadowed.
const raceShadow = 96 << 20
