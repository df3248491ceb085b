package config

import (
	"reflect"
	"sort"
	"strconv"
	"strings"

	"github.com/pelletier/go-toml/v2/unstable"
)

// position is a 1-based line and byte column in a document.
type position struct {
	line, column int
}

// keyIndex records where each key of a TOML document is first written, so
// that errors found after decoding (a bad url, a refused retention) can name
// their line. It is built from go-toml's parser, not by searching the text,
// so it sees keys the way the decoder does: table headers, dotted keys,
// quoted keys and inline tables alike. Array elements are recorded as
// key[i].
type keyIndex struct {
	at    map[string]position
	keyAt map[position][]string // the keys of at, by position
	near  map[string]string     // an unknown key → the known key it is probably a typo of
}

// has reports whether the document writes key.
func (x *keyIndex) has(key string) bool {
	if x == nil {
		return false
	}
	_, ok := x.at[key]
	return ok
}

// find returns the position of the first of keys the document writes. The
// zero position means none of them is written (or there is no document).
func (x *keyIndex) find(keys ...string) position {
	if x == nil {
		return position{}
	}
	for _, k := range keys {
		if p, ok := x.at[k]; ok {
			return p
		}
	}
	return position{}
}

// qualify returns the full path of the key written at pos that ends with
// key, or key when there is none.
func (x *keyIndex) qualify(pos position, key string) string {
	best := key
	for _, k := range x.keyAt[pos] {
		if len(k) > len(best) && strings.HasSuffix(k, "."+key) {
			best = k
		}
	}
	return best
}

// indexKeys parses data and records the position of every key in it. It
// also checks the spelling of keys against schema, the Go type the document
// decodes into: go-toml matches struct fields case-insensitively, so a key
// such as "URL" would otherwise be taken for "url" without a word, while TOML
// keys are case-sensitive. Those keys are returned as errors. A syntax error
// ends the walk quietly; the decoder has already reported it.
func indexKeys(name string, data []byte, schema reflect.Type) (*keyIndex, []*Error) {
	w := &keyWalker{
		name:  name,
		index: &keyIndex{at: make(map[string]position), keyAt: make(map[position][]string), near: make(map[string]string)},
		lines: lineStarts(data),
	}
	w.p.Reset(data)
	table, tableType := "", schema
	for w.p.NextExpression() {
		expr := w.p.Expression()
		switch expr.Kind {
		case unstable.Table, unstable.ArrayTable:
			table, tableType = w.key("", schema, expr.Key())
			if expr.Kind == unstable.ArrayTable {
				// The schema has no arrays of tables; the decoder refuses
				// them, so the keys below need no checking.
				tableType = nil
			}
		case unstable.KeyValue:
			w.keyValue(table, tableType, expr)
		}
	}
	return w.index, w.errs
}

// keyWalker carries the state of one indexKeys call.
type keyWalker struct {
	name  string
	p     unstable.Parser
	index *keyIndex
	lines []int // byte offsets at which lines start
	errs  []*Error
}

// keyValue records the key of a key-value node below prefix, then the keys
// inside its value.
func (w *keyWalker) keyValue(prefix string, t reflect.Type, kv *unstable.Node) {
	path, vt := w.key(prefix, t, kv.Key())
	w.value(path, vt, kv.Value())
}

// key records each part of a (possibly dotted) key below prefix, at the
// position of that part, and returns the full path with the Go type it
// decodes into (nil when unknown).
func (w *keyWalker) key(prefix string, t reflect.Type, it unstable.Iterator) (string, reflect.Type) {
	for it.Next() {
		part := it.Node()
		name := string(part.Data)
		pos := w.position(part.Raw)
		var canonical string
		t, canonical = w.child(prefix, t, name, pos)
		if canonical != name {
			// The decoder took the key for the field canonical: record it
			// as written and go on under the field's name, so that errors
			// about the field's value find their line.
			w.record(joinKey(prefix, name), pos)
		}
		prefix = joinKey(prefix, canonical)
		w.record(prefix, pos)
		if t == nil {
			// Below an unknown or free-form key nothing is looked up:
			// stop, so that a long dotted key costs no more than its length.
			return prefix, nil
		}
	}
	return prefix, t
}

