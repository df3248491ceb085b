package ingress

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/klbr-dev/klbr/internal/ingress/ingressapi"
)

// TestHalfCloseGetsTheCommit: a transport that half-closes after a complete admit request
// still gets the committed ids, never an empty 200, and the message is stored.
func TestHalfCloseGetsTheCommit(t *testing.T) {
	c := startCore(t, t.TempDir())
	body, _ := json.Marshal(ingressapi.AdmitRequest{Messages: []ingressapi.Message{msg("9001", "30", ingressapi.ModeDM, "half-closed")}})
	conn, err := net.Dial("unix", c.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /v1/inputs HTTP/1.1\r\nHost: klbr\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	conn.(*net.UnixConn).CloseWrite()
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	var got ingressapi.AdmitResponse
	if resp.StatusCode != http.StatusOK || json.Unmarshal(b, &got) != nil || len(got.Results) != 1 || got.Results[0].InputID == 0 {
		t.Fatalf("half-closed admit answered %d %q, want 200 with the input id", resp.StatusCode, b)
	}
	// It was stored: the same message again is a duplicate of that very input.
	again, err := c.client.Admit(context.Background(), ingressapi.AdmitRequest{Messages: []ingressapi.Message{msg("9001", "30", ingressapi.ModeDM, "half-closed")}})
	if err != nil || !again.Results[0].Duplicate || again.Results[0].InputID != got.Results[0].InputID {
		t.Fatalf("re-admit: %+v %v; want a duplicate of input %d", again, err, got.Results[0].InputID)
	}
}
