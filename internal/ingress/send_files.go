package ingress

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"mime"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/klbr-dev/klbr/internal/artifacts"
	"github.com/klbr-dev/klbr/internal/celltree"
	"github.com/klbr-dev/klbr/internal/hooks"
	"github.com/klbr-dev/klbr/internal/hosts"
	"github.com/klbr-dev/klbr/internal/ingress/ingressapi"
	"github.com/klbr-dev/klbr/internal/store"
)

// MaxSendPathBytes bounds one file path a cell names.
const MaxSendPathBytes = 4096

// sendFile is a file a send names: a workspace path, or an attachment of a
// message the cell was shown (passed on without reading the workspace).
type sendFile struct {
	path string
	att  *attachmentArgs
}

// decodeSendFiles decodes a send's files: each a path (a JSON string) or
// {"message_id", "attachment_id"}. With onHost, paths name files in the
// host's copy of the workspace, which only the host's klbr-kernel resolves:
// they are checked here for their form alone.
func decodeSendFiles(ws string, onHost bool, raw []json.RawMessage) ([]sendFile, error) {
	out := make([]sendFile, len(raw))
	for i, r := range raw {
		var p string
		if json.Unmarshal(r, &p) == nil {
			rel, err := workspaceRel(ws, p)
			if onHost {
				rel, err = hostPath(p)
			}
			if err != nil {
				return nil, fmt.Errorf("file %q: %w", clip(p), err)
			}
			out[i].path = rel
			continue
		}
		a, err := decodeAttachmentArgs(r)
		if err != nil || a.Offset != 0 {
			return nil, fmt.Errorf("file %d is a workspace path or an attachment {message_id, attachment_id}", i)
		}
		out[i].att = &a
	}
	return out, nil
}

// sendFiles copies the files a cell's send names from its workspace into
// the artifact store: each read through celltree beneath the workspace (no
// link followed, no FIFO or device, no file with other hard links), their
// sizes summed against Discord's 10 MiB before any is read, each bounded
// again while read (a file that grows meanwhile is refused). The cell names
// paths only; the host never opens anything outside the workspace for it.
// An attachment of a message the cell's session was shown is passed on as
// the artifact it was fetched into.
func (o *Ops) sendFiles(ctx context.Context, session string, raw []json.RawMessage) ([]store.EffectFile, error) {
	if len(raw) == 0 {
		return nil, nil
	}
	arts := o.server.artifacts()
	if arts == nil {
		return nil, refuse("unavailable", "discord send: klbr-core keeps no artifacts here: files cannot be sent")
	}
	ws := ""
	var remote *RemoteWorkspaceError
	if o.Workspace != nil {
		var err error
		ws, err = o.Workspace(ctx, session)
		if errors.As(err, &remote) {
			if remote.Read == nil {
				if err := remoteFiles(remote, raw); err != nil {
					return nil, err
				}
			}
			ws, err = "", nil // the host's klbr-kernel reads the files there
		}
		if err != nil {
			return nil, err
		}
	}
	files, err := decodeSendFiles(ws, remote != nil, raw)
	if err != nil {
		return nil, refuse("invalid", "discord send: %v", err)
	}
	var root *celltree.Root
	for _, f := range files {
		if f.att == nil && root == nil && remote == nil {
			if ws == "" {
				return nil, refuse("unsupported", "discord send: workspace files cannot be sent from here (no workspace)")
			}
			if root, err = celltree.Open(ws); err != nil {
				return nil, fmt.Errorf("discord send: the workspace: %w", err)
			}
			defer root.Close()
		}
	}
	var total int64
	out := make([]store.EffectFile, 0, len(files))
	for i, sf := range files {
		if sf.att != nil {
			ef, err := o.attachmentFile(ctx, session, *sf.att, arts)
			if err != nil {
				return nil, err
			}
			if total += ef.Size; total > ingressapi.MaxSendFileBytes {
				return nil, refuse("too_large", "discord send: the files come to more than %d bytes (%d with attachment %s); Discord takes 10 MiB a message from a bot: send fewer or smaller files",
					ingressapi.MaxSendFileBytes, total, sf.att.AttachmentID)
			}
			out = append(out, ef)
			continue
		}
		rel := sf.path
		var ef store.EffectFile
		var n int64
		if remote != nil {
			ef, n, err = spoolHostFile(ctx, arts, remote, rel, ingressapi.MaxSendFileBytes-total)
			var refusal *hosts.FileRefusal
			if errors.As(err, &refusal) && !refusal.TooLarge {
				return nil, refuse("invalid", "discord send: file %q on host %s: %s; nothing was sent", clip(rel), remote.Host, refusal.Reason)
			}
		} else {
			f, oerr := root.OpenFile(rel)
			if oerr != nil {
				return nil, refuse("invalid", "discord send: file %q: %v", clip(rel), celltreeReason(oerr))
			}
			ef, n, err = spoolFile(arts, f, ingressapi.MaxSendFileBytes-total)
			f.Close()
		}
		if errors.Is(err, errFilesTooLarge) {
			return nil, refuse("too_large", "discord send: the files come to more than %d bytes (%d so far with %q); Discord takes 10 MiB a message from a bot: send fewer or smaller files",
				ingressapi.MaxSendFileBytes, total+n, clip(rel))
		}
		if err != nil {
			return nil, fmt.Errorf("discord send: file %d (%q): %w", i, clip(rel), err)
		}
		total += n
		ef.Filename = sendName(path.Base(rel))
		if ef.ContentType == "" {
			ef.ContentType = mime.TypeByExtension(path.Ext(ef.Filename))
		}
		out = append(out, ef)
	}
	return out, nil
}

