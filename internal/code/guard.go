package code

// The tree-sitter C library (0.25) crashes or hangs the process, not the
// query, on some malformed queries: a field name followed by a predicate
// ("name: (#eq? ...)") dereferences a step that does not exist, and two
// quantifiers in a row ("(identifier)*+") loop forever in ts_query_new.
// Queries come from cells and from behavior drafts, and a segfault or a
// spinning C call would take klbr-core down with them, so such text is
// refused before it reaches C. FuzzParseRequest and FuzzQuery found these;
// they keep looking for others.

// unsafeQuery returns a description of the first construct in text known to
// crash the C query parser, or "".
func unsafeQuery(text string) string {
	toks := queryTokens(text)
	for i := 0; i+3 < len(toks); i++ {
		if toks[i].kind == 'w' && toks[i+1].kind == ':' && toks[i+2].kind == '(' && toks[i+3].kind == '#' {
			return "a field name followed by a predicate (" + toks[i].text + ": (#...)): a field applies to a node pattern"
		}
	}
	for i := 0; i+1 < len(toks); i++ {
		if isQuantifier(toks[i]) && isQuantifier(toks[i+1]) {
			return "two quantifiers in a row (" + toks[i].text + toks[i+1].text + "): one of *, + or ? per pattern"
		}
	}
	return ""
}

type queryToken struct {
	kind byte // 'w' word, '"' string, or the character itself
	text string
}

// queryTokens splits query text into words, strings and single characters,
// without whitespace and ;-comments.
func queryTokens(text string) []queryToken {
	var out []queryToken
	for i := 0; i < len(text); {
		c := text[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v':
			i++
		case c == ';':
			for i < len(text) && text[i] != '\n' {
				i++
			}
		case c == '"':
			j := i + 1
			for j < len(text) && text[j] != '"' {
				if text[j] == '\\' {
					j++
				}
				j++
			}
			out = append(out, queryToken{'"', ""})
			i = j + 1
		case isWord(c):
			j := i
			for j < len(text) && isWord(text[j]) {
				j++
			}
			out = append(out, queryToken{'w', text[i:j]})
			i = j
		default:
			out = append(out, queryToken{c, string(c)})
			i++
		}
	}
	return out
}

func isQuantifier(t queryToken) bool {
	return t.kind == '*' || t.kind == '+' || t.kind == 'w' && t.text == "?"
}

func isWord(c byte) bool {
	return c == '_' || c == '-' || c == '.' || c == '?' || c == '!' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= 0x80
}
