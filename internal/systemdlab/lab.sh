#!/bin/bash
# A real systemd (system mode) as PID 1 of new PID, mount and network namespaces, for tests on
# machines whose own PID 1 is not systemd (package systemdlab runs it; see its doc):
#
#   - its own network namespace (systemd brings its loopback up), so a socket unit's
#     127.0.0.1:8765 is the lab's own and never collides with the host's;
#   - /var/lib is DIR/varlib inside, so StateDirectory=klbr is DIR/varlib/klbr on the host and
#     units run unchanged, without touching the host's /var/lib;
#   - /run is DIR/run inside: units go in DIR/run/systemd/system, the system bus is
#     DIR/run/dbus/system_bus_socket, and files put under DIR/run are visible to services
#     that have a private /tmp.
#
#   systemd-lab.sh prepare DIR  everything but the start: the caller runs
#                               unshare --pid --fork --kill-child --mount --propagation private
#                               --net --mount-proc DIR/inner with setsid and a parent-death
#                               signal, and writes DIR/launcher.pid and DIR/pid1 for halt.
#   systemd-lab.sh halt DIR     power it off, and remove its cgroups.
#
# LAB_NAME (default klbr-lab) prefixes the lab's cgroups; each test package uses its own, so
# the sweep of cgroups that dead labs left never touches another package's running lab.
#
# Run commands inside with nsenter -t PID1 -m -p -n CMD. Needs root, writable cgroup v1
# hierarchies pids and memory under /sys/fs/cgroup, util-linux, Debian's systemd and dbus.
# Every unit that would touch the shared host (tmpfiles wiping /tmp, udev, sysctl, timers,
# journald's /dev/log, …) is masked.
set -eu
cmd=${1:?usage: systemd-lab.sh prepare|halt DIR}
LAB=$(realpath -m "${2:?usage: systemd-lab.sh prepare|halt DIR}")
RUN=$LAB/run
NAME=${LAB_NAME:-klbr-lab}
case $NAME in *[!a-z0-9-]*|'') echo "systemd-lab: LAB_NAME must be lowercase letters, digits and -" >&2; exit 2 ;; esac
HIERARCHIES="systemd pids memory cpu cpuacct unified"

halt() {
  [ -f "$LAB/pid1" ] && nsenter -t "$(cat "$LAB/pid1")" -m -p systemctl poweroff >/dev/null 2>&1 || true
  launcher=$(cat "$LAB/launcher.pid" 2>/dev/null || true)
  if [ -n "$launcher" ]; then
    for _ in $(seq 1 100); do kill -0 "$launcher" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$launcher" 2>/dev/null && kill -KILL "$launcher"
  fi
  CG=$(cat "$LAB/cgroup" 2>/dev/null || true)
  if [ -n "$CG" ]; then
    for h in $HIERARCHIES; do
      [ -d "/sys/fs/cgroup/$h/$CG" ] && find "/sys/fs/cgroup/$h/$CG" -depth -type d -exec rmdir {} \; 2>/dev/null
    done
  fi
  rm -f "$LAB/pid1" "$LAB/launcher.pid"
  return 0
}

case $cmd in
halt) halt; exit 0 ;;
prepare) ;;
*) echo "usage: systemd-lab.sh prepare|halt DIR" >&2; exit 2 ;;
esac

[ "$(id -u)" = 0 ] || { echo "systemd-lab: needs root" >&2; exit 2; }
[ -x /lib/systemd/systemd ] || { echo "systemd-lab: /lib/systemd/systemd missing (apt-get install -y systemd dbus)" >&2; exit 2; }
command -v dbus-daemon >/dev/null || { echo "systemd-lab: dbus-daemon missing (apt-get install -y dbus)" >&2; exit 2; }
for tool in unshare nsenter setsid; do
  command -v $tool >/dev/null || { echo "systemd-lab: $tool missing (util-linux)" >&2; exit 2; }
done
for h in pids memory; do
  [ -w /sys/fs/cgroup/$h ] || { echo "systemd-lab: no writable cgroup v1 hierarchy /sys/fs/cgroup/$h" >&2; exit 2; }
done

# Labs of test binaries that died (their namespaces died with them) leave empty cgroups.
for h in $HIERARCHIES; do
  for old in /sys/fs/cgroup/$h/$NAME-*; do
    [ -d "$old" ] || continue
    [ -z "$(find "$old" -name cgroup.procs -exec cat {} + 2>/dev/null)" ] || continue
    find "$old" -depth -type d -exec rmdir {} \; 2>/dev/null || true
  done
done
CG=$NAME-$$
mkdir -p "$LAB" "$LAB/varlib"; rm -rf "$RUN"; mkdir -p "$RUN/systemd/system"
# dbus-daemon finds the machine id in /var/lib/dbus or /etc.
[ -f /var/lib/dbus/machine-id ] && mkdir -p "$LAB/varlib/dbus" && cp /var/lib/dbus/machine-id "$LAB/varlib/dbus/"
echo "$CG" > "$LAB/cgroup"
for h in $HIERARCHIES; do [ -d /sys/fs/cgroup/$h ] && mkdir -p /sys/fs/cgroup/$h/$CG; done
for u in systemd-tmpfiles-setup.service systemd-tmpfiles-setup-dev.service systemd-tmpfiles-clean.timer \
  systemd-udevd.service systemd-udev-trigger.service systemd-udev-settle.service systemd-udevd-control.socket \
  systemd-udevd-kernel.socket systemd-sysctl.service systemd-modules-load.service kmod-static-nodes.service \
  systemd-binfmt.service proc-sys-fs-binfmt_misc.automount systemd-firstboot.service systemd-sysusers.service \
  systemd-machine-id-commit.service systemd-random-seed.service systemd-repart.service systemd-pcrphase-sysinit.service \
  systemd-pcrphase.service systemd-timesyncd.service systemd-pstore.service systemd-remount-fs.service \
  systemd-hwdb-update.service systemd-update-utmp.service systemd-journal-flush.service systemd-journald-audit.socket \
  systemd-journald-dev-log.socket sys-kernel-config.mount sys-kernel-debug.mount sys-kernel-tracing.mount \
  sys-fs-fuse-connections.mount dev-hugepages.mount dev-mqueue.mount apt-daily.timer apt-daily-upgrade.timer \
  dpkg-db-backup.timer e2scrub_all.timer fstrim.timer man-db.timer postgresql.service redis-server.service \
  getty.target console-getty.service; do
  ln -sf /dev/null "$RUN/systemd/system/$u"
done
printf '[Unit]\nDescription=klbr test lab target\nWants=sockets.target dbus.socket\n' > "$RUN/systemd/system/lab.target"
cat > "$LAB/inner" <<IN
#!/bin/bash
set -e
for h in $HIERARCHIES; do [ -d /sys/fs/cgroup/\$h/$CG ] && echo 0 > /sys/fs/cgroup/\$h/$CG/cgroup.procs; done
mount --bind "$RUN" /run
mount --bind "$LAB/varlib" /var/lib
export container=klbr-lab
exec /lib/systemd/systemd --system --unit=lab.target --log-target=console --log-level=info
IN
chmod +x "$LAB/inner"
echo "LAUNCH=unshare --pid --fork --kill-child --mount --propagation private --net --mount-proc $LAB/inner"
