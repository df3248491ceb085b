package datadir

import (
	"fmt"
	"strconv"
	"strings"
	"unicode"
)

// MaxKDLBytes bounds the previous runtime's model configuration import reads.
const MaxKDLBytes = 1 << 20

// maxKDLDepth bounds nesting.
const maxKDLDepth = 16

// kdlNode is one node of the subset of KDL the previous runtime's model
// configuration uses: a name, positional arguments (strings, numbers,
// booleans, null), key=value properties, and children in braces.
type kdlNode struct {
	Name     string
	Args     []any
	Props    map[string]any
	Children []*kdlNode
	Line     int
}

type kdlParser struct {
	s    string
	i    int
	line int
}

// parseKDL parses a KDL document (the subset above); errors name the line.
func parseKDL(src []byte) ([]*kdlNode, error) {
	if len(src) > MaxKDLBytes {
		return nil, fmt.Errorf("the KDL file is larger than %d bytes", MaxKDLBytes)
	}
	p := &kdlParser{s: string(src), line: 1}
	nodes, err := p.nodes(0)
	if err != nil {
		return nil, err
	}
	if p.i < len(p.s) {
		return nil, p.errorf("unexpected %q", p.s[p.i])
	}
	return nodes, nil
}

func (p *kdlParser) errorf(format string, a ...any) error {
	return fmt.Errorf("KDL line %d: %s", p.line, fmt.Sprintf(format, a...))
}

// space skips whitespace, comments and (when nl) newlines and semicolons;
// it reports whether a node terminator was passed.
func (p *kdlParser) space(nl bool) (bool, error) {
	term := false
	for p.i < len(p.s) {
		c := p.s[p.i]
		switch {
		case c == '\n':
			if !nl {
				return true, nil
			}
			p.line++
			p.i++
			term = true
		case c == ';':
			if !nl {
				return true, nil
			}
			p.i++
			term = true
		case c == ' ' || c == '\t' || c == '\r':
			p.i++
		case c == '\\' && !nl: // line continuation
			p.i++
			for p.i < len(p.s) && (p.s[p.i] == ' ' || p.s[p.i] == '\t' || p.s[p.i] == '\r') {
				p.i++
			}
			if p.i < len(p.s) && p.s[p.i] == '\n' {
				p.line++
				p.i++
			}
		case strings.HasPrefix(p.s[p.i:], "//"):
			for p.i < len(p.s) && p.s[p.i] != '\n' {
				p.i++
			}
		case strings.HasPrefix(p.s[p.i:], "/*"):
			end := strings.Index(p.s[p.i+2:], "*/")
			if end < 0 {
				return term, p.errorf("unterminated /* comment")
			}
			p.line += strings.Count(p.s[p.i:p.i+2+end], "\n")
			p.i += end + 4
		default:
			return term, nil
		}
	}
	return true, nil
}

func (p *kdlParser) nodes(depth int) ([]*kdlNode, error) {
	if depth > maxKDLDepth {
		return nil, p.errorf("nested deeper than %d", maxKDLDepth)
	}
	var out []*kdlNode
	for {
		if _, err := p.space(true); err != nil {
			return nil, err
		}
		if p.i >= len(p.s) || p.s[p.i] == '}' {
			return out, nil
		}
		n, err := p.node(depth)
		if err != nil {
			return nil, err
		}
		if n != nil {
			out = append(out, n)
		}
	}
}

