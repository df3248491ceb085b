package config

import (
	"strings"
	"testing"
)

func TestParseStorage(t *testing.T) {
	tests := []struct {
		name    string
		doc     string
		want    Storage
		wantErr string // the key and message, "" when accepted
		line    int
	}{
		{name: "omitted: unbounded, default warn_at", doc: "", want: Storage{WarnAt: 0.8}},
		{name: "bound with default warn_at", doc: "[storage]\nmax_bytes = 1073741824\n", want: Storage{MaxBytes: 1 << 30, WarnAt: 0.8}},
		{name: "bound and warn_at", doc: "[storage]\nmax_bytes = 16777216\nwarn_at = 0.5\n", want: Storage{MaxBytes: 16 << 20, WarnAt: 0.5}},
		{name: "negative bound", doc: "[storage]\nmax_bytes = -1\n", wantErr: "storage.max_bytes: -1 is out of range", line: 2},
		{name: "bound written as 0", doc: "[storage]\nmax_bytes = 0\n", wantErr: "storage.max_bytes: 0 is out of range", line: 2},
		{name: "bound below 16 MiB", doc: "[storage]\nmax_bytes = 1000\n", wantErr: "storage.max_bytes: 1000 is out of range: at least 16777216", line: 2},
		{name: "warn_at 1", doc: "[storage]\nmax_bytes = 16777216\nwarn_at = 1.0\n", wantErr: "storage.warn_at: 1 is out of range", line: 3},
		{name: "warn_at 0", doc: "[storage]\nwarn_at = 0.0\n", wantErr: "storage.warn_at: 0 is out of range", line: 2},
		{name: "warn_at negative", doc: "[storage]\nwarn_at = -0.2\n", wantErr: "storage.warn_at: -0.2 is out of range", line: 2},
		{name: "warn_at nan", doc: "[storage]\nwarn_at = nan\n", wantErr: "storage.warn_at: NaN is out of range", line: 2},
		{name: "warn_at as a string", doc: "[storage]\nwarn_at = \"80%\"\n", wantErr: "warn_at", line: 2},
		{name: "unknown key", doc: "[storage]\nmax_byte = 5\n", wantErr: "storage.max_byte", line: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, err := Parse("klbr.toml", []byte(tt.doc))
			if tt.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				if f.Storage != tt.want {
					t.Fatalf("storage = %+v, want %+v", f.Storage, tt.want)
				}
				return
			}
			errs := Errors(err)
			if len(errs) != 1 || !strings.Contains(errs[0].Error(), tt.wantErr) || errs[0].Line != tt.line {
				t.Fatalf("err = %v, want one at line %d with %q", err, tt.line, tt.wantErr)
			}
		})
	}
}

func TestStorageWarnBytes(t *testing.T) {
	if got := (Storage{MaxBytes: 1000 << 20}).WarnBytes(); got != 800<<20 {
		t.Errorf("a File built in code without warn_at: %d, want the default 0.8 of the bound", got)
	}
	if got := (Storage{}).WarnBytes(); got != 0 {
		t.Errorf("unbounded: %d, want 0", got)
	}
}
