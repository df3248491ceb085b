package ingress

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/klbr-dev/klbr/internal/ingress/ingressapi"
)

// FuzzReceiptFiles: a receipt's files come from the transport (an ingress
// peer); what passes is at most 10 Discord ids, and only with a confirmed
// receipt.
func FuzzReceiptFiles(f *testing.F) {
	f.Add([]byte(`{"state":"confirmed","message_id":"900","files":[{"attachment_id":"9000","filename":"report.txt","size":10}]}`))
	f.Add([]byte(`{"state":"failed","files":[{"attachment_id":"9000","filename":"a","size":1}]}`))
	f.Add([]byte(`{"state":"confirmed","files":[{"attachment_id":"x","filename":"a","size":-1}]}`))
	f.Add([]byte(`{"state":"confirmed","files":[{},{},{},{},{},{},{},{},{},{},{}]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		var r ingressapi.Receipt
		if decodeBody(bytes.NewReader(body), ingressapi.MaxRequestBytes, &r) != nil {
			return
		}
		ids, msg := receiptFileIDs(r)
		if msg != "" {
			if ids != nil {
				t.Fatal("a refusal with ids")
			}
			return
		}
		if len(ids) > ingressapi.MaxSendFiles || len(ids) > 0 && r.State != "confirmed" {
			t.Fatalf("%d ids passed with state %q", len(ids), r.State)
		}
		for _, id := range ids {
			if !isSnowflake(id) || len(id) > 20 {
				t.Fatalf("passed id %q", id)
			}
		}
	})
}

func TestReceiptFilesAreChecked(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		ok         bool
	}{
		{"confirmed with files", `{"state":"confirmed","message_id":"900","files":[{"attachment_id":"9000","filename":"a","size":1},{"attachment_id":"9001","filename":"b","size":2}]}`, true},
		{"no files", `{"state":"confirmed","message_id":"900"}`, true},
		{"files on a failed send", `{"state":"failed","files":[{"attachment_id":"9000","filename":"a","size":1}]}`, false},
		{"not a Discord id", `{"state":"confirmed","files":[{"attachment_id":"../1","filename":"a","size":1}]}`, false},
		{"negative size", `{"state":"confirmed","files":[{"attachment_id":"1","filename":"a","size":-1}]}`, false},
		{"eleven", `{"state":"confirmed","files":[` + strings.Repeat(`{"attachment_id":"1","filename":"a","size":1},`, 10) + `{"attachment_id":"1","filename":"a","size":1}]}`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var r ingressapi.Receipt
			if err := json.Unmarshal([]byte(tc.body), &r); err != nil {
				t.Fatal(err)
			}
			ids, msg := receiptFileIDs(r)
			if (msg == "") != tc.ok {
				t.Fatalf("ids %v, refusal %q; want ok %v", ids, msg, tc.ok)
			}
		})
	}
}
