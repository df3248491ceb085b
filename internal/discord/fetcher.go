package discord

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/bwmarrin/discordgo"

	"github.com/klbr-dev/klbr/internal/ingress/ingressapi"
)

// The attachment fetcher (seed 004: record attachment metadata at once;
// fetch media apart, bounded, so one slow attachment cannot hold back the
// events after it). Admission never waits for it: admitted attachments are
// queued here, a few workers fetch them from the CDN and stream the bytes to
// klbr-core, which stores them as artifacts. It runs in klbr-discord because
// the bot token, the REST client (refresh-urls) and all traffic with Discord
// stay here; klbr-core never dereferences a URL an ingress peer (source
// authority only) hands it.

// FetchLimits bound attachment fetching ([discord] attachment_*).
type FetchLimits struct {
	MaxBytes     int64         // one file (0: 25 MiB)
	Timeout      time.Duration // one fetch, refresh and upload included (0: 60 s)
	Concurrency  int           // fetches at once (0: 2)
	BytesPerHour int64         // fetched in any hour (0: 1 GiB)
	// BytesPerSecond paces each fetch (0: DefaultBytesPerSecond; negative:
	// unpaced). Copying and hashing a file takes the CPU: unpaced, a 25 MB
	// fetch takes both cores of a small machine for tens of milliseconds,
	// and messages arriving meanwhile wait for them (docs/performance.md).
	BytesPerSecond int64
}

// DefaultBytesPerSecond is the pace of one fetch when FetchLimits leaves it 0.
const DefaultBytesPerSecond = 16 << 20

func (l FetchLimits) withDefaults() FetchLimits {
	if l.MaxBytes <= 0 {
		l.MaxBytes = 25 << 20
	}
	if l.Timeout <= 0 {
		l.Timeout = 60 * time.Second
	}
	if l.Concurrency <= 0 {
		l.Concurrency = 2
	}
	if l.BytesPerHour <= 0 {
		l.BytesPerHour = 1 << 30
	}
	if l.BytesPerSecond == 0 {
		l.BytesPerSecond = DefaultBytesPerSecond
	}
	return l
}

// fetchQueueSize bounds the attachments waiting; one that finds the queue
// full is recorded failed ("busy"), never dropped silently.
const fetchQueueSize = 1024

type fetchJob = ingressapi.PendingFetch

type fetcher struct {
	lim   FetchLimits
	core  *ingressapi.Client
	rest  *discordgo.Session
	cdn   *http.Client // carries no token
	log   *slog.Logger
	jobs  chan fetchJob
	ready <-chan struct{} // closed after hello: uploads carry the fence

	mu     sync.Mutex // guards window
	window []spent    // bytes fetched within the last hour
}

type spent struct {
	at time.Time
	n  int64
}

