package discord

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"strings"

	"github.com/bwmarrin/discordgo"

	"github.com/klbr-dev/klbr/internal/ingress/ingressapi"
)

// upload is a send's files made into the multipart/form-data body Discord
// documents for a message with files: a payload_json part (the JSON body,
// its attachments naming each file by n) and one files[n] part each.
type upload struct {
	contentType string
	body        []byte
}

// uploadAttachment is an entry of payload_json's attachments.
type uploadAttachment struct {
	ID       int    `json:"id"`
	Filename string `json:"filename"`
}

// sendWithFiles is sendBody with its attachments.
type sendWithFiles struct {
	sendBody
	Attachments []uploadAttachment `json:"attachments"`
}

// readUpload reads the files of e from klbr-core and makes the body. More
// than Discord takes (10 files, 10 MiB) is refused here, before anything
// is sent: the core checked it when the send was asked, this holds anyway.
func (t *transport) readUpload(ctx context.Context, e ingressapi.Effect) (*upload, *ingressapi.Receipt) {
	refuse := func(code, msg string) (*upload, *ingressapi.Receipt) {
		return nil, &ingressapi.Receipt{State: "failed", ErrorCode: code, Error: msg + "; nothing was sent"}
	}
	if len(e.Files) > ingressapi.MaxSendFiles {
		return refuse("too_many_files", fmt.Sprintf("%d files; Discord takes %d a message", len(e.Files), ingressapi.MaxSendFiles))
	}
	var total int64
	for _, f := range e.Files {
		total += f.Size
	}
	if total > ingressapi.MaxSendFileBytes {
		return refuse("too_large", fmt.Sprintf("%d bytes of files; Discord takes %d a message from a bot", total, ingressapi.MaxSendFileBytes))
	}
	body := sendWithFiles{sendBody: messageBody(e)}
	var b bytes.Buffer
	mw := multipart.NewWriter(&b)
	for i, f := range e.Files {
		body.Attachments = append(body.Attachments, uploadAttachment{ID: i, Filename: f.Filename})
	}
	payload, err := json.Marshal(body)
	if err != nil {
		return refuse("invalid", err.Error())
	}
	h := textproto.MIMEHeader{}
	h.Set("Content-Disposition", `form-data; name="payload_json"`)
	h.Set("Content-Type", "application/json")
	pw, _ := mw.CreatePart(h)
	pw.Write(payload)
	left := int64(ingressapi.MaxSendFileBytes)
	for i, f := range e.Files {
		data, err := t.core.EffectFile(ctx, e.ID, i, min(f.Size, left))
		if err != nil {
			return refuse("file_unavailable", fmt.Sprintf("file %d (%s) could not be read from klbr-core: %v", i, f.Filename, err))
		}
		left -= int64(len(data))
		h := textproto.MIMEHeader{}
		h.Set("Content-Disposition", fmt.Sprintf(`form-data; name="files[%d]"; filename="%s"`, i, quoteEscaper.Replace(f.Filename)))
		ct := f.ContentType
		if ct == "" {
			ct = "application/octet-stream"
		}
		h.Set("Content-Type", ct)
		fw, _ := mw.CreatePart(h)
		fw.Write(data)
	}
	mw.Close()
	return &upload{contentType: mw.FormDataContentType(), body: b.Bytes()}, nil
}

var quoteEscaper = strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\r", "", "\n", "")

// sendUpload posts one message with its files and its stable nonce, and
// returns the message id and its files as Discord made them.
func sendUpload(s *discordgo.Session, e ingressapi.Effect, u *upload) (string, []ingressapi.SentFile, error) {
	ep := discordgo.EndpointChannelMessages(e.ChannelID)
	resp, err := s.RequestRaw(http.MethodPost, ep, u.contentType, u.body, ep, 0, discordgo.WithRetryOnRatelimit(false))
	if err != nil {
		return "", nil, err
	}
	return ParseCreated(resp)
}

// ParseCreated reads the message a create answered with: its id and its
// attachments in order (at most ingressapi.MaxSendFiles; each with a
// Discord id, its name clipped to 255 bytes). The list ends at an attachment
// without a valid id: a receipt names files by position.
func ParseCreated(resp []byte) (string, []ingressapi.SentFile, error) {
	if len(resp) > MaxResponseBytes {
		return "", nil, fmt.Errorf("the send's answer is %d bytes, at most %d", len(resp), MaxResponseBytes)
	}
	var m struct {
		ID          string `json:"id"`
		Attachments []struct {
			ID       string `json:"id"`
			Filename string `json:"filename"`
			Size     int64  `json:"size"`
		} `json:"attachments"`
	}
	if err := json.Unmarshal(resp, &m); err != nil || !snowflake(m.ID) {
		return "", nil, fmt.Errorf("the send's answer has no message id: %v", err)
	}
	var files []ingressapi.SentFile
	for _, a := range m.Attachments {
		if len(files) == ingressapi.MaxSendFiles {
			break
		}
		if !snowflake(a.ID) || len(a.ID) > 20 || a.Size < 0 {
			break
		}
		files = append(files, ingressapi.SentFile{AttachmentID: a.ID, Filename: clipBytes(a.Filename, 255), Size: a.Size})
	}
	return m.ID, files, nil
}
