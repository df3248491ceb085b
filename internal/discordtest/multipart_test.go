package discordtest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"mime/multipart"
	"net/http"
	"slices"
	"strings"
	"testing"
)

func multipartSend(t *testing.T, url string, payload string, files map[string][]byte) (int, string) {
	t.Helper()
	var b bytes.Buffer
	mw := multipart.NewWriter(&b)
	pw, _ := mw.CreateFormField("payload_json")
	io.WriteString(pw, payload)
	for _, name := range slices.Sorted(maps.Keys(files)) {
		fw, _ := mw.CreateFormFile(name, strings.TrimPrefix(name, "files")+".bin")
		fw.Write(files[name])
	}
	mw.Close()
	req, _ := http.NewRequest(http.MethodPost, url, &b)
	req.Header.Set("Content-Type", mw.FormDataContentType())
	req.Header.Set("Authorization", "Bot x")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// The fake takes a message with files as Discord does (payload_json and
// files[n]) and refuses what Discord refuses: more than 10 MiB of files
// (413, 40005), more than 10 files, an attachment naming no file.
func TestTheFakeTakesFilesAsDiscordDoes(t *testing.T) {
	f := New("99")
	defer f.Close()
	url := f.APIBase() + "/channels/20/messages"
	files := func(n, size int) map[string][]byte {
		m := map[string][]byte{}
		for i := range n {
			m[fmt.Sprintf("files[%d]", i)] = bytes.Repeat([]byte{'x'}, size)
		}
		return m
	}
	cases := []struct {
		name     string
		payload  string
		files    map[string][]byte
		status   int
		contains string
	}{
		{"two files", `{"content":"logs","nonce":"n1","attachments":[{"id":0,"filename":"a.log"},{"id":1,"filename":"b.log"}]}`, files(2, 100), 200, `"filename":"a.log"`},
		{"files without text", `{"nonce":"n2"}`, files(1, 10), 200, `"attachments":[{`},
		{"ten MiB and a byte", `{"content":"big","nonce":"n3"}`, files(2, 5<<20+1), 413, `"code":40005`},
		{"eleven files", `{"content":"many","nonce":"n4"}`, files(11, 10), 400, `Must be 10 or fewer in length.`},
		{"an attachment naming no file", `{"content":"x","nonce":"n5","attachments":[{"id":3,"filename":"z"}]}`, files(1, 10), 400, `"code":50035`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			status, body := multipartSend(t, url, tc.payload, tc.files)
			if status != tc.status || !strings.Contains(body, tc.contains) {
				t.Fatalf("answered %d %s, want %d with %s", status, body, tc.status, tc.contains)
			}
		})
	}
	sent := f.Sent()
	if len(sent) != 2 || len(sent[0].Files) != 2 || sent[0].Files[0].Name != "a.log" || len(sent[0].Files[1].Data) != 100 {
		var m []map[string]any
		b, _ := json.Marshal(sent)
		json.Unmarshal(b, &m)
		t.Fatalf("the fake holds %v", m)
	}
}
