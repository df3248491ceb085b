// Package hostgit is the only place klbr-core runs git. Every git the host
// runs gets an environment and a configuration the host wrote, never the
// caller's or the repository's where that could make git run a program:
//
//   - the environment is built from nothing: no inherited GIT_* variable,
//     GIT_CONFIG_NOSYSTEM=1, GIT_CONFIG_GLOBAL=/dev/null, GIT_ATTR_NOSYSTEM=1,
//     HOME and XDG_CONFIG_HOME in a host-only directory, no prompts, only
//     the file transport;
//   - command-line configuration (which outranks every file git reads)
//     switches off hooks, the file-system monitor, the attributes file,
//     pagers, editors, credential helpers, signing programs, ssh,
//     alternate-refs commands, automatic gc and maintenance, and submodule
//     recursion; every diff, log and show gets --no-ext-diff --no-textconv.
//
// What command-line configuration cannot switch off is the configuration
// of a repository keyed by a name the attacker picks: filter.<x>.clean,
// diff.<x>.textconv, merge.<x>.driver, include.path, includeIf, alias.*,
// url.<x>.insteadOf. Checking a repository's config before running git is
// no defence (a cell rewrites it between the check and the run), so the
// soundness rests on where git runs:
//
//   - repositories the host makes itself (Scratch, Init) live in the host's
//     own directory, which no cell can write: their config is the host's;
//     a draft's diff and rebase run only there, on file contents the host
//     read itself (Commit), so git never opens a cell-writable path;
//   - a repository the host does not own (the workspace a child's clone is
//     made from and its branch fetched back into, a child's clone) is only
//     read or fetched into with commands that touch no work tree and run no
//     driver: rev-parse, upload-pack (a clone or fetch from it; git honours
//     uploadpack.packObjectsHook only from protected configuration) and a
//     fetch into it (no checkout, no merge, no submodules). Repository
//     config reaches none of the named drivers along those paths.
package hostgit

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// ErrNoGit reports that git cannot be found.
var ErrNoGit = errors.New("git is not on klbr-core's PATH (install git or, under Nix, use the packaged klbr-core)")

// DefaultTimeout bounds one git command unless Cmd.Timeout says otherwise.
const DefaultTimeout = 2 * time.Minute

// maxStderr bounds the stderr kept for an error.
const maxStderr = 8 << 10

// overrides are the -c settings every git the host runs gets. Command-line
// configuration outranks the system, global and repository files, and is
// passed down to the git processes git itself starts (upload-pack,
// pack-objects) through GIT_CONFIG_PARAMETERS.
var overrides = []string{
	"core.hooksPath=/dev/null",
	"core.fsmonitor=false",
	"core.untrackedCache=false",
	"core.attributesFile=/dev/null",
	"core.excludesFile=/dev/null",
	"core.sshCommand=false",
	"core.gitProxy=",
	"core.askPass=",
	"core.pager=cat",
	"core.editor=false",
	"sequence.editor=false",
	"core.alternateRefsCommand=",
	"core.alternateRefsPrefixes=",
	"core.autocrlf=false",
	"core.safecrlf=false",
	"core.quotepath=false",
	"credential.helper=",
	"diff.noprefix=false",
	"diff.mnemonicPrefix=false",
	"diff.relative=false",
	"color.ui=false",
	"gpg.program=false",
	"gpg.openpgp.program=false",
	"gpg.x509.program=false",
	"gpg.ssh.program=false",
	"gpg.ssh.defaultKeyCommand=",
	"commit.gpgSign=false",
	"tag.gpgSign=false",
	"log.showSignature=false",
	"merge.verifySignatures=false",
	"protocol.allow=never",
	"protocol.file.allow=always",
	"submodule.recurse=false",
	"fetch.recurseSubmodules=false",
	"push.recurseSubmodules=no",
	"gc.auto=0",
	"maintenance.auto=false",
	"fetch.writeCommitGraph=false",
	"fetch.showForcedUpdates=false",
	"init.templateDir=",
	"init.defaultBranch=main",
	// The trees the host reads may belong to the workers' uid; what makes
	// that safe is the rest of this list and where git runs (see the
	// package comment), not the owner check.
	"safe.directory=*",
}

