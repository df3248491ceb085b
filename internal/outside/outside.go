// Package outside renders text that comes from outside klbr (a Discord
// display name, username, channel or guild name, a message's text) into the
// texts the model reads. The host's own structure in those texts (a header in
// brackets, a "[klbr]" line, one "- " line per item of a reminder) always
// starts at column 0 of a line; what this package renders can neither end
// the line it is on nor start one at column 0, so it cannot forge that
// structure. Every model-visible rendering of outside names and text goes
// through Name and Text (the Python SDK's klbr._outside mirrors Name).
package outside

import (
	"strconv"
	"strings"
)

// Name renders an outside name as one double-quoted string with Go's escapes:
// a newline, a carriage return, a Unicode line or paragraph separator and
// every other unprintable rune becomes an escape, and a quote in the name
// cannot close it, so the name stays on its line and inside its quotes.
func Name(s string) string { return strconv.Quote(s) }

// Text renders outside text (a message body) that follows a header: every
// line after the first is indented by two spaces, so no line of it starts
// like a header or a "[klbr]" line. Every line break a reader may honor
// (\r\n, \r, \n, \v, \f, U+0085, U+2028, U+2029) counts as one.
func Text(s string) string { return breaks.Replace(s) }

// Block is Text for a body on lines of its own: its first line is indented too.
func Block(s string) string { return "  " + Text(s) }

var breaks = strings.NewReplacer(
	"\r\n", "\n  ", "\r", "\n  ", "\n", "\n  ", "\v", "\n  ", "\f", "\n  ",
	"\u0085", "\n  ", "\u2028", "\n  ", "\u2029", "\n  ",
)
