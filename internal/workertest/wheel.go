package workertest

import (
	"archive/zip"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// WriteWheel writes a minimal pure-Python wheel of name==version holding
// files (path → content, e.g. "tinypkg/__init__.py") into dir, and returns
// its path: a tiny local package for tests of dependency staging.
func WriteWheel(dir, name, version string, files map[string]string) (string, error) {
	dist := strings.ReplaceAll(name, "-", "_")
	info := fmt.Sprintf("%s-%s.dist-info", dist, version)
	all := map[string]string{}
	for p, c := range files {
		all[p] = c
	}
	all[info+"/METADATA"] = fmt.Sprintf("Metadata-Version: 2.1\nName: %s\nVersion: %s\n", name, version)
	all[info+"/WHEEL"] = "Wheel-Version: 1.0\nGenerator: klbr-workertest\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
	var record strings.Builder
	paths := make([]string, 0, len(all))
	for p := range all {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		sum := sha256.Sum256([]byte(all[p]))
		fmt.Fprintf(&record, "%s,sha256=%s,%d\n", p, base64.RawURLEncoding.EncodeToString(sum[:]), len(all[p]))
	}
	record.WriteString(info + "/RECORD,,\n")
	all[info+"/RECORD"] = record.String()
	paths = append(paths, info+"/RECORD")
	out := filepath.Join(dir, fmt.Sprintf("%s-%s-py3-none-any.whl", dist, version))
	f, err := os.Create(out)
	if err != nil {
		return "", err
	}
	zw := zip.NewWriter(f)
	for _, p := range paths {
		w, err := zw.Create(p)
		if err != nil {
			f.Close()
			return "", err
		}
		w.Write([]byte(all[p]))
	}
	if err := zw.Close(); err != nil {
		f.Close()
		return "", err
	}
	return out, f.Close()
}
