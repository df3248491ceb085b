# The NixOS module services.klbr-worker: a worker host klbr-core reaches over
# SSH (docs/hosts.md). No klbr daemon runs here: klbr-core logs in as an
# unprivileged system user and starts each job attempt as a transient unit
# of this machine's systemd (klbr-job-<job>-<attempt>.service in klbr.slice).
# This module makes that account, authorizes klbr-core's key for it, lets it
# manage klbr-* units and nothing else (polkit), installs klbr.slice and the
# klbr package (klbr-kernel and the runtime), and enables sshd.
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
    enable = mkEnableOption "a klbr worker host: klbr-core logs in over SSH and runs jobs as transient units of this machine's systemd";

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
        shell; any other must exist. Its jobs run as this user, never as
        root, and it may manage only units named `klbr-*` (polkit).
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

    # klbr.slice from the package (nix/systemd/klbr.slice): every job unit
    # goes there, and limits set on it bound all of them together.
    systemd.packages = [ cfg.package ];

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
      # Another user exists already; either way it gets the keys.
      { ${cfg.user}.openssh.authorizedKeys.keys = cfg.authorizedKeys; }
    ];
    users.groups = mkIf (cfg.group == "klbr") { klbr = { }; };

    # The login starts its transient units over the system bus
    # (systemd-run, systemctl stop/reset-failed). This lets it manage units
    # named klbr-* and nothing else; the units run as the login (User=).
    security.polkit.enable = true;
    security.polkit.extraConfig = ''
      // services.klbr-worker: klbr-core's login may manage klbr-* units only.
      polkit.addRule(function (action, subject) {
        if (action.id == "org.freedesktop.systemd1.manage-units" &&
            subject.user == ${builtins.toJSON cfg.user}) {
          var unit = action.lookup("unit");
          if (typeof unit == "string" && /^klbr-[^\/]+\.(service|scope)$/.test(unit)) {
            return polkit.Result.YES;
          }
        }
      });
    '';
  };
}
