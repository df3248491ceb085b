package discordtest

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// The CDN half of the fake: attachments under signed links that expire, as
// Discord's have since December 2023 —
// /attachments/{channel}/{message}/{filename}?ex=<hex unix>&is=<hex unix>&hm=<hex mac>.
// A link past ex, or without its parameters, answers 404 ("This content is
// no longer available."), a link whose mac does not match answers 403, and
// POST {api}/attachments/refresh-urls (a bot token, at most 50 links) answers
// fresh links for the same files.

// cdnKey signs the fake's links.
var cdnKey = []byte("discordtest-cdn-key")

// CDN is the state of the fake's CDN, under Fake.mu.
type cdn struct {
	files     map[string][]byte // by path
	generated map[string]int64  // by path: files made on the fly, of this size
	refreshes int
	fetches   map[string]int // GETs by path
}

// Attachment stores body as an attachment of message in channel and
// returns the attachment object a MESSAGE_CREATE carries, its link valid for
// ttl (negative: expired already).
func (f *Fake) Attachment(id, channel, message, filename, contentType string, body []byte, ttl time.Duration) map[string]any {
	path := "/attachments/" + channel + "/" + message + "/" + url.PathEscape(filename)
	f.mu.Lock()
	f.cdn.files[path] = body
	f.mu.Unlock()
	return map[string]any{"id": id, "filename": filename, "content_type": contentType, "size": len(body),
		"url": f.sign(path, time.Now().Add(ttl)), "proxy_url": f.sign(path, time.Now().Add(ttl))}
}

// AttachmentOfSize is Attachment announcing size bytes while storing only
// the body given (a file too large to bother generating).
func (f *Fake) AttachmentOfSize(id, channel, message, filename, contentType string, body []byte, size int64) map[string]any {
	a := f.Attachment(id, channel, message, filename, contentType, body, time.Hour)
	a["size"] = size
	return a
}

// GeneratedAttachment is Attachment for a file of size bytes the CDN makes
// as it serves it (Pattern repeated), so the fake holds none of it: what a
// process measuring its own memory needs.
func (f *Fake) GeneratedAttachment(id, channel, message, filename, contentType string, size int64, ttl time.Duration) map[string]any {
	path := "/attachments/" + channel + "/" + message + "/" + url.PathEscape(filename)
	f.mu.Lock()
	f.cdn.files[path] = nil
	f.cdn.generated[path] = size
	f.mu.Unlock()
	return map[string]any{"id": id, "filename": filename, "content_type": contentType, "size": size,
		"url": f.sign(path, time.Now().Add(ttl)), "proxy_url": f.sign(path, time.Now().Add(ttl))}
}

// Pattern is the 32 KiB block a generated attachment repeats.
var Pattern = func() []byte {
	b := make([]byte, 32<<10)
	for i := range b {
		b[i] = byte(i*7 + i>>8)
	}
	return b
}()

func (f *Fake) sign(path string, expires time.Time) string {
	ex := strconv.FormatInt(expires.Unix(), 16)
	is := strconv.FormatInt(time.Now().Unix(), 16)
	return f.srv.URL + path + "?ex=" + ex + "&is=" + is + "&hm=" + mac(path, ex, is)
}

func mac(path, ex, is string) string {
	m := hmac.New(sha256.New, cdnKey)
	io.WriteString(m, path+"\x00"+ex+"\x00"+is)
	return hex.EncodeToString(m.Sum(nil))
}

// CDNCounts says how often the CDN was asked for path's file and how many
// refresh-urls requests the REST API answered.
func (f *Fake) CDNCounts(path string) (fetches, refreshes int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.cdn.fetches[path], f.cdn.refreshes
}

func (f *Fake) serveCDN(w http.ResponseWriter, r *http.Request) {
	path := r.URL.EscapedPath()
	q := r.URL.Query()
	f.mu.Lock()
	f.cdn.fetches[path]++
	body, ok := f.cdn.files[path]
	generated := f.cdn.generated[path]
	stall := f.OnCDN
	f.mu.Unlock()
	if stall != nil {
		stall(r)
	}
	ex, err := strconv.ParseInt(q.Get("ex"), 16, 64)
	if !ok || err != nil || q.Get("is") == "" || time.Now().Unix() >= ex {
		http.Error(w, "This content is no longer available.", http.StatusNotFound)
		return
	}
	if !hmac.Equal([]byte(q.Get("hm")), []byte(mac(path, q.Get("ex"), q.Get("is")))) {
		http.Error(w, "Forbidden", http.StatusForbidden)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	if generated > 0 {
		w.Header().Set("Content-Length", strconv.FormatInt(generated, 10))
		for generated > 0 {
			n := min(generated, int64(len(Pattern)))
			if _, err := w.Write(Pattern[:n]); err != nil {
				return
			}
			generated -= n
		}
		return
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	for len(body) > 0 {
		n := min(len(body), 32<<10)
		if _, err := w.Write(body[:n]); err != nil {
			return
		}
		body = body[n:]
	}
}

// refreshURLs is POST /attachments/refresh-urls: Discord answers each link
// it knows with a freshly signed one, and leaves out the rest.
func (f *Fake) refreshURLs(w http.ResponseWriter, r *http.Request) {
	if !strings.HasPrefix(r.Header.Get("Authorization"), "Bot ") {
		http.Error(w, `{"message": "401: Unauthorized", "code": 0}`, http.StatusUnauthorized)
		return
	}
	var req struct {
		URLs []string `json:"attachment_urls"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&req); err != nil || len(req.URLs) == 0 || len(req.URLs) > 50 {
		formError(w, "attachment_urls", "BASE_TYPE_BAD_LENGTH", "Must be between 1 and 50 in length.")
		return
	}
	type refreshed struct {
		Original  string `json:"original"`
		Refreshed string `json:"refreshed"`
	}
	out := []refreshed{}
	f.mu.Lock()
	f.cdn.refreshes++
	ttl := f.RefreshTTL
	f.mu.Unlock()
	if ttl == 0 {
		ttl = 24 * time.Hour
	}
	for _, u := range req.URLs {
		p, err := url.Parse(u)
		if err != nil {
			continue
		}
		f.mu.Lock()
		_, ok := f.cdn.files[p.EscapedPath()]
		f.mu.Unlock()
		if ok {
			out = append(out, refreshed{Original: u, Refreshed: f.sign(p.EscapedPath(), time.Now().Add(ttl))})
		}
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(map[string]any{"refreshed_urls": out})
}

// Forget removes an attachment's file: its links answer 404 and
// refresh-urls leaves them out (the message or file was deleted).
func (f *Fake) Forget(channel, message, filename string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	path := "/attachments/" + channel + "/" + message + "/" + url.PathEscape(filename)
	delete(f.cdn.files, path)
	delete(f.cdn.generated, path)
}
