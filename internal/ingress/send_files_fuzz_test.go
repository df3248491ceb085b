package ingress

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzSendFilePath: a path a cell names for a send's file is either refused
// or a clean relative path beneath the workspace (never absolute, never
// climbing out); one named on a worker host is bounded UTF-8 without NUL,
// and, when relative, clean and not climbing out; the name Discord shows is
// printable and bounded.
func FuzzSendFilePath(f *testing.F) {
	for _, s := range []string{`"report.txt"`, `{"message_id":"1","attachment_id":"2"}`, `{"message_id":"1","attachment_id":"2","sha256":"x"}`, `"../x"`, "report.txt", "/ws/sub/a.png", "/ws/../etc/passwd", "../x", "a/../../b", "/elsewhere/x", ".", "/ws", "a\x00b", "\xff", "sub//./c"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		rel, err := workspaceRel("/ws", p)
		if err == nil {
			if filepath.IsAbs(rel) || rel == ".." || strings.HasPrefix(rel, "../") || rel == "." || rel != filepath.Clean(rel) {
				t.Fatalf("%q passed as %q", p, rel)
			}
		}
		// The same bytes as one entry of a send's files (a JSON value).
		if fs, err := decodeSendFiles("/ws", false, []json.RawMessage{json.RawMessage(p)}); err == nil {
			switch f := fs[0]; {
			case f.att != nil && (!validID(f.att.MessageID) || !validID(f.att.AttachmentID)):
				t.Fatalf("%q passed as attachment %+v", p, *f.att)
			case f.att == nil && (filepath.IsAbs(f.path) || f.path == ".." || strings.HasPrefix(f.path, "../") || f.path == "."):
				t.Fatalf("%q passed as path %q", p, f.path)
			}
		}
		// A path on a worker host: only its form is checked here (the
		// host's klbr-kernel resolves it beneath the workspace there).
		if hp, err := hostPath(p); err == nil {
			if hp == "" || len(hp) > MaxSendPathBytes || strings.ContainsRune(hp, 0) || !utf8.ValidString(hp) ||
				!filepath.IsAbs(hp) && (hp == "." || hp == ".." || strings.HasPrefix(hp, "../") || hp != filepath.Clean(hp)) {
				t.Fatalf("%q passed on to the host as %q", p, hp)
			}
		}
		name := sendName(filepath.Base(p))
		if name == "" || len(name) > 255 || strings.ContainsAny(name, "/\\\x00\n\r") || !utf8.ValidString(name) && utf8.ValidString(p) {
			t.Fatalf("%q named %q", p, name)
		}
	})
}