func (p *kdlParser) node(depth int) (*kdlNode, error) {
	slashdash := strings.HasPrefix(p.s[p.i:], "/-")
	if slashdash {
		p.i += 2
	}
	name, err := p.ident()
	if err != nil {
		return nil, err
	}
	n := &kdlNode{Name: name, Props: map[string]any{}, Line: p.line}
	for {
		term, err := p.space(false)
		if err != nil {
			return nil, err
		}
		if term || p.i >= len(p.s) {
			break
		}
		c := p.s[p.i]
		if c == '}' {
			break
		}
		if c == '{' {
			p.i++
			if n.Children, err = p.nodes(depth + 1); err != nil {
				return nil, err
			}
			if p.i >= len(p.s) || p.s[p.i] != '}' {
				return nil, p.errorf("node %s: missing }", name)
			}
			p.i++
			continue
		}
		v, key, err := p.value()
		if err != nil {
			return nil, fmt.Errorf("node %s: %w", name, err)
		}
		if key != "" {
			n.Props[key] = v
		} else {
			n.Args = append(n.Args, v)
		}
		if len(n.Args) > 64 || len(n.Props) > 64 {
			return nil, p.errorf("node %s has too many values", name)
		}
	}
	if slashdash {
		return nil, nil
	}
	return n, nil
}

func identChar(c byte) bool {
	return c > ' ' && !strings.ContainsRune(`\/(){}<>;[]=,"`, rune(c))
}

func (p *kdlParser) ident() (string, error) {
	if p.i < len(p.s) && p.s[p.i] == '"' {
		s, err := p.str()
		if err == nil && s == "" {
			err = p.errorf("a node name cannot be empty")
		}
		return s, err
	}
	start := p.i
	for p.i < len(p.s) && identChar(p.s[p.i]) {
		p.i++
	}
	if p.i == start {
		if p.i >= len(p.s) {
			return "", p.errorf("expected a node name at the end")
		}
		return "", p.errorf("expected a node name, found %q", p.s[p.i])
	}
	return p.s[start:p.i], nil
}

func (p *kdlParser) str() (string, error) {
	p.i++ // "
	var b strings.Builder
	for p.i < len(p.s) {
		c := p.s[p.i]
		switch c {
		case '"':
			p.i++
			return b.String(), nil
		case '\n':
			p.line++
		case '\\':
			p.i++
			if p.i >= len(p.s) {
				return "", p.errorf("unterminated string")
			}
			switch e := p.s[p.i]; e {
			case 'n':
				b.WriteByte('\n')
			case 't':
				b.WriteByte('\t')
			case 'r':
				b.WriteByte('\r')
			case '"', '\\', '/':
				b.WriteByte(e)
			default:
				return "", p.errorf("unknown escape \\%c", e)
			}
			p.i++
			continue
		}
		b.WriteByte(c)
		p.i++
	}
	return "", p.errorf("unterminated string")
}

// value reads an argument or a key=value property.
func (p *kdlParser) value() (v any, key string, err error) {
	if p.i >= len(p.s) {
		return nil, "", p.errorf("a value is missing at the end")
	}
	if p.s[p.i] == '"' {
		s, err := p.str()
		if err != nil {
			return nil, "", err
		}
		if p.i < len(p.s) && p.s[p.i] == '=' {
			p.i++
			v, _, err := p.value()
			return v, s, err
		}
		return s, "", nil
	}
	start := p.i
	for p.i < len(p.s) && identChar(p.s[p.i]) {
		p.i++
	}
	word := p.s[start:p.i]
	if word == "" {
		return nil, "", p.errorf("unexpected %q", p.s[p.i]) // p.i < len: identChar stopped on a byte
	}
	if p.i < len(p.s) && p.s[p.i] == '=' {
		p.i++
		if p.i >= len(p.s) {
			return nil, "", p.errorf("%s= without a value", word)
		}
		v, _, err := p.value()
		return v, word, err
	}
	switch word {
	case "true", "#true":
		return true, "", nil
	case "false", "#false":
		return false, "", nil
	case "null", "#null":
		return nil, "", nil
	}
	if c := rune(word[0]); unicode.IsDigit(c) || ((c == '-' || c == '+') && len(word) > 1) {
		clean := strings.ReplaceAll(word, "_", "")
		if n, err := strconv.ParseInt(clean, 10, 64); err == nil {
			return n, "", nil
		}
		if f, err := strconv.ParseFloat(clean, 64); err == nil {
			return f, "", nil
		}
	}
	return nil, "", p.errorf("%q is not a value (strings are quoted)", word)
}
