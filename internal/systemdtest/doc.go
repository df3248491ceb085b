// Package systemdtest holds the tests of klbr's systemd unit files (nix/systemd): that
// systemd-analyze verify finds nothing wrong with them, and that, installed as shipped under a
// real systemd booted as PID 1 of a namespace (package systemdlab), they start klbr-core
// on the first connection, restart it without refusing a connection, drain it on stop, and
// place its workbenches in scopes with limits. It has no code of its own.
package systemdtest
