// Command klbr-kernel turns "run this" into a contained process tree: it waits for the
// core's go-ahead, becomes child subreaper, runs ARGV in its own process group with a clean
// environment and only the protocol socket besides stdio, forwards signals, and kills the
// whole tree when the child exits or the deadline passes. See internal/kernel for the
// contract.
//
//	klbr-kernel [--protocol-fd N] [--go-ahead-fd M] [--deadline DURATION] [--keep-env NAME]...
//	            [--rlimit-as BYTES] [--rlimit-nproc N] -- ARGV...
//	klbr-kernel --read-beneath ROOT NAME MAX   (one file of a cell's directory, no link followed)

// The runtime must not hold the cgroup CPU files open (Go 1.25+ does, to track GOMAXPROCS):
// the kernel closes every inherited fd at start and should find only inherited ones.
//
//go:debug containermaxprocs=0
//go:debug updatemaxprocs=0
package main

import (
	"os"
	"runtime"

	"github.com/klbr-dev/klbr/internal/kernel"
)

// init runs on the main thread; locking keeps the main goroutine there, so the thread that
// sets PR_SET_PDEATHSIG and forks the child lives as long as the process.
func init() { runtime.LockOSThread() }

func main() {
	if len(os.Args) > 1 && os.Args[1] == kernel.ReadBeneathArg {
		os.Exit(kernel.ReadBeneathMain(os.Args[2:], os.Stdout, os.Stderr))
	}
	os.Exit(kernel.Main(os.Args[1:]))
}
