package discordtest

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"strconv"
	"strings"
)

// Discord's limits on a message's uploads (a bot in a server without
// boosts): at most MaxFiles files of MaxUploadBytes together.
const (
	MaxFiles       = 10
	MaxUploadBytes = 10 << 20
)

// File is a file uploaded with a message.
type File struct {
	Name        string
	ContentType string
	Data        []byte
}

// readMultipart reads a message create sent as multipart/form-data, as
// Discord documents it: a payload_json part (the JSON body) and files[n]
// parts, each with a filename; payload_json's attachments, when present,
// name each file by its n. What Discord refuses is answered as it answers:
// more than MaxUploadBytes of files is 413 with code 40005 ("Request entity
// too large"), more than MaxFiles files, a file part without a filename or
// an attachments entry naming no file is 50035 (Invalid Form Body).
func readMultipart(r *http.Request) (payload []byte, files []File, refusal func(http.ResponseWriter)) {
	_, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || params["boundary"] == "" {
		return nil, nil, badForm("multipart body without a boundary")
	}
	mr := multipart.NewReader(io.LimitReader(r.Body, MaxUploadBytes+(2<<20)), params["boundary"])
	total := 0
	byIndex := map[int]int{} // n of files[n] → index in files
	for {
		p, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			if total > MaxUploadBytes-(1<<20) {
				return nil, nil, tooLarge
			}
			return nil, nil, badForm("malformed multipart body: " + err.Error())
		}
		name := p.FormName()
		switch {
		case name == "payload_json":
			if payload, err = io.ReadAll(io.LimitReader(p, 1<<20)); err != nil {
				return nil, nil, badForm("payload_json: " + err.Error())
			}
		case strings.HasPrefix(name, "files[") && strings.HasSuffix(name, "]"):
			n, err := strconv.Atoi(name[len("files[") : len(name)-1])
			if err != nil || n < 0 {
				return nil, nil, formRefusal("files", "BASE_TYPE_BAD_INDEX", "Invalid file index.")
			}
			if p.FileName() == "" {
				return nil, nil, formRefusal("files", "BASE_TYPE_REQUIRED", "A file needs a filename.")
			}
			if len(files) == MaxFiles {
				return nil, nil, formRefusal("attachments", "BASE_TYPE_MAX_LENGTH", fmt.Sprintf("Must be %d or fewer in length.", MaxFiles))
			}
			data, err := io.ReadAll(io.LimitReader(p, int64(MaxUploadBytes-total)+1))
			if err != nil {
				return nil, nil, badForm("files: " + err.Error())
			}
			total += len(data)
			if total > MaxUploadBytes {
				return nil, nil, tooLarge
			}
			byIndex[n] = len(files)
			files = append(files, File{Name: p.FileName(), ContentType: p.Header.Get("Content-Type"), Data: data})
		default:
			// Discord ignores form fields it does not know.
			io.Copy(io.Discard, io.LimitReader(p, 1<<20))
		}
	}
	if payload == nil {
		return nil, nil, badForm("no payload_json part")
	}
	var body struct {
		Attachments []struct {
			ID       json.Number `json:"id"`
			Filename string      `json:"filename"`
		} `json:"attachments"`
	}
	if json.Unmarshal(payload, &body) != nil {
		return nil, nil, badForm("payload_json is not JSON")
	}
	for _, a := range body.Attachments {
		n, err := strconv.Atoi(a.ID.String())
		i, ok := byIndex[n]
		if err != nil || !ok {
			return nil, nil, formRefusal("attachments", "ATTACHMENT_NOT_FOUND", "Unknown attachment "+a.ID.String()+".")
		}
		if a.Filename != "" {
			files[i].Name = a.Filename
		}
	}
	return payload, files, nil
}

func tooLarge(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusRequestEntityTooLarge)
	io.WriteString(w, `{"message":"Request entity too large","code":40005}`)
}

func badForm(why string) func(http.ResponseWriter) {
	return formRefusal("_form", "BASE_TYPE_INVALID", why)
}

func formRefusal(field, code, msg string) func(http.ResponseWriter) {
	return func(w http.ResponseWriter) { formError(w, field, code, msg) }
}
