#!/bin/bash
# A real systemd (system mode) as PID 1 of a new PID + mount namespace, for the placement
# tests (systemdlab_test.go) on machines whose own PID 1 is not systemd.
#
#   systemd-lab.sh boot DIR     DIR: an empty or absent directory. Prints PID=<host pid of the
#                               namespace's PID 1>. Inside, /run is DIR/run: the system bus is
#                               /run/dbus/system_bus_socket there. Run commands inside with
#                               nsenter -t PID -m -p CMD (scope PIDs are namespace PIDs).
#   systemd-lab.sh prepare DIR  everything but the start: prints LAUNCH=<command>, to be run
#                               with setsid by a caller that wants the lab to die with it (the
#                               Go test starts it with a parent-death signal; unshare's
#                               --kill-child then takes systemd, and so the namespace, along).
#                               The caller writes DIR/launcher.pid and DIR/pid1 for halt.
#   systemd-lab.sh halt DIR     power it off, and remove its cgroups.
#
# Needs root, writable cgroup v1 hierarchies pids and memory under /sys/fs/cgroup, util-linux
# (unshare, nsenter, setsid), and Debian's systemd and dbus packages. Every unit that would
# touch the shared host (tmpfiles wiping /tmp, udev, sysctl, timers, journald's /dev/log, …)
# is masked.
set -eu
cmd=${1:?usage: systemd-lab.sh boot|halt DIR}
LAB=$(realpath -m "${2:?usage: systemd-lab.sh boot|halt DIR}")
RUN=$LAB/run
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
boot|prepare) ;;
*) echo "usage: systemd-lab.sh boot|prepare|halt DIR" >&2; exit 2 ;;
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
  for old in /sys/fs/cgroup/$h/klbr-placement-lab-*; do
    [ -d "$old" ] || continue
    [ -z "$(find "$old" -name cgroup.procs -exec cat {} + 2>/dev/null)" ] || continue
    find "$old" -depth -type d -exec rmdir {} \; 2>/dev/null || true
  done
done
CG=klbr-placement-lab-$$
mkdir -p "$LAB"; rm -rf "$RUN"; mkdir -p "$RUN/systemd/system"
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
printf '[Unit]\nDescription=klbr placement test target\nWants=sockets.target dbus.socket\n' > "$RUN/systemd/system/lab.target"
cat > "$LAB/inner" <<IN
#!/bin/bash
set -e
for h in $HIERARCHIES; do [ -d /sys/fs/cgroup/\$h/$CG ] && echo 0 > /sys/fs/cgroup/\$h/$CG/cgroup.procs; done
mount --bind "$RUN" /run
export container=klbr-lab
exec /lib/systemd/systemd --system --unit=lab.target --log-target=console --log-level=info
IN
chmod +x "$LAB/inner"
if [ "$cmd" = prepare ]; then
  echo "LAUNCH=unshare --pid --fork --kill-child --mount --propagation private --mount-proc $LAB/inner"
  exit 0
fi
setsid unshare --pid --fork --kill-child --mount --propagation private --mount-proc "$LAB/inner" \
  >"$LAB/systemd.log" 2>&1 </dev/null &
launcher=$!
echo "$launcher" > "$LAB/launcher.pid"
for _ in $(seq 1 200); do
  [ -S "$RUN/systemd/private" ] && [ -S "$RUN/dbus/system_bus_socket" ] && break
  kill -0 "$launcher" 2>/dev/null || { echo "systemd-lab: systemd exited; see $LAB/systemd.log" >&2; halt; exit 1; }
  sleep 0.1
done
if ! [ -S "$RUN/systemd/private" ] || ! [ -S "$RUN/dbus/system_bus_socket" ]; then
  echo "systemd-lab: systemd and its bus did not come up in 20 s; see $LAB/systemd.log" >&2; halt; exit 1
fi
pid1=$(cat "/proc/$launcher/task/$launcher/children")
pid1=${pid1%% *}
echo "$pid1" > "$LAB/pid1"
echo "PID=$pid1"
