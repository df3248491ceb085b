package turn

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/klbr-dev/klbr/internal/store"
)

// renderAttachments lists a Discord message's attachments for the model, one
// indented line each after the message text (like the text's own later
// lines, so none can pass for a header): its alias within the message, its
// name (quoted: it comes from outside), its type and size. Empty for none.
func renderAttachments(as []store.Attachment) string {
	var b strings.Builder
	for _, a := range as {
		typ := a.ContentType
		if typ == "" {
			typ = "unknown type"
		}
		fmt.Fprintf(&b, "\n  [attachment %s: %s, %s, %s]", a.Alias, strconv.Quote(a.Filename), strconv.Quote(typ), humanBytes(a.Size))
	}
	return b.String()
}

// humanBytes is a size as people read it: 512 B, 1.5 KiB, 23.4 MiB.
func humanBytes(n int64) string {
	switch {
	case n < 1<<10:
		return fmt.Sprintf("%d B", n)
	case n < 1<<20:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	case n < 1<<30:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	default:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	}
}
