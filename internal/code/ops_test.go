package code

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/klbr-dev/klbr/internal/worker"
)

func call(t *testing.T, o *Ops, op string, args any) (map[string]any, *worker.RequestError) {
	t.Helper()
	raw, _ := json.Marshal(args)
	b, err := o.HandleRequest(context.Background(), worker.Request{Op: op, Args: raw})
	if err != nil {
		var re *worker.RequestError
		if !errors.As(err, &re) {
			t.Fatalf("%s: not a RequestError: %v", op, err)
		}
		return nil, re
	}
	var out map[string]any
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out, nil
}

func TestOpsErrorsHaveTheirOwnCodes(t *testing.T) {
	o := NewOps(nil, behaviorTree)
	for _, c := range []struct {
		args map[string]any
		code string
		says string
	}{
		{map[string]any{"path": "notes.txt", "text": "hi"}, "unsupported_language", "cannot tell the language"},
		{map[string]any{"language": "cobol", "text": "hi"}, "unsupported_language", "no grammar"},
		{map[string]any{"path": "a.sh", "text": "true", "queries": []string{"references"}}, "missing_query", "not an empty result"},
		{map[string]any{"path": "a.nix", "text": "{}", "queries": []string{"symbols"}}, "no_grammar", "text only"},
		{map[string]any{"path": "a.nix", "text": "{}", "raw": "(binding) @b"}, "no_grammar", "exact replace"},
		{map[string]any{"path": "a.go", "text": "package a", "raw": "(function_definition) @f"}, "query_error", "function_definition"},
		{map[string]any{"path": "a.go", "text": "package a", "b64": "AA=="}, "invalid", "not both"},
	} {
		_, re := call(t, o, "code.parse", c.args)
		if re == nil || re.Code != c.code || !strings.Contains(re.Message, c.says) {
			t.Errorf("%v: %+v, want %s (%q)", c.args, re, c.code, c.says)
		}
	}
	if out, re := call(t, o, "code.parse", map[string]any{"path": "flake.nix", "text": "{ a = 1; }"}); re != nil || out["language"] != "nix" {
		t.Errorf("a .nix file without queries: %v %+v", out, re)
	}
	if _, re := call(t, o, "code.nope", map[string]any{}); re == nil || re.Code != "unsupported" {
		t.Errorf("unknown op: %+v", re)
	}
	out, re := call(t, o, "code.languages", map[string]any{})
	if re != nil || len(out["languages"].([]any)) != 8 {
		t.Fatalf("languages: %v %+v", out, re)
	}
}

// A query with more matches than a frame can carry is cut short and says
// so: the reply always fits the protocol frame.
func TestOpsReplyFitsAFrame(t *testing.T) {
	o := NewOps(nil, behaviorTree)
	src := strings.Repeat("a = b + c + d + e + f + g + h\n", 20000) // 600 KB, 160k identifiers
	raw, _ := json.Marshal(map[string]any{"path": "big.py", "text": src, "raw": "(identifier) @id"})
	b, err := o.HandleRequest(context.Background(), worker.Request{Op: "code.parse", Args: raw})
	if err != nil {
		t.Fatal(err)
	}
	if len(b) > MaxReplyBytes || len(b) > worker.MaxFrameBytes {
		t.Fatalf("reply of %d bytes", len(b))
	}
	var res struct {
		Queries []struct {
			Truncated bool    `json:"truncated"`
			Matches   [][]any `json:"matches"`
		} `json:"queries"`
	}
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatal(err)
	}
	if q := res.Queries[0]; !q.Truncated || len(q.Matches) < 10000 {
		t.Fatalf("truncated %v with %d matches", q.Truncated, len(q.Matches))
	}
}
