# The NixOS module services.klbr-worker: a worker host klbr-core reaches over
# SSH (docs/hosts.md). No klbr daemon runs here: klbr-core logs in as an
# unprivileged system user and starts each job attempt as a transient unit
# of that user's own service manager (systemd --user; klbr-job-<job>-
# <attempt>.service in klbr.slice), kept running without a session by
# lingering. A unit of a user manager cannot change user, so klbr-core's key
# is worth exactly this account here, and no polkit rule is needed.
# This module makes that account (lingering), authorizes klbr-core's key for
# it, gives its manager klbr.slice, installs the klbr package (klbr-kernel
# and the runtime), and enables sshd.
{
  config,
  lib,
  pkgs,
  ...
}:

let
  inherit (lib)
    mkEnableOption
    mkIf
    mkMerge
    mkOption
    mkPackageOption
    types
    ;

  cfg = config.services.klbr-worker;
in
{
  options.services.klbr-worker = {
    enable = mkEnableOption "a klbr worker host: klbr-core logs in over SSH and runs jobs as transient units of the login's own systemd user manager";

    package = mkPackageOption pkgs "klbr" {
      extraDescription = ''
        Its klbr-kernel and runtime run the host's workers. The flake's
        `nixosModules.worker` sets this to the flake's own package.
      '';
    };

    user = mkOption {
      type = types.str;
      default = "klbr";
      description = ''
        The account klbr-core logs in as ([hosts.NAME] ssh = "USER@host").
        The default is created as an unprivileged system user with a login
        shell; any other must exist. It lingers (its user manager runs
        without a session), and its jobs are units of that manager: they run
        as this user and cannot run as any other.
      '';
    };

    group = mkOption {
      type = types.str;
      default = "klbr";
      description = "The primary group of the worker account.";
    };

    home = mkOption {
      type = types.str;
      default = "/var/lib/klbr-worker";
      description = ''
        The worker account's home: the default work directory
        (~/.cache/klbr/work) is under it. A job sees none of it but its own
        directory.
      '';
    };

    authorizedKeys = mkOption {
      type = types.listOf types.singleLineStr;
      default = [ ];
      example = [ "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAA... klbr-core@home" ];
      description = ''
        The public keys that may log in as the worker account: klbr-core's
        (the public half of its [hosts.NAME] identity_file). One key for
        klbr only.
      '';
    };

    openFirewall = mkOption {
      type = types.bool;
      default = true;
      description = "Whether to open sshd's ports (services.openssh.openFirewall).";
    };
  };

  config = mkIf cfg.enable {
    assertions = [
      {
        assertion = cfg.authorizedKeys != [ ];
        message = "services.klbr-worker.authorizedKeys is empty: add klbr-core's public key (ssh-keygen -y -f its identity_file), or it cannot log in.";
      }
      {
        assertion = cfg.user != "root";
        message = "services.klbr-worker.user must not be root: jobs run as the login.";
      }
    ];

    environment.systemPackages = [ cfg.package ];

    # The package's units (nix/systemd/klbr.slice among them) for the
    # system manager.
    systemd.packages = [ cfg.package ];

    # klbr.slice of the login's user manager: every job unit goes there,
    # and limits set on it bound all of them together (on cgroup v2, which
    # lets a user manager enforce memory, pids and cpu limits).
    systemd.user.slices.klbr = {
      description = "klbr jobs and workers started by klbr-core over SSH";
      sliceConfig = {
        MemoryAccounting = true;
        TasksAccounting = true;
        CPUAccounting = true;
      };
    };

    services.openssh = {
      enable = true;
      inherit (cfg) openFirewall;
    };

    users.users = mkMerge [
      (mkIf (cfg.user == "klbr") {
        klbr = {
          isSystemUser = true;
          group = cfg.group;
          home = cfg.home;
          createHome = true;
          # klbr-core runs its commands through the login's shell.
          useDefaultShell = true;
          description = "klbr worker (jobs started by klbr-core over SSH)";
        };
      })
      # Another user exists already; either way it gets the keys, and
      # lingers: its user manager, which runs the jobs, starts at boot and
      # outlives klbr-core's SSH sessions.
      {
        ${cfg.user} = {
          openssh.authorizedKeys.keys = cfg.authorizedKeys;
          linger = true;
        };
      }
    ];
    users.groups = mkIf (cfg.group == "klbr") { klbr = { }; };
  };
}
