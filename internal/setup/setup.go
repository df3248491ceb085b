// Package setup initializes a data directory: its layout, its database, the
// operator token and the default session. Init is idempotent.
package setup

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/klbr-dev/klbr/internal/session"
	"github.com/klbr-dev/klbr/internal/store"
)

// Subdirs are the durable directories beside runtime.sqlite.
var Subdirs = []string{"releases", "drafts", "artifacts", "skills"}

// Result says what Init found and what it made.
type Result struct {
	DataDir        string `json:"data_dir"`
	Database       string `json:"database"`
	TokenFile      string `json:"token_file"`
	CreatedDB      bool   `json:"created_database"`
	CreatedToken   bool   `json:"created_token"`
	CreatedSession bool   `json:"created_session"`
	// CreatedConfig says init wrote the commented template at ConfigFile
	// (see WriteConfigTemplate).
	ConfigFile    string `json:"config_file,omitempty"`
	CreatedConfig bool   `json:"created_config,omitempty"`
}

// Init makes dir a ready data directory. It takes the owner lock while it
// works, so it refuses to run beside a serving daemon of the same directory.
func Init(ctx context.Context, dir string) (Result, error) {
	res := Result{DataDir: dir, Database: filepath.Join(dir, store.FileName), TokenFile: TokenFile(dir)}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return res, fmt.Errorf("init: %w", err)
	}
	if _, err := os.Stat(res.Database); errors.Is(err, fs.ErrNotExist) {
		res.CreatedDB = true
	}
	st, err := store.Open(ctx, dir, store.Options{})
	if err != nil {
		return res, fmt.Errorf("init: %w", err)
	}
	defer st.Close()
	for _, sub := range Subdirs {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o700); err != nil {
			return res, fmt.Errorf("init: %w", err)
		}
	}
	if res.CreatedToken, err = ensureToken(res.TokenFile); err != nil {
		return res, fmt.Errorf("init: %w", err)
	}
	if err := st.Write(ctx, func(tx *store.Tx) (err error) {
		res.CreatedSession, err = tx.EnsureSession(session.DefaultID)
		return err
	}); err != nil {
		return res, fmt.Errorf("init: default session: %w", err)
	}
	return res, st.Close()
}

// Initialized reports whether dir holds a database made by init.
func Initialized(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, store.FileName))
	return err == nil
}