var errFilesTooLarge = errors.New("too large")

// RemoteWorkspaceError is what Ops.Workspace answers for a session whose
// cells run on a worker host (KLBR_REMOTE_PLACEMENT, [agent] host, or a
// child spawned there): the files its cell names are in the host's copy of
// the workspace, never klbr-core's (which would send another file than the
// one the cell meant).
type RemoteWorkspaceError struct {
	Host string
	// Read writes the file a cell there names (relative to its workspace,
	// or absolute on the host) to w, at most max bytes, as the host's
	// klbr-kernel reads it beneath that workspace without following a link
	// (hosts.Engine.ReadBeneath): a refusal is a *hosts.FileRefusal. Nil:
	// workspace files are refused.
	Read func(ctx context.Context, name string, max int64, w io.Writer) error
}

func (e *RemoteWorkspaceError) Error() string {
	return "the workbench runs on worker host " + e.Host
}

// remoteFiles refuses a send from a workbench on a worker host that names a
// workspace path; attachments of messages pass.
func remoteFiles(remote *RemoteWorkspaceError, raw []json.RawMessage) error {
	for _, r := range raw {
		var p string
		if json.Unmarshal(r, &p) == nil {
			return refuse("unsupported", "discord send: file %q: this cell runs on worker host %s, and klbr-core cannot send files from the host's copy of the workspace yet "+
				"(it would send its own copy, which is not the file you wrote); nothing was sent. Send an attachment of a message (files=[item.attachments[0]]), "+
				"or put the content in the text", clip(p), remote.Host)
		}
	}
	return nil
}

// spoolHostFile copies the file name from the worker host's workspace into
// an artifact, at most limit bytes: the host's kernel refuses a larger file
// before it writes a byte, and the spool is bounded again here.
func spoolHostFile(ctx context.Context, arts *artifacts.Store, remote *RemoteWorkspaceError, name string, limit int64) (store.EffectFile, int64, error) {
	if limit < 0 {
		limit = 0
	}
	sp, err := arts.NewSpool()
	if err != nil {
		return store.EffectFile{}, 0, err
	}
	cw := &capWriter{w: sp, max: limit}
	err = remote.Read(ctx, name, limit, cw)
	var refusal *hosts.FileRefusal
	switch {
	case cw.over || errors.As(err, &refusal) && refusal.TooLarge:
		sp.Discard()
		return store.EffectFile{}, max(cw.n, limit+1), errFilesTooLarge
	case err != nil:
		sp.Discard()
		return store.EffectFile{}, cw.n, err
	}
	ref, err := sp.Commit()
	if err != nil {
		return store.EffectFile{}, cw.n, err
	}
	ct := ""
	if len(cw.head) > 0 {
		if ct = http.DetectContentType(cw.head); ct == "application/octet-stream" {
			ct = ""
		}
	}
	return store.EffectFile{SHA256: ref.SHA256, Size: ref.Size, ContentType: ct}, cw.n, nil
}

// capWriter passes on at most max bytes, keeping the first 512 for the
// content type; past max it fails (the transfer ends) and says so.
type capWriter struct {
	w    io.Writer
	max  int64
	n    int64
	over bool
	head []byte
}