// Git runs git for klbr-core. Its state directory (host-only: a cell must
// not be able to write it or anything beneath it) holds git's HOME, an
// empty repository for commands that need none, and scratch repositories.
type Git struct {
	bin   string
	state string
}

// New finds git and makes state (0700) ready. state must lie where no cell
// can write: under the data directory, outside every sandbox grant.
func New(state string) (*Git, error) {
	bin, err := exec.LookPath("git")
	if err != nil {
		return nil, ErrNoGit
	}
	g := &Git{bin: bin, state: state}
	for _, d := range []string{state, g.home(), filepath.Join(state, "scratch")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("hostgit: %w", err)
		}
		if err := os.Chmod(d, 0o700); err != nil {
			return nil, fmt.Errorf("hostgit: %w", err)
		}
	}
	if _, err := os.Stat(filepath.Join(g.empty(), "HEAD")); err != nil {
		tmp, err := os.MkdirTemp(state, ".empty-")
		if err != nil {
			return nil, fmt.Errorf("hostgit: %w", err)
		}
		if _, err := g.Run(context.Background(), Cmd{GitDir: tmp}, "init", "--quiet", "--bare", "--template=", tmp); err != nil {
			os.RemoveAll(tmp)
			return nil, err
		}
		if err := os.Rename(tmp, g.empty()); err != nil {
			os.RemoveAll(tmp)
			// Another New on the same state may have made it first.
			if _, serr := os.Stat(filepath.Join(g.empty(), "HEAD")); serr != nil {
				return nil, fmt.Errorf("hostgit: %w", err)
			}
		}
	}
	return g, nil
}

func (g *Git) home() string  { return filepath.Join(g.state, "home") }
func (g *Git) empty() string { return filepath.Join(g.state, "empty.git") }

// Cmd is one git command.
type Cmd struct {
	// Dir is the working directory; "" is the state directory.
	Dir string
	// GitDir is the repository (--git-dir). "" is the host's empty
	// repository, unless Discover.
	GitDir string
	// WorkTree is --work-tree, with GitDir.
	WorkTree string
	// Discover lets git find the repository Dir lies in: a repository the
	// host does not own, whose config git reads. Only for the commands the
	// package comment names.
	Discover bool
	// Env adds variables (GIT_INDEX_FILE, GIT_OBJECT_DIRECTORY, ...) to the
	// host's environment.
	Env []string
	// Stdin is the command's input; nil is none.
	Stdin io.Reader
	// MaxOut bounds the stdout kept (the rest is read and dropped); 0: 64 MiB.
	MaxOut int
	// Timeout bounds the command; 0: DefaultTimeout.
	Timeout time.Duration
}

// Error is git exiting with a status other than 0.
type Error struct {
	Op     string
	Code   int
	Stderr string
}

func (e *Error) Error() string {
	return fmt.Sprintf("git %s: exit status %d: %s", e.Op, e.Code, e.Stderr)
}

// ExitCode is err's git exit status, or -1.
func ExitCode(err error) int {
	var ge *Error
	if errors.As(err, &ge) {
		return ge.Code
	}
	return -1
}

// Env is the environment every git the host runs gets, and nothing else:
// built from nothing, so no variable klbr-core inherited (GIT_DIR,
// GIT_CONFIG_PARAMETERS, GIT_SSH, GIT_EXTERNAL_DIFF, ...) reaches git.
func (g *Git) Env() []string {
	path := os.Getenv("PATH")
	if path == "" {
		path = "/usr/bin:/bin"
	}
	return []string{
		"PATH=" + path,
		"HOME=" + g.home(),
		"XDG_CONFIG_HOME=" + filepath.Join(g.home(), ".config"),
		"LANG=C.UTF-8", "LC_ALL=C.UTF-8",
		"GIT_CONFIG_NOSYSTEM=1",
		"GIT_CONFIG_GLOBAL=/dev/null",
		"GIT_ATTR_NOSYSTEM=1",
		"GIT_TERMINAL_PROMPT=0",
		"GIT_NO_REPLACE_OBJECTS=1",
		"GIT_PROTOCOL_FROM_USER=0",
		"GIT_ALLOW_PROTOCOL=file",
		"GIT_OPTIONAL_LOCKS=0",
		"GIT_AUTHOR_NAME=klbr", "GIT_AUTHOR_EMAIL=klbr@localhost",
		"GIT_COMMITTER_NAME=klbr", "GIT_COMMITTER_EMAIL=klbr@localhost",
	}
}

