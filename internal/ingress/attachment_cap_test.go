package ingress

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/klbr-dev/klbr/internal/artifacts"
	"github.com/klbr-dev/klbr/internal/ingress/ingressapi"
	"github.com/klbr-dev/klbr/internal/session"
	"github.com/klbr-dev/klbr/internal/store"
)

// klbr-core enforces attachment_max_bytes on the bytes themselves, not on
// what the transport or Discord announced: an upload announced past the cap
// and one streamed without a length that runs past it each end in a
// recorded too_large failure, with no artifact and no spool file left; an
// upload of exactly the cap is stored.
func TestUploadsPastTheCapAreRecordedTooLarge(t *testing.T) {
	dir := t.TempDir()
	c := startCore(t, dir)
	arts, err := artifacts.New(filepath.Join(dir, "artifacts"))
	if err != nil {
		t.Fatal(err)
	}
	const limit = 64 << 10
	c.server.cfg.Artifacts = func() *artifacts.Store { return arts }
	c.server.cfg.AttachmentMaxBytes = limit
	ctx := context.Background()
	cases := []struct {
		name, att string
		body      []byte
		size      int64 // as the upload announces it; -1: streamed without a length
		state     string
	}{
		{"announced past the cap", "71", bytes.Repeat([]byte("a"), limit+1), limit + 1, store.AttachmentFailed},
		{"streamed past the cap", "72", bytes.Repeat([]byte("b"), 4*limit), -1, store.AttachmentFailed},
		{"exactly the cap, streamed", "73", bytes.Repeat([]byte("c"), limit), -1, store.AttachmentFetched},
	}
	m := msg("3101", "20", ingressapi.ModeDM, "three files")
	for _, tc := range cases {
		// Discord announced each small: the announcement is not trusted.
		m.Attachments = append(m.Attachments, ingressapi.Attachment{ID: tc.att, Filename: tc.att + ".bin", Size: 10, URL: "https://cdn.example/" + tc.att})
	}
	if _, err := c.client.Admit(ctx, ingressapi.AdmitRequest{Messages: []ingressapi.Message{m}}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range cases {
		res, err := c.client.UploadAttachment(ctx, "3101", tc.att, bytes.NewReader(tc.body), tc.size)
		if err != nil || res.State != tc.state {
			t.Errorf("%s: upload answered %+v, %v; want %s", tc.name, res, err, tc.state)
			continue
		}
		a, err := c.store.AttachmentTarget(ctx, session.DefaultID, "3101", tc.att)
		if err != nil {
			t.Fatal(err)
		}
		if a.State != tc.state {
			t.Errorf("%s: recorded %s, want %s", tc.name, a.State, tc.state)
		}
		if tc.state == store.AttachmentFailed && (a.ErrorCode != ingressapi.FetchTooLarge || a.SHA256 != "") {
			t.Errorf("%s: recorded %q with artifact %q, want too_large and none", tc.name, a.ErrorCode, a.SHA256)
		}
		if tc.state == store.AttachmentFetched {
			p, _ := arts.Path(a.SHA256)
			if got, err := os.ReadFile(p); err != nil || !bytes.Equal(got, tc.body) {
				t.Errorf("%s: the artifact holds %d bytes (%v), want %d", tc.name, len(got), err, len(tc.body))
			}
		}
	}
	spools, err := os.ReadDir(filepath.Join(dir, "artifacts", "tmp"))
	if err != nil || len(spools) != 0 {
		t.Fatalf("spool files left: %v (%v)", spools, err)
	}
}
