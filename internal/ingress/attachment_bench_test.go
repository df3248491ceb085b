package ingress

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/klbr-dev/klbr/internal/artifacts"
	"github.com/klbr-dev/klbr/internal/ingress/ingressapi"
	"github.com/klbr-dev/klbr/internal/session"
	"github.com/klbr-dev/klbr/internal/workbench"
	"github.com/klbr-dev/klbr/internal/worker"
)

// BenchmarkAttachmentRead reads a fetched 4 MiB attachment through
// discord.attachment (256 KiB chunks, base64 in JSON, as a cell's a.read()
// asks for them), against reading its artifact file whole (the baseline),
// side by side.
func BenchmarkAttachmentRead(b *testing.B) {
	dir := b.TempDir()
	c := startCore(b, dir)
	arts, err := artifacts.New(filepath.Join(dir, "artifacts"))
	if err != nil {
		b.Fatal(err)
	}
	c.server.cfg.Artifacts = func() *artifacts.Store { return arts }
	data := bytes.Repeat([]byte("0123456789abcdef"), 4<<20/16)
	m := msg("3001", "20", ingressapi.ModeDM, "a file")
	m.Attachments = []ingressapi.Attachment{{ID: "61", Filename: "data.bin", Size: int64(len(data)), URL: "https://cdn.example/x"}}
	ctx := context.Background()
	if _, err := c.client.Admit(ctx, ingressapi.AdmitRequest{Messages: []ingressapi.Message{m}}); err != nil {
		b.Fatal(err)
	}
	res, err := c.client.UploadAttachment(ctx, "3001", "61", bytes.NewReader(data), int64(len(data)))
	if err != nil || res.State != "fetched" {
		b.Fatalf("upload: %+v %v", res, err)
	}
	ops := NewOps(c.store, nil, c.server)
	wctx := workbench.WithSession(ctx, session.DefaultID)
	b.Run("baseline-readfile", func(b *testing.B) {
		p, _ := arts.Path(res.SHA256)
		b.SetBytes(int64(len(data)))
		for b.Loop() {
			if got, err := os.ReadFile(p); err != nil || len(got) != len(data) {
				b.Fatal(err)
			}
		}
	})
	b.Run("discord.attachment", func(b *testing.B) {
		b.SetBytes(int64(len(data)))
		for b.Loop() {
			n := 0
			for {
				args, _ := json.Marshal(map[string]any{"message_id": "3001", "attachment_id": "61", "offset": n})
				out, err := ops.HandleRequest(wctx, worker.Request{Op: "discord.attachment", Args: args})
				if err != nil {
					b.Fatal(err)
				}
				var ch AttachmentChunk
				if err := json.Unmarshal(out, &ch); err != nil {
					b.Fatal(err)
				}
				n += len(ch.Data)
				if ch.EOF {
					break
				}
			}
			if n != len(data) {
				b.Fatalf("read %d of %d", n, len(data))
			}
		}
	})
}
