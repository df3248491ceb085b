package turn

import (
	"context"
	"net/http"
	"strings"
	"time"

	"github.com/klbr-dev/klbr/internal/provider"
	"github.com/klbr-dev/klbr/internal/store"
)

// Bounds of the images one model request carries to a vision route.
const (
	// MaxImagesPerRequest is the most images one request carries.
	MaxImagesPerRequest = 4
	// MaxImageBytesPerRequest bounds their bytes together (as data URLs,
	// a third more).
	MaxImageBytesPerRequest = 8 << 20
	// MaxImageBytes bounds one image: Anthropic's API takes 5 MB an image,
	// OpenAI's 20 MB; a larger one goes as its description only.
	MaxImageBytes = 5 << 20
	// imageFetchWait is how long an attempt's first requests wait for an
	// image still being fetched (fetching is apart from admission).
	imageFetchWait = 10 * time.Second
	imagePoll      = 100 * time.Millisecond
)

// imageTypes are the image types the providers take.
var imageTypes = map[string]bool{"image/png": true, "image/jpeg": true, "image/gif": true, "image/webp": true}

// withImages attaches to msgs the images of the Discord messages the
// attempt took in (the images the turn is about), newest first, within the
// per-request bounds, when a route the request may go to has vision; the
// provider client drops them for a route without it. An image whose fetch
// failed, is too large or does not sniff as the image type it claims goes
// as its description only (the message's text lists every attachment).
func (r *runner) withImages(ctx context.Context, a *attempt, msgs []provider.Message) []provider.Message {
	cfg := &r.l.cfg
	t := r.transcript
	if !r.l.live().Vision || cfg.Images == nil || len(a.taken) == 0 || t == nil {
		return msgs
	}
	left, n := int64(MaxImageBytesPerRequest), 0
	if a.imagesBy.IsZero() {
		a.imagesBy = time.Now().Add(imageFetchWait) // wall time: the wait is real whatever the clock
	}
	deadline := a.imagesBy
	for i := len(t.entries) - 1; i >= 0 && n < MaxImagesPerRequest; i-- {
		te := t.entries[i]
		idx := 1 + te.msg // msgs[0] is the system prompt
		if !te.input || te.discord == nil || !a.taken[te.discord.InputID] || idx >= len(msgs) || msgs[idx].Role != "user" {
			continue
		}
		var ims []provider.Image
		for _, att := range te.discord.Attachments {
			mt := mediaType(att.ContentType)
			if n == MaxImagesPerRequest || !imageTypes[mt] || att.Size > MaxImageBytes || att.Size > left {
				continue
			}
			sha := r.fetchedImage(ctx, te.discord.MessageID, att, deadline)
			if sha == "" {
				continue
			}
			data, err := cfg.Images(sha, min(MaxImageBytes, left))
			if err != nil || int64(len(data)) > left || http.DetectContentType(data) != mt {
				continue
			}
			ims = append(ims, provider.Image{MediaType: mt, Data: data})
			left -= int64(len(data))
			n++
		}
		if len(ims) > 0 {
			msgs[idx].Images = ims
		}
	}
	return msgs
}

// fetchedImage is the artifact digest of att once fetched, waiting for a
// fetch under way until deadline; "" when it failed or is not done then.
func (r *runner) fetchedImage(ctx context.Context, message string, att store.Attachment, deadline time.Time) string {
	for {
		tg, err := r.l.cfg.Store.AttachmentTarget(ctx, r.session, message, att.ID)
		if err != nil {
			return ""
		}
		switch tg.State {
		case store.AttachmentFetched:
			return tg.SHA256
		case store.AttachmentFailed:
			return ""
		}
		wait := time.Until(deadline)
		if wait <= 0 {
			return ""
		}
		select {
		case <-time.After(min(wait, imagePoll)):
		case <-ctx.Done():
			return ""
		}
	}
}

// mediaType is a Content-Type without its parameters, lower case.
func mediaType(ct string) string {
	ct, _, _ = strings.Cut(ct, ";")
	return strings.ToLower(strings.TrimSpace(ct))
}
