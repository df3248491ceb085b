package config

import (
	"fmt"
	"math"
	"math/bits"
	"strconv"
	"strings"
)

// MemoryMaxBytes returns memory_max in bytes. The notation is systemd's
// MemoryMax= subset that klbr accepts: digits with an optional K, M, G or T
// suffix, each a factor of 1024.
func (l *Limits) MemoryMaxBytes() (uint64, error) {
	s := l.MemoryMax
	shift := 0
	if n := len(s); n > 0 {
		switch s[n-1] {
		case 'K':
			shift = 10
		case 'M':
			shift = 20
		case 'G':
			shift = 30
		case 'T':
			shift = 40
		}
		if shift > 0 {
			s = s[:n-1]
		}
	}
	if !isDigits(s) {
		return 0, fmt.Errorf("%q is not a size (digits with an optional K, M, G or T suffix, e.g. 2G)", l.MemoryMax)
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil || bits.LeadingZeros64(n) < shift || n<<shift == math.MaxUint64 {
		// MaxUint64 is systemd's "infinity"; a limit is meant here.
		return 0, fmt.Errorf("%q is too large", l.MemoryMax)
	}
	if n == 0 {
		return 0, fmt.Errorf("%q leaves no memory: it must be more than 0", l.MemoryMax)
	}
	return n << shift, nil
}

// CPUQuotaPercent returns cpu_quota as a percentage of one CPU (200 for
// "200%": two CPUs' worth), as systemd's CPUQuota= reads it.
func (l *Limits) CPUQuotaPercent() (int, error) {
	digits, ok := strings.CutSuffix(l.CPUQuota, "%")
	if !ok || !isDigits(digits) {
		return 0, fmt.Errorf("%q is not a CPU quota (digits followed by %%, e.g. 200%%)", l.CPUQuota)
	}
	n, err := strconv.ParseInt(digits, 10, 32)
	if err != nil {
		return 0, fmt.Errorf("%q is too large", l.CPUQuota)
	}
	if n == 0 {
		return 0, fmt.Errorf("%q leaves no CPU time: it must be more than 0%%", l.CPUQuota)
	}
	return int(n), nil
}
