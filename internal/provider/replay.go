package provider

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
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
func replay(d Dialect, msgs []Message) []Message {
	out := make([]Message, len(msgs))
	copy(out, msgs)
	spanCalls := deepSeekSpans(d, out)
	used := map[string]bool{}
	seen := map[string]int{}         // occurrences of each sent id so far
	pending := map[string][]string{} // the last assistant message's ids: sent → replayed, in order
	span := 0
	for i := range out {
		m := &out[i]
		switch m.Role {
		case "user":
			span++
		case "assistant":
			if len(m.ToolCalls) > 0 {
				clear(pending)
				calls := make([]ToolCall, len(m.ToolCalls))
				for j, c := range m.ToolCalls {
					n := seen[c.ID]
					seen[c.ID]++
					id := c.ID
					if !validID(d.ToolCallIDs, id) || used[id] {
						id = replayID(d.ToolCallIDs, c.ID, n, used)
					}
					used[id] = true
					pending[c.ID] = append(pending[c.ID], id)
					c.ID = id
					if !isJSONObject(c.Function.Arguments) {
						c.Function.Arguments = "{}"
					}
					if c.Type == "" {
						c.Type = "function"
					}
					calls[j] = c
				}
				m.ToolCalls = calls
			}
			m.Extra = withReasoning(d, *m, spanCalls[span], m.Extra)
		case "tool":
			if q := pending[m.ToolCallID]; len(q) > 0 {
				m.ToolCallID, pending[m.ToolCallID] = q[0], q[1:]
			} else if !validID(d.ToolCallIDs, m.ToolCallID) {
				m.ToolCallID = replayID(d.ToolCallIDs, m.ToolCallID, 0, nil)
			}
		}
	}
	return out
}

// deepSeekSpans reports, per user span (the messages after the n-th user
// message), whether an assistant message in it called a tool; nil for
// other dialects.
func deepSeekSpans(d Dialect, msgs []Message) map[int]bool {
	if d.Replay != ReplayDeepSeek {
		return nil
	}
	spans := map[int]bool{}
	span := 0
	for _, m := range msgs {
		switch {
		case m.Role == "user":
			span++
		case m.Role == "assistant" && len(m.ToolCalls) > 0:
			spans[span] = true
		}
	}
	return spans
}

// withReasoning adds the message's stored reasoning to extra as the
// dialect wants it. A field the caller already put in Extra is kept.
func withReasoning(d Dialect, m Message, spanHasCalls bool, extra json.RawMessage) json.RawMessage {
	var key string
	var val any
	switch d.Replay {
	case ReplayDeepSeek:
		if !spanHasCalls {
			return extra
		}
		key, val = "reasoning_content", m.Reasoning
	case ReplayReasoningContent:
		if m.Reasoning == "" {
			return extra
		}
		key, val = "reasoning_content", m.Reasoning
	case ReplayReasoning:
		if m.Reasoning == "" {
			return extra
		}
		key, val = "reasoning", m.Reasoning
	case ReplayReasoningDetails:
		if len(bytes.TrimSpace(m.ReasoningDetails)) == 0 || !json.Valid(m.ReasoningDetails) {
			return extra
		}
		key, val = "reasoning_details", m.ReasoningDetails
	default:
		return extra
	}
	fields := map[string]json.RawMessage{}
	if len(bytes.TrimSpace(extra)) > 0 {
		if json.Unmarshal(extra, &fields) != nil {
			return extra // MarshalJSON reports the bad Extra
		}
	}
	if _, ok := fields[key]; ok {
		return extra
	}
	b, err := json.Marshal(val)
	if err != nil {
		return extra
	}
	fields[key] = b
	var buf bytes.Buffer
	buf.WriteByte('{')
	for i, k := range slices.Sorted(maps.Keys(fields)) {
		if i > 0 {
			buf.WriteByte(',')
		}
		kb, _ := json.Marshal(k)
		buf.Write(kb)
		buf.WriteByte(':')
		buf.Write(fields[k])
	}
	buf.WriteByte('}')
	return buf.Bytes()
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
