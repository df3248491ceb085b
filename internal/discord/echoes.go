package discord

import (
	"encoding/json"
	"sync"
)

// echoes remembers the nonces of our own messages that the gateway echoed
// (MESSAGE_CREATE carries the nonce a send was made with), the most recent
// max of them: evidence that a send whose answer was lost went through.
type echoes struct {
	mu    sync.Mutex // guards ids, order
	ids   map[string]string
	order []string
	max   int
}

func newEchoes(max int) *echoes { return &echoes{ids: map[string]string{}, max: max} }

func (e *echoes) add(nonce, id string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, ok := e.ids[nonce]; ok {
		return
	}
	if len(e.order) == e.max {
		delete(e.ids, e.order[0])
		e.order = e.order[1:]
	}
	e.ids[nonce] = id
	e.order = append(e.order, nonce)
}

func (e *echoes) get(nonce string) (string, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	id, ok := e.ids[nonce]
	return id, ok
}

// unsettled remembers the sends this transport reported unknown, by nonce
// (the most recent max of them), so that their nonce seen later on the
// gateway settles them: unknown until the nonce or a backread settles it.
type unsettled struct {
	mu    sync.Mutex // guards ids, order
	ids   map[string]int64
	order []string
	max   int
}

func newUnsettled(max int) *unsettled { return &unsettled{ids: map[string]int64{}, max: max} }

func (u *unsettled) add(nonce string, effect int64) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if _, ok := u.ids[nonce]; ok {
		return
	}
	if len(u.order) == u.max {
		delete(u.ids, u.order[0])
		u.order = u.order[1:]
	}
	u.ids[nonce] = effect
	u.order = append(u.order, nonce)
}

// take returns the effect waiting for nonce, once.
func (u *unsettled) take(nonce string) (int64, bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	id, ok := u.ids[nonce]
	if ok {
		delete(u.ids, nonce) // its slot in order ages out with the others
	}
	return id, ok
}

// ownEcho reads the nonce and id of a MESSAGE_CREATE of ours.
func ownEcho(data []byte, botID string) (nonce, id string, ok bool) {
	if botID == "" || len(data) > MaxEventBytes {
		return "", "", false
	}
	var m struct {
		ID     string          `json:"id"`
		Nonce  json.RawMessage `json:"nonce"`
		Author struct {
			ID string `json:"id"`
		} `json:"author"`
	}
	if json.Unmarshal(data, &m) != nil || m.Author.ID != botID || !snowflake(m.ID) {
		return "", "", false
	}
	if json.Unmarshal(m.Nonce, &nonce) != nil || nonce == "" || len(nonce) > 25 {
		return "", "", false
	}
	return nonce, m.ID, true
}
