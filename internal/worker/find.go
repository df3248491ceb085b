package worker

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
)

// FindKernel finds klbr-kernel: beside the running executable, else on PATH.
func FindKernel() (string, error) {
	if self, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(self), "klbr-kernel")
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
			return p, nil
		}
	}
	p, err := exec.LookPath("klbr-kernel")
	if err != nil {
		return "", errors.New("klbr-kernel is neither beside klbr-core nor on PATH; build it (make build) or install it")
	}
	return p, nil
}
