package web

import (
	"encoding/json"
	"errors"
	"testing"
)

func FuzzDecodeClientMessage(f *testing.F) {
	for _, s := range []string{
		`{"type":"hello","session":"default","cursor":0}`,
		`{"type":"hello","session":"default","cursor":0,"tail":2000}`,
		`{"type":"send","text":"hi","key":"web-1"}`,
		`{"type":"drain"}`,
		`{"type":"stop"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := DecodeClientMessage(b)
		if err != nil {
			if !errors.Is(err, ErrBadMessage) {
				t.Fatalf("error %v does not wrap ErrBadMessage", err)
			}
			if m != (ClientMessage{}) {
				t.Fatalf("a rejected message decoded to %+v", m)
			}
			return
		}
		// An accepted message survives a round trip unchanged.
		again, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		m2, err := DecodeClientMessage(again)
		if err != nil || m2 != m {
			t.Fatalf("round trip: %+v -> %s -> %+v, %v", m, again, m2, err)
		}
		switch m.Type {
		case MsgHello:
			if m.Cursor < 0 || m.Session == "" {
				t.Fatalf("accepted hello %+v", m)
			}
		case MsgSend:
			if m.Text == "" || m.Key == "" {
				t.Fatalf("accepted send %+v", m)
			}
		case MsgJobCancel:
			if m.Job <= 0 {
				t.Fatalf("accepted job_cancel %+v", m)
			}
		case MsgSpendCap:
			if m.Cap != "daily" && m.Cap != "monthly" || !(m.USD > 0 && m.USD <= MaxCapUSD) {
				t.Fatalf("accepted spend_cap %+v", m)
			}
		case MsgDrain, MsgStop, MsgReset, MsgCompact, MsgSessionDrain, MsgSessionStop, MsgSessionPause, MsgSessionStart,
			MsgActivate, MsgRollback, MsgEditSoul:
		default:
			t.Fatalf("accepted type %q", m.Type)
		}
	})
}

func TestDecodeClientMessage(t *testing.T) {
	for _, tc := range []struct {
		in string
		ok bool
	}{
		{`{"type":"hello","session":"default","cursor":5}`, true},
		{`{"type":"hello","session":"default"}`, true},
		{`{"type":"hello","session":"default","cursor":-1}`, false},
		{`{"type":"hello","session":"default","cursor":0,"tail":2000}`, true},
		{`{"type":"hello","session":"default","cursor":0,"tail":-1}`, false},
		{`{"type":"hello","session":"default","cursor":0,"tail":1048577}`, false},
		{`{"type":"hello","session":"../x","cursor":0}`, false},
		{`{"type":"hello","session":"default","cursor":0,"text":"x"}`, false},
		{`{"type":"send","text":"hi","key":"k"}`, true},
		{`{"type":"send","text":"","key":"k"}`, false},
		{`{"type":"send","text":"hi"}`, false},
		{`{"type":"send","text":"hi","key":"k","session":"other"}`, false},
		{`{"type":"drain"}`, true},
		{`{"type":"drain","key":"k"}`, false},
		{`{"type":"stop"} {"type":"stop"}`, false},
		{`{"type":"shutdown"}`, false},
		{`{"type":"delta"}`, false},
		{`{"cursor":1}`, false},
		{`{"type":"send","text":"hi","key":"k","role":"system"}`, false},
		{"{\"type\":\"send\",\"text\":\"a\xff\",\"key\":\"k\"}", false},
		{`[]`, false},
		{``, false},
	} {
		_, err := DecodeClientMessage([]byte(tc.in))
		if (err == nil) != tc.ok {
			t.Errorf("%s: err %v, want ok=%v", tc.in, err, tc.ok)
		}
	}
}