func (c *capWriter) Write(p []byte) (int, error) {
	if c.n+int64(len(p)) > c.max {
		c.over = true
		return 0, errFilesTooLarge
	}
	if k := min(len(p), 512-len(c.head)); k > 0 {
		c.head = append(c.head, p[:k]...)
	}
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// hostPath checks the form of a path a cell on a worker host names: the
// host's klbr-kernel resolves it beneath the workspace there.
func hostPath(p string) (string, error) {
	if p == "" || len(p) > MaxSendPathBytes || !utf8.ValidString(p) || strings.ContainsRune(p, 0) {
		return "", fmt.Errorf("a path is 1 to %d bytes of UTF-8", MaxSendPathBytes)
	}
	if !filepath.IsAbs(p) {
		p = filepath.Clean(p)
		if p == "." || p == ".." || strings.HasPrefix(p, "../") {
			return "", errors.New("not a file in the workspace")
		}
	}
	return p, nil
}

// attachmentFile is an attachment of a message the session was shown, as a
// file to send: its artifact, found by the digest the store recorded.
func (o *Ops) attachmentFile(ctx context.Context, session string, a attachmentArgs, arts *artifacts.Store) (store.EffectFile, error) {
	t, err := o.fetchedAttachment(ctx, session, a)
	if err != nil {
		return store.EffectFile{}, err
	}
	p, err := arts.Path(t.SHA256)
	if err != nil {
		return store.EffectFile{}, err
	}
	fi, err := os.Stat(p)
	if err != nil {
		return store.EffectFile{}, refuse("gone", "attachment %s was fetched, but its bytes have been removed since (storage gc)", t.ID)
	}
	return store.EffectFile{Filename: sendName(t.Filename), ContentType: t.ContentType, SHA256: t.SHA256, Size: fi.Size()}, nil
}

// spoolFile copies f, at most max bytes of it, into an artifact.
func spoolFile(arts *artifacts.Store, f io.Reader, max int64) (store.EffectFile, int64, error) {
	if max < 0 {
		max = 0
	}
	sp, err := arts.NewSpool()
	if err != nil {
		return store.EffectFile{}, 0, err
	}
	head := make([]byte, 512)
	hn, _ := io.ReadFull(f, head)
	head = head[:hn]
	if int64(hn) > max {
		sp.Discard()
		return store.EffectFile{}, int64(hn), errFilesTooLarge
	}
	if _, err := sp.Write(head); err != nil {
		sp.Discard()
		return store.EffectFile{}, 0, err
	}
	n, err := io.CopyBuffer(sp, io.LimitReader(f, max-int64(hn)+1), make([]byte, 32<<10))
	n += int64(hn)
	if err != nil {
		sp.Discard()
		return store.EffectFile{}, n, err
	}
	if n > max {
		sp.Discard()
		return store.EffectFile{}, n, errFilesTooLarge
	}
	ref, err := sp.Commit()
	if err != nil {
		return store.EffectFile{}, n, err
	}
	ct := ""
	if hn > 0 {
		ct = http.DetectContentType(head)
		if ct == "application/octet-stream" {
			ct = ""
		}
	}
	return store.EffectFile{SHA256: ref.SHA256, Size: ref.Size, ContentType: ct}, n, nil
}

// workspaceRel is p beneath the workspace ws: a relative path as it is, an
// absolute one only when lexically inside ws. celltree refuses links on the
// way, so nothing resolves outside.
func workspaceRel(ws, p string) (string, error) {
	if p == "" || len(p) > MaxSendPathBytes || !utf8.ValidString(p) || strings.ContainsRune(p, 0) {
		return "", fmt.Errorf("a path is 1 to %d bytes of UTF-8", MaxSendPathBytes)
	}
	if filepath.IsAbs(p) {
		rel, err := filepath.Rel(filepath.Clean(ws), filepath.Clean(p))
		if err != nil {
			return "", errors.New("not in the workspace")
		}
		p = rel
	}
	p = filepath.Clean(p)
	if p == "." || p == ".." || strings.HasPrefix(p, "../") || filepath.IsAbs(p) {
		return "", errors.New("not a file in the workspace")
	}
	return p, nil
}

// celltreeReason says why celltree refused a file, for the cell.
func celltreeReason(err error) string {
	switch {
	case errors.Is(err, celltree.ErrLink):
		return "a symbolic link (on the way or at the file) is not followed: name the file itself"
	case errors.Is(err, celltree.ErrNotRegular):
		return "not a regular file"
	case errors.Is(err, celltree.ErrHardLink):
		return "a file with other hard links is not sent: copy it"
	case errors.Is(err, fs.ErrNotExist):
		return "no such file in the workspace"
	}
	return err.Error()
}

// sendName is a file's name as Discord shows it: printable, at most 255 bytes.
func sendName(name string) string {
	name = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) || r == '/' || r == '\\' {
			return '_'
		}
		return r
	}, name)
	for len(name) > 255 {
		_, size := utf8.DecodeLastRuneInString(name)
		name = name[:len(name)-size]
	}
	if name == "" || name == "." || name == ".." {
		return "file"
	}
	return name
}

// reviewFiles is what delivery.review sees of a send's files.
func reviewFiles(fs []store.EffectFile) []hooks.ReviewFile {
	var out []hooks.ReviewFile
	for _, f := range fs {
		out = append(out, hooks.ReviewFile{Filename: f.Filename, ContentType: f.ContentType, Size: f.Size})
	}
	return out
}