// Args is the command line of git args as the host runs it.
func (g *Git) Args(c Cmd, args ...string) []string {
	full := make([]string, 0, 2*len(overrides)+len(args)+4)
	full = append(full, "--no-pager", "--no-replace-objects")
	for _, o := range overrides {
		full = append(full, "-c", o)
	}
	if !c.Discover {
		gd := c.GitDir
		if gd == "" {
			gd = g.empty()
		}
		full = append(full, "--git-dir="+gd)
		if c.WorkTree != "" {
			full = append(full, "--work-tree="+c.WorkTree)
		}
	}
	if len(args) > 0 {
		switch args[0] {
		case "diff", "log", "show":
			// diff.external and diff.<driver>.textconv name programs by
			// a driver the repository picks: switched off here, for every
			// command that could diff, rather than by each caller.
			full = append(full, args[0], "--no-ext-diff", "--no-textconv")
			return append(full, args[1:]...)
		}
	}
	return append(full, args...)
}

// Run runs git args as c says and returns its stdout.
func (g *Git) Run(ctx context.Context, c Cmd, args ...string) ([]byte, error) {
	if g == nil {
		return nil, ErrNoGit
	}
	op := "git"
	if len(args) > 0 {
		op = args[0]
	}
	timeout := c.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, g.bin, g.Args(c, args...)...)
	cmd.Dir = c.Dir
	if cmd.Dir == "" {
		cmd.Dir = g.state
	}
	env := g.Env()
	for _, e := range c.Env {
		if strings.HasPrefix(e, "GIT_") {
			env = append(env, e)
		}
	}
	cmd.Env = env
	cmd.Stdin = c.Stdin
	cmd.WaitDelay = 5 * time.Second
	max := c.MaxOut
	if max <= 0 {
		max = 64 << 20
	}
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &limited{b: &out, n: max}, &limited{b: &stderr, n: maxStderr}
	err := cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		msg := strings.TrimSpace(stderr.String())
		if msg == "" && ctx.Err() != nil {
			msg = ctx.Err().Error()
		}
		return out.Bytes(), &Error{Op: op, Code: ee.ExitCode(), Stderr: msg}
	}
	if err != nil {
		return out.Bytes(), fmt.Errorf("git %s: %w", op, err)
	}
	return out.Bytes(), nil
}

// limited keeps the first n bytes written to it and drops the rest.
type limited struct {
	b *bytes.Buffer
	n int
}

func (l *limited) Write(p []byte) (int, error) {
	if room := l.n - l.b.Len(); room > 0 {
		l.b.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

// Scratch makes a new bare repository in the state directory, which only
// the host can write, and returns it with the function that removes it.
func (g *Git) Scratch(ctx context.Context) (string, func(), error) {
	if g == nil {
		return "", nil, ErrNoGit
	}
	dir, err := os.MkdirTemp(filepath.Join(g.state, "scratch"), "repo-")
	if err != nil {
		return "", nil, fmt.Errorf("hostgit: scratch: %w", err)
	}
	done := func() { os.RemoveAll(dir) }
	if _, err := g.Run(ctx, Cmd{GitDir: dir}, "init", "--quiet", "--bare", "--template=", dir); err != nil {
		done()
		return "", nil, err
	}
	return dir, done, nil
}

// TempDir makes a new directory in the state directory for files only the
// host writes (git merge-file's inputs), with the function that removes it.
func (g *Git) TempDir() (string, func(), error) {
	if g == nil {
		return "", nil, ErrNoGit
	}
	dir, err := os.MkdirTemp(filepath.Join(g.state, "scratch"), "files-")
	if err != nil {
		return "", nil, fmt.Errorf("hostgit: %w", err)
	}
	return dir, func() { os.RemoveAll(dir) }, nil
}
