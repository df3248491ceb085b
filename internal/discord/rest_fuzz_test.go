package discord

import (
	"strings"
	"testing"
)

// FuzzFormErrors: Discord's refusal bodies are outside input; rendering
// them never panics and stays bounded.
func FuzzFormErrors(f *testing.F) {
	f.Add([]byte(`{"code":50035,"message":"Invalid Form Body","errors":{"content":{"_errors":[{"code":"BASE_TYPE_MAX_LENGTH","message":"Must be 2000 or fewer in length."}]}}}`))
	f.Add([]byte(`{"code":50035,"errors":{"embeds":{"0":{"title":{"_errors":[{"message":"too long"}]}}}}}`))
	f.Add([]byte(`{"code":50035,"errors":{"a":{"b":{"c":{"d":{"e":{"f":{"g":{"_errors":[{"message":"deep"}]}}}}}}}}}`))
	f.Add([]byte(`{"code":50006,"message":"Cannot send an empty message"}`))
	f.Add([]byte(`not json`))
	f.Fuzz(func(t *testing.T, b []byte) {
		out := formErrors(b)
		if len(out) > maxFormErrors*(256+2) {
			t.Fatalf("%d bytes rendered", len(out))
		}
	})
}

func TestFormErrorsNamesTheField(t *testing.T) {
	got := formErrors([]byte(`{"code":50035,"message":"Invalid Form Body","errors":{"content":{"_errors":[{"code":"BASE_TYPE_MAX_LENGTH","message":"Must be 2000 or fewer in length."}]},"embeds":{"0":{"title":{"_errors":[{"message":"too long"}]}}}}}`))
	if got != "content: Must be 2000 or fewer in length.; embeds.0.title: too long" {
		t.Fatalf("got %q", got)
	}
	if strings.Contains(formErrors([]byte(`{"code":50006,"errors":{"x":{"_errors":[{"message":"m"}]}}}`)), "m") {
		t.Fatal("a body that is not 50035 rendered field errors")
	}
}

// FuzzParseCreated: the message Discord answers a create with is outside
// input; reading its id and attachments never panics, and what it returns
// fits the receipt klbr-core accepts (at most 10 files, Discord ids, names
// of at most 255 bytes, no negative size).
func FuzzParseCreated(f *testing.F) {
	f.Add([]byte(`{"id":"900","attachments":[{"id":"9000","filename":"report.txt","size":10,"url":"https://cdn/x"},{"id":"9001","filename":"shot.png","size":308}]}`))
	f.Add([]byte(`{"id":"900","attachments":[{"id":"x","filename":"a"},{"id":"1","size":-1},{"id":"123456789012345678901","filename":"b"}]}`))
	f.Add([]byte(`{"id":"900","attachments":null}`))
	f.Add([]byte(`{"attachments":[]}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		id, files, err := ParseCreated(b)
		if err != nil {
			return
		}
		if !snowflake(id) || len(files) > 10 {
			t.Fatalf("id %q, %d files", id, len(files))
		}
		for _, fl := range files {
			if !snowflake(fl.AttachmentID) || len(fl.AttachmentID) > 20 || len(fl.Filename) > 255 || fl.Size < 0 {
				t.Fatalf("file %+v", fl)
			}
		}
	})
}

func TestParseCreatedReadsTheFilesInOrder(t *testing.T) {
	id, files, err := ParseCreated([]byte(`{"id":"900","attachments":[{"id":"9000","filename":"report.txt","size":10},{"id":"bad","filename":"x"},{"id":"9001","filename":"shot_1.png","size":308}]}`))
	// The list ends at the one without an id: the files are named by position.
	if err != nil || id != "900" || len(files) != 1 || files[0].AttachmentID != "9000" || files[0].Filename != "report.txt" || files[0].Size != 10 {
		t.Fatalf("%q %+v %v", id, files, err)
	}
}
