package worker

import (
	"os"
	"path/filepath"
	"testing"
)

// The forwarded connection reaches the unit's kernel by its handle on its
// socket: a cell that moves the socket away and puts a link to a socket of
// its own at its path neither unhooks its worker (a new connection, after
// the SSH master was killed, reattaches it with its heap) nor receives
// klbr-core's connection.
func TestRemoteWorkbenchForwardIgnoresALink(t *testing.T) {
	h, e := remoteLab(t)
	w, _ := startRemote(t, e, 1)
	o := run(t, w, "e1", `import os, socket, threading
s = socket.socket(socket.AF_UNIX)
s.bind("decoy.sock")
s.listen(4)
def watch():
    while True:
        c, _ = s.accept()
        open("decoy-reached", "a").write("x")
        c.close()
threading.Thread(target=watch, daemon=True).start()
os.rename("protocol.sock", "moved.sock")
os.symlink(os.path.abspath("decoy.sock"), "protocol.sock")
y = 7`)
	if o.Status != "ok" {
		t.Fatalf("the cell that put the link: %+v %+v", o, o.Error)
	}
	killChildren(t, "ControlPersist=no")
	if o := run(t, w, "e2", "y + 1"); o.Status != "ok" || o.Value == nil || *o.Value != "8" {
		t.Fatalf("after the master was killed, the worker was not reattached: %+v\n%s", o, w.Diagnostics())
	}
	if _, err := os.Stat(filepath.Join(h.WorkDir, "klbr-workbench-s1-1.service", "decoy-reached")); err == nil {
		t.Fatal("klbr-core's connection reached the socket the cell's link names")
	}
}