// value records the keys inside inline tables and the elements of arrays,
// where t, the Go type of the value, is known: free-form values are recorded
// one level deep (the keys of extra_options), not to their depth.
func (w *keyWalker) value(path string, t reflect.Type, v *unstable.Node) {
	if t == nil {
		return
	}
	switch v.Kind {
	case unstable.InlineTable:
		children := v.Children()
		for children.Next() {
			if kv := children.Node(); kv.Kind == unstable.KeyValue {
				w.keyValue(path, t, kv)
			}
		}
	case unstable.Array:
		if t.Kind() != reflect.Slice && t.Kind() != reflect.Array {
			return
		}
		elem := t.Elem()
		children := v.Children()
		for i := 0; children.Next(); {
			e := children.Node()
			if e.Kind == unstable.Comment {
				continue
			}
			ep := path + "[" + strconv.Itoa(i) + "]"
			if e.Raw.Length > 0 {
				w.record(ep, w.position(e.Raw))
			} else {
				// Arrays carry no range of their own: use the key's.
				w.record(ep, w.index.at[path])
			}
			w.value(ep, elem, e)
			i++
		}
	}
}

// child returns the Go type the key name below prefix decodes into, given
// the type t of prefix (nil when unknown), and the name of the struct field
// it decodes into: name itself, or the field's name when they differ in case
// only, which it reports as an error.
func (w *keyWalker) child(prefix string, t reflect.Type, name string, pos position) (reflect.Type, string) {
	if t == nil {
		return nil, name
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Map:
		return t.Elem(), name
	case reflect.Struct:
		var folded *reflect.StructField
		nearest, nearestDist := "", 3 // a suggestion within 2 edits
		for i := range t.NumField() {
			f := t.Field(i)
			tag, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
			if tag == "" || tag == "-" || !f.IsExported() {
				continue
			}
			if tag == name {
				return f.Type, name
			}
			if strings.EqualFold(tag, name) {
				folded = &f
			}
			if d := editDistance(tag, name); d < nearestDist {
				nearest, nearestDist = tag, d
			}
		}
		if folded == nil {
			// Unknown keys are reported by the strict decoder; the index
			// keeps what each is probably a typo of.
			if nearest != "" {
				w.index.near[joinKey(prefix, name)] = joinKey(prefix, nearest)
			}
			return nil, name
		}
		tag, _, _ := strings.Cut(folded.Tag.Get("toml"), ",")
		w.errs = append(w.errs, &Error{
			File: w.name, Line: pos.line, Column: pos.column,
			Key: joinKey(prefix, name),
			Msg: "unknown key (keys are case-sensitive: did you mean " + strconv.Quote(tag) + "?)",
		})
		return folded.Type, tag
	default:
		// Free-form values (extra_options) and scalars: nothing to check.
		return nil, name
	}
}

// record keeps the first position at which key is written.
func (w *keyWalker) record(key string, pos position) {
	if _, ok := w.index.at[key]; !ok {
		w.index.at[key] = pos
		w.index.keyAt[pos] = append(w.index.keyAt[pos], key)
	}
}

// position converts a range of the document to its line and column.
func (w *keyWalker) position(r unstable.Range) position {
	off := int(r.Offset)
	line := sort.Search(len(w.lines), func(i int) bool { return w.lines[i] > off })
	return position{line: line, column: off - w.lines[line-1] + 1}
}

// lineStarts returns the byte offsets at which the lines of data start.
func lineStarts(data []byte) []int {
	starts := []int{0}
	for i, c := range data {
		if c == '\n' {
			starts = append(starts, i+1)
		}
	}
	return starts
}

// formatKey writes key parts as a dotted TOML key, quoting the parts that
// are not bare keys.
func formatKey(parts ...string) string {
	var b strings.Builder
	for i, p := range parts {
		if i > 0 {
			b.WriteByte('.')
		}
		if isBareKey(p) {
			b.WriteString(p)
		} else {
			b.WriteString(quoteKey(p))
		}
	}
	return b.String()
}

// joinKey appends the key part name to the dotted key prefix.
func joinKey(prefix, name string) string {
	if !isBareKey(name) {
		name = quoteKey(name)
	}
	if prefix == "" {
		return name
	}
	return prefix + "." + name
}

// isBareKey reports whether s can be written as a TOML bare key.
func isBareKey(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range []byte(s) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// quoteKey writes s as a TOML basic string.
func quoteKey(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r < 0x20 || r == 0x7f:
			b.WriteString(`\u00`)
			b.WriteString(strconv.FormatInt(int64(r)>>4, 16))
			b.WriteString(strconv.FormatInt(int64(r)&0xf, 16))
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// editDistance is the Levenshtein distance of a and b, in bytes (keys are ASCII).
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
