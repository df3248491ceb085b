package provider

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
)

// replay returns the messages as the route must receive them. The caller's
// record is what the model sent; what goes back is always valid for the
// server:
//
//   - a tool call whose arguments are not a JSON object is sent with "{}"
//     (strict servers answer HTTP 400 to every later request otherwise);
//     the caller's tool result says what the model wrote;
//   - a tool call id that is empty, already used earlier in the request, or
//     not of the form the dialect requires is replaced by a stable one
//     derived from it, and the tool message answering it follows;
//   - stored reasoning goes back where the dialect says (see Replay).
//
// The mapping depends only on the messages themselves, so the same history
// is sent byte for byte the same on every request (prompt caches see one
// prefix). msgs is not modified.
func replay(d Dialect, msgs []Message) []sent {
	out := make([]sent, len(msgs))
	for i := range msgs {
		out[i].Message = msgs[i]
	}
	used := make(map[string]bool, len(msgs)/2)
	seen := make(map[string]int, len(msgs)/2) // occurrences of each sent id so far
	type pair struct {
		sent, replayed string
		answered       bool
	}
	var pending []pair // the last assistant message's calls
	for i := range out {
		m := &out[i]
		switch m.Role {
		case "assistant":
			if len(m.ToolCalls) > 0 {
				pending = pending[:0]
				var calls []ToolCall // copied on the first change only
				for j, c := range m.ToolCalls {
					n := seen[c.ID]
					seen[c.ID] = n + 1
					id := c.ID
					if !validID(d.ToolCallIDs, id) || used[id] {
						id = replayID(d.ToolCallIDs, c.ID, n, used)
					}
					used[id] = true
					pending = append(pending, pair{sent: c.ID, replayed: id})
					args, typ := c.Function.Arguments, c.Type
					if !isJSONObject(args) {
						args = "{}"
					}
					if typ == "" {
						typ = "function"
					}
					if id != c.ID || args != c.Function.Arguments || typ != c.Type {
						if calls == nil {
							calls = append([]ToolCall(nil), m.ToolCalls...)
						}
						calls[j].ID, calls[j].Function.Arguments, calls[j].Type = id, args, typ
					}
				}
				if calls != nil {
					m.ToolCalls = calls
				}
			}
			withReasoning(d, m)
		case "tool":
			found := false
			for k := range pending {
				if p := &pending[k]; !p.answered && p.sent == m.ToolCallID {
					m.ToolCallID, p.answered, found = p.replayed, true, true
					break
				}
			}
			if !found && !validID(d.ToolCallIDs, m.ToolCallID) {
				m.ToolCallID = replayID(d.ToolCallIDs, m.ToolCallID, 0, nil)
			}
		}
	}
	return out
}

// withReasoning sets the reasoning field the dialect wants on m. A field
// the caller already put in Extra is kept (MarshalJSON sees to it).
func withReasoning(d Dialect, m *sent) {
	var r Reasoning
	if m.Reasoning != nil {
		r = *m.Reasoning
	}
	var val any
	switch d.Replay {
	case ReplayDeepSeek:
		// On every assistant message, whether its user turn called a
		// tool or not: what a message is sent with never depends on the
		// messages after it, so the prefix stays.
		m.key, val = "reasoning_content", r.Text
	case ReplayReasoningContent:
		if r.Text == "" {
			return
		}
		m.key, val = "reasoning_content", r.Text
	case ReplayReasoning:
		if r.Text == "" {
			return
		}
		m.key, val = "reasoning", r.Text
	case ReplayReasoningDetails:
		if len(bytes.TrimSpace(r.Details)) == 0 || !json.Valid(r.Details) {
			return
		}
		m.key, m.val = "reasoning_details", r.Details
		return
	default:
		return
	}
	b, err := json.Marshal(val)
	if err != nil {
		m.key = ""
		return
	}
	m.val = b
}

// maxCallID bounds a replayed id; longer ones are replaced.
const maxCallID = 256

// validID reports whether id has the form the dialect accepts.
func validID(form IDForm, id string) bool {
	if id == "" || len(id) > maxCallID {
		return false
	}
	if form == IDsMistral {
		return len(id) == 9 && isAlnum(id)
	}
	return true
}

func isAlnum(s string) bool {
	for _, c := range []byte(s) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

const base62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

// replayID derives a valid id from the sent one and its occurrence: stable
// across requests, distinct from every id in used.
func replayID(form IDForm, sent string, occurrence int, used map[string]bool) string {
	for salt := 0; ; salt++ {
		sum := sha256.Sum256(fmt.Appendf(nil, "%d\x00%d\x00%s", occurrence, salt, sent))
		var id string
		if form == IDsMistral {
			b := make([]byte, 9)
			for i := range b {
				b[i] = base62[int(sum[i])%len(base62)]
			}
			id = string(b)
		} else {
			id = fmt.Sprintf("call_%x", sum[:12])
		}
		if !used[id] {
			return id
		}
	}
}

// isJSONObject reports whether s is one JSON object.
func isJSONObject(s string) bool {
	b := bytes.TrimSpace([]byte(s))
	return len(b) > 0 && b[0] == '{' && json.Valid(b)
}

// genCallID makes an id for a call the model sent without a usable one:
// nine base-62 characters (a form every dialect accepts), derived from the
// response and the call's position so that a replayed stream gets the same.
func genCallID(seed string, pos int, used map[string]bool) string {
	return replayID(IDsMistral, "gen\x00"+seed, pos, used)
}
