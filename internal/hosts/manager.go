package hosts

// Which service manager runs a host's units, and what that takes of the
// commands. By default it is the login's own user manager (systemd --user,
// kept running by lingering): a transient unit of it cannot change user, so
// whoever holds klbr-core's key for the host can do no more there than the
// login itself. With manager = "system" it is the host's system manager,
// reached through a polkit rule or as root; polkit cannot see the
// properties of a transient unit (its User=), so that key is worth the
// host's root.

// prelude goes before every script run on the host. For the user manager it
// points systemctl at it, whatever the script asks (a non-interactive SSH
// session may have no XDG_RUNTIME_DIR: it is set here, where systemd puts
// the login's runtime directory).
func (c *conn) prelude() string {
	if !c.h.UserManager {
		return ""
	}
	return `XDG_RUNTIME_DIR=/run/user/$(id -u); export XDG_RUNTIME_DIR
systemctl() { command systemctl --user "$@"; }
`
}

// managerFlag goes after systemd-run: which manager gets the unit.
func (c *conn) managerFlag() []string {
	if !c.h.UserManager {
		return nil
	}
	return []string{"--user"}
}

// identity is the shell of the properties that keep a unit at the login's
// uid. A transient system service runs as root unless told otherwise, even
// when an unprivileged login asked for it through polkit: User= keeps it at
// the login's own uid. A user manager's unit runs as the login anyway; it
// gets its containment's mount namespace only inside a user namespace of
// its own (PrivateUsers=), which maps the login's uid and no other.
func (c *conn) identity() string {
	if !c.h.UserManager {
		return `-p "User=$(id -un)"`
	}
	return `-p PrivateUsers=yes`
}

// managerCheck goes after inspectScript: with the user manager, one line
// "@manager VERSION|- yes|no CONTROLLERS...": whether it answers, whether
// the login lingers, and which cgroup controllers its units may use (none
// on a cgroup v1 host: its limits would not hold).
func (c *conn) managerCheck() string {
	if !c.h.UserManager {
		return ""
	}
	return `v=$(systemctl show --property=Version --value 2>/dev/null | head -n 1)
cg=$(systemctl show --property=ControlGroup --value 2>/dev/null | head -n 1)
l=no; [ -e "/var/lib/systemd/linger/$(id -un)" ] && l=yes
ctl=; [ -n "$cg" ] && ctl=$(head -c 200 "/sys/fs/cgroup$cg/cgroup.controllers" 2>/dev/null)
echo "@manager ${v:--} $l" $ctl
`
}
