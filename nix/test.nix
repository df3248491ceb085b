# A NixOS VM running services.klbr as a user would: the sockets are enabled
# at boot and the daemon starts on the first connection; the operator CLI finds
# it through KLBR_CONTROL_SOCKET; /metrics answers; a cell runs in its own
# klbr-workbench-….scope with the configured limits (the polkit rule at
# work); `systemctl stop` drains an accepted cell before the daemon exits,
# and the next connection starts it again with nothing lost.
#
# Run it with `nix flake check` or `nix build .#checks.x86_64-linux.vm`.
{ self }:
{
  name = "klbr";

  nodes.machine =
    { pkgs, ... }:
    {
      imports = [ self.nixosModules.default ];

      services.klbr = {
        enable = true;
        settings.limits = {
          memory_max = "512M";
          tasks_max = 64;
        };
      };

      environment.systemPackages = [ pkgs.curl ];
      virtualisation.memorySize = 2048;
    };

  testScript = ''
    import json
    import shlex


    def cli(*args):
        # A login shell, as an administrator's: /etc/profile sets
        # KLBR_CONTROL_SOCKET (environment.variables).
        cmd = "klbr-core " + " ".join(shlex.quote(a) for a in args)
        return machine.succeed("bash -lc " + shlex.quote(cmd))


    def records(session="default"):
        out = cli("tail", session, "--json")
        return [json.loads(line) for line in out.splitlines() if line.strip()]


    def show(unit, prop):
        return machine.succeed(f"systemctl show -p {prop} --value {unit}").strip()


    sockets = ["klbr-core.socket", "klbr-core-control.socket", "klbr-core-ingress.socket"]
    machine.wait_for_unit("sockets.target")
    for socket in sockets:
        machine.wait_for_unit(socket)
    machine.succeed("test $(stat -c %U:%a /run/klbr/control.sock) = klbr:600")
    machine.succeed("test $(stat -c %G:%a /run/klbr/ingress.sock) = klbr-ingress:660")

    with subtest("the socket starts the daemon on the first connection"):
        assert show("klbr-core.service", "ActiveState") == "inactive", "klbr-core runs before any connection"
        input_id = cli("send", "default", "hi").strip()
        assert input_id, "send printed no id"
        machine.wait_for_unit("klbr-core.service")
        assert show("klbr-core.service", "User") == "klbr"

    with subtest("the operator CLI reads the session back"):
        recs = records()
        inputs = [r for r in recs if r["lane"] == "input" and r["content"].get("text") == "hi"]
        assert len(inputs) == 1, recs
        status = cli("status")
        assert "serving" in status, status

    with subtest("/healthz and /metrics"):
        machine.succeed("curl -sf http://127.0.0.1:8765/healthz | grep -q ok")
        metrics = machine.succeed("curl -sf http://127.0.0.1:8765/metrics")
        for want in [
            'klbr_admissions_total{result="accepted",source_kind="operator"} 1',
            "klbr_inbox_pending_inputs{",
            "klbr_build_info{",
            "klbr_sqlite_info{",
            'klbr_placement_mode{mode="systemd-scope"} 1',
        ]:
            assert want in metrics, f"{want} not in /metrics:\n{metrics}"

    with subtest("a cell runs in its own scope with the configured limits"):
        out = cli("exec", "default", "print(6 * 7)")
        assert "42" in out, out
        scopes = machine.succeed(
            "systemctl list-units --type=scope --all --plain --no-legend 'klbr-workbench-*' | cut -d' ' -f1"
        ).split()
        assert len(scopes) == 1, scopes
        scope = scopes[0]
        assert show(scope, "Slice") == "klbr.slice", show(scope, "Slice")
        assert show(scope, "MemoryMax") == str(512 * 1024 * 1024), show(scope, "MemoryMax")
        assert show(scope, "TasksMax") == "64", show(scope, "TasksMax")

    with subtest("systemctl stop drains: an accepted cell finishes and is recorded"):
        machine.succeed(
            "bash -lc "
            + shlex.quote(
                "klbr-core exec default 'import time; time.sleep(3); print(\"slept\")'"
                " >/tmp/cell.out 2>&1 &"
            )
        )
        machine.wait_until_succeeds(
            "bash -lc 'klbr-core tail default --json' | grep -q 'time.sleep(3)'"
        )
        machine.succeed("systemctl stop klbr-core.service")
        assert show("klbr-core.service", "ActiveState") == "inactive"
        assert show("klbr-core.service", "Result") == "success", show("klbr-core.service", "Result")
        # The durable record is the contract (checked below); what the CLI
        # printed is for the log.
        print(machine.execute("cat /tmp/cell.out")[1])
        for socket in sockets:
            assert show(socket, "ActiveState") == "active", f"{socket} went down with the service"

    with subtest("the next connection starts it again with nothing lost"):
        recs = records()
        assert any(r["lane"] == "input" and r["content"].get("text") == "hi" for r in recs), recs
        finished = [r for r in recs if r["kind"] == "cell.finished" and "slept" in json.dumps(r["content"])]
        assert finished, recs
        machine.wait_for_unit("klbr-core.service")
  '';
}
