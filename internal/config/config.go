// Package config resolves klbr's configuration: the paths and bind address
// from the environment (KLBR_*), and the TOML file klbr.toml with the model
// routes, the Discord transport and the worker limits.
//
// Load is the entry point for the daemon and the CLI. Parse and Validate
// check a file on their own, for doctor and for tests; errors name the file,
// line and key they are about. ResolvePython turns KLBR_PYTHON into the
// interpreter binary workers run.
package config

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"syscall"
)

// maxFileSize bounds what Load reads as klbr.toml.
const maxFileSize = 1 << 20

// Config is klbr's resolved configuration.
type Config struct {
	Paths    Paths
	BindAddr string // KLBR_BIND_ADDR, default "127.0.0.1:8765"; passes CheckBindAddr
	// File is the parsed klbr.toml; when the file does not exist at its
	// default path, it is Defaults() and FileLoaded is false.
	File       File
	FileLoaded bool
	// Digest is the SHA-256 of the file's bytes as read (hex); empty when
	// no file was read. doctor compares it with the running daemon's.
	Digest string
}

// Digest is the hex SHA-256 of a klbr.toml's bytes: what Config.Digest holds.
func Digest(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// Load resolves the configuration from the environment, read through lookup
// (production passes os.LookupEnv; nil means the same), and reads the TOML
// file. A file missing at its default path is fine (FileLoaded is false); a
// file named by KLBR_CONFIG must exist. Errors about the file's contents are
// those of Parse, named by the file's path.
func Load(lookup func(string) (string, bool)) (*Config, error) {
	if lookup == nil {
		lookup = os.LookupEnv
	}
	paths, explicitConfig, err := resolvePaths(lookup)
	if err != nil {
		return nil, err
	}
	bind, _ := lookup(EnvBindAddr)
	if bind == "" {
		bind = DefaultBindAddr
	}
	if err := CheckBindAddr(bind); err != nil {
		return nil, fmt.Errorf("%s: %w", EnvBindAddr, err)
	}
	cfg := &Config{Paths: paths, BindAddr: bind, File: Defaults()}

	data, err := readFile(paths.ConfigFile)
	switch {
	case errors.Is(err, fs.ErrNotExist) && !explicitConfig:
		cfg.File.applySeed(paths.ConfigFile)
		return cfg, nil
	case errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("config file %s (named by %s) does not exist", paths.ConfigFile, EnvConfig)
	case err != nil:
		return nil, fmt.Errorf("read config file: %w", err)
	}
	if cfg.File, err = Parse(paths.ConfigFile, data); err != nil {
		return nil, err
	}
	cfg.File.applySeed(paths.ConfigFile)
	cfg.FileLoaded, cfg.Digest = true, Digest(data)
	return cfg, nil
}

// OpenRegular opens path for reading if it is a regular file, without blocking on a FIFO
// or a device: the open is non-blocking and the file's type is checked before any read.
func OpenRegular(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("%s is not a regular file (%s); point it at a file", path, fi.Mode().Type())
	}
	return f, nil
}

// LoadPaths resolves only the paths, without reading the TOML file. The
// operator's client commands use it, so that a broken klbr.toml cannot keep
// an operator from reaching (and stopping) a running daemon.
func LoadPaths(lookup func(string) (string, bool)) (Paths, error) {
	if lookup == nil {
		lookup = os.LookupEnv
	}
	p, _, err := resolvePaths(lookup)
	return p, err
}

// readFile reads the config file at path, refusing one over maxFileSize and anything
// that is not a regular file (a FIFO would block the open, and serve and doctor with it).
func readFile(path string) ([]byte, error) {
	f, err := OpenRegular(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(data) > maxFileSize {
		return nil, fmt.Errorf("%s: larger than %d bytes; is it the right file?", path, maxFileSize)
	}
	return data, nil
}

// Reread reads klbr.toml again at c's path (a reload), keeping c's paths and
// bind address, which only a restart changes. A file that was not there at
// the start and is still missing gives the defaults; a file that was read
// and is gone now, or does not parse, is an error (the parser's, naming the
// file, line and key).
func (c *Config) Reread() (*Config, error) {
	next := &Config{Paths: c.Paths, BindAddr: c.BindAddr, File: Defaults()}
	data, err := readFile(c.Paths.ConfigFile)
	switch {
	case errors.Is(err, fs.ErrNotExist) && !c.FileLoaded:
		next.File.applySeed(c.Paths.ConfigFile)
		return next, nil
	case err != nil:
		return nil, fmt.Errorf("read config file: %w", err)
	}
	if next.File, err = Parse(c.Paths.ConfigFile, data); err != nil {
		return nil, err
	}
	next.File.applySeed(c.Paths.ConfigFile)
	next.FileLoaded, next.Digest = true, Digest(data)
	return next, nil
}
