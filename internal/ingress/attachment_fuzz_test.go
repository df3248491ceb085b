package ingress

import "testing"

// FuzzAttachmentArgs: a cell's discord.attachment arguments either decode to
// a message and an attachment named by digits and a read within bounds, or
// are refused; no other field (a digest, a path) is ever accepted.
func FuzzAttachmentArgs(f *testing.F) {
	f.Add([]byte(`{"message_id":"2101","attachment_id":"41"}`))
	f.Add([]byte(`{"message_id":"2101","attachment_id":"41","offset":262144,"length":1024}`))
	f.Add([]byte(`{"message_id":"2101","attachment_id":"41","sha256":"aaaa"}`))
	f.Add([]byte(`{"message_id":"2101","attachment_id":"../../runtime.sqlite"}`))
	f.Add([]byte(`{"message_id":"2101","attachment_id":"41","offset":-1}`))
	f.Add([]byte(`{"message_id":"1e3","attachment_id":"41"} {}`))
	f.Add([]byte("\xff"))
	f.Fuzz(func(t *testing.T, raw []byte) {
		a, err := decodeAttachmentArgs(raw)
		if err != nil {
			return
		}
		if len(raw) > MaxAttachmentArgsBytes {
			t.Fatalf("accepted %d bytes of arguments", len(raw))
		}
		if !validID(a.MessageID) || !validID(a.AttachmentID) {
			t.Fatalf("accepted ids %q / %q", a.MessageID, a.AttachmentID)
		}
		if a.Offset < 0 || a.Length < 1 || a.Length > MaxAttachmentChunk {
			t.Fatalf("accepted a read at %d of %d", a.Offset, a.Length)
		}
	})
}