func newFetcher(lim FetchLimits, core *ingressapi.Client, rest *discordgo.Session, log *slog.Logger, ready <-chan struct{}) *fetcher {
	return &fetcher{lim: lim.withDefaults(), core: core, rest: rest, log: log, jobs: make(chan fetchJob, fetchQueueSize),
		ready: ready, cdn: &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

// run starts the workers; they end with ctx.
func (f *fetcher) run(ctx context.Context, wg *sync.WaitGroup) {
	for range f.lim.Concurrency {
		wg.Go(func() {
			select {
			case <-f.ready:
			case <-ctx.Done():
				return
			}
			for {
				select {
				case j := <-f.jobs:
					f.fetch(ctx, j)
				case <-ctx.Done():
					return
				}
			}
		})
	}
}

// add queues j; never blocks admission.
func (f *fetcher) add(ctx context.Context, j fetchJob) {
	select {
	case f.jobs <- j:
	default:
		go f.fail(ctx, j, "busy", fmt.Sprintf("more than %d attachments waiting to be fetched", fetchQueueSize))
	}
}

// reserve takes n bytes of the hourly budget.
func (f *fetcher) reserve(n int64) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := time.Now()
	var used int64
	keep := f.window[:0]
	for _, s := range f.window {
		if now.Sub(s.at) < time.Hour {
			keep = append(keep, s)
			used += s.n
		}
	}
	f.window = keep
	if used+n > f.lim.BytesPerHour {
		return false
	}
	f.window = append(f.window, spent{at: now, n: n})
	return true
}

func (f *fetcher) fetch(ctx context.Context, j fetchJob) {
	if j.Size > f.lim.MaxBytes {
		f.fail(ctx, j, ingressapi.FetchTooLarge, fmt.Sprintf("%d bytes, past attachment_max_bytes (%d)", j.Size, f.lim.MaxBytes))
		return
	}
	if !f.reserve(max(j.Size, 1)) {
		f.fail(ctx, j, ingressapi.FetchBudget, fmt.Sprintf("past attachment_bytes_per_hour (%d)", f.lim.BytesPerHour))
		return
	}
	fctx, cancel := context.WithTimeout(ctx, f.lim.Timeout)
	defer cancel()
	code, detail := f.try(fctx, j)
	if ctx.Err() != nil {
		return // stopping: the fetch stays pending for the next hello
	}
	if code == "" {
		return
	}
	if fctx.Err() != nil && code != ingressapi.FetchTooLarge {
		code, detail = ingressapi.FetchTimeout, fmt.Sprintf("not done within attachment_timeout_seconds (%s)", f.lim.Timeout)
	}
	f.fail(ctx, j, code, detail)
}

// try fetches j and streams it to the core; it returns a failure code, or
// "" when the core has the outcome.
func (f *fetcher) try(ctx context.Context, j fetchJob) (code, detail string) {
	resp, err := f.get(ctx, j.URL)
	if err == nil && (resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusForbidden) {
		resp.Body.Close()
		// A signed link expired: ask the REST API for a fresh one, once.
		fresh, rerr := f.refresh(ctx, j.URL)
		if rerr != nil {
			return ingressapi.FetchExpired, "the link expired and could not be refreshed: " + rerr.Error()
		}
		resp, err = f.get(ctx, fresh)
		if err == nil && (resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusForbidden) {
			resp.Body.Close()
			return ingressapi.FetchExpired, fmt.Sprintf("the refreshed link answered %d", resp.StatusCode)
		}
	}
	if err != nil {
		return ingressapi.FetchNetwork, err.Error()
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return ingressapi.FetchHTTP, fmt.Sprintf("the CDN answered %d", resp.StatusCode)
	}
	if resp.ContentLength > f.lim.MaxBytes {
		return ingressapi.FetchTooLarge, fmt.Sprintf("%d bytes, past attachment_max_bytes (%d)", resp.ContentLength, f.lim.MaxBytes)
	}
	// Past the cap the core sees one byte more than it takes and records
	// too_large itself.
	body, size := io.Reader(io.LimitReader(resp.Body, f.lim.MaxBytes+1)), resp.ContentLength
	if f.lim.BytesPerSecond > 0 {
		body = newPaced(ctx, body, f.lim.BytesPerSecond)
	}
	_, err = f.core.UploadAttachment(ctx, j.MessageID, j.ID, body, size)
	var se *ingressapi.StatusError
	switch {
	case err == nil:
		return "", ""
	case errors.As(err, &se) && se.Status == http.StatusConflict && se.Code == ingressapi.CodeConflict:
		return "", "" // it has an outcome already
	default:
		return ingressapi.FetchNetwork, "streaming to klbr-core: " + err.Error()
	}
}

func (f *fetcher) get(ctx context.Context, raw string) (*http.Response, error) {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") {
		return nil, fmt.Errorf("fetch: %q is not an http(s) link", raw)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, err
	}
	return f.cdn.Do(req)
}

// refresh is POST /attachments/refresh-urls for one link.
func (f *fetcher) refresh(ctx context.Context, link string) (string, error) {
	ep := discordgo.EndpointAPI + "attachments/refresh-urls"
	b, err := f.rest.RequestWithBucketID(http.MethodPost, ep, map[string]any{"attachment_urls": []string{link}}, ep,
		discordgo.WithRetryOnRatelimit(false), discordgo.WithContext(ctx))
	if err != nil {
		return "", err
	}
	fresh, err := parseRefreshed(b, link)
	if err != nil {
		return "", err
	}
	return fresh, nil
}

// parseRefreshed reads refresh-urls' answer for link.
func parseRefreshed(b []byte, link string) (string, error) {
	if len(b) > 1<<20 {
		return "", errors.New("refresh-urls: answer too large")
	}
	var out struct {
		Refreshed []struct {
			Original  string `json:"original"`
			Refreshed string `json:"refreshed"`
		} `json:"refreshed_urls"`
	}
	if err := json.Unmarshal(b, &out); err != nil {
		return "", fmt.Errorf("refresh-urls: %w", err)
	}
	for _, r := range out.Refreshed {
		if r.Original == link && r.Refreshed != "" && len(r.Refreshed) <= ingressapi.MaxURLBytes {
			return r.Refreshed, nil
		}
	}
	return "", errors.New("refresh-urls: Discord did not refresh the link (the message or file is gone)")
}

// fail records j's failure with the core, a few tries at most: a core that
// stays away gets it again as pending at the next hello.
func (f *fetcher) fail(ctx context.Context, j fetchJob, code, detail string) {
	f.log.Info("attachment not fetched", "message_id", j.MessageID, "attachment", j.ID, "code", code)
	for i := range 3 {
		_, err := f.core.AttachmentFailed(ctx, j.MessageID, j.ID, ingressapi.FetchFailure{Code: code, Detail: detail})
		var se *ingressapi.StatusError
		if err == nil || errors.As(err, &se) && se.Permanent() || ctx.Err() != nil {
			return
		}
		select {
		case <-time.After(time.Duration(i+1) * 200 * time.Millisecond):
		case <-ctx.Done():
			return
		}
	}
}
