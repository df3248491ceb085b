# The Home Manager module services.klbr: klbr as systemd user services, for
# a machine the user does not administer (no root, no NixOS module, no
# polkit rule). The flake exports it as homeManagerModules.default.
#
# The units are the shipped ones (nix/systemd) made for a user manager:
# klbr-core starts on the first connection to one of its three sockets
# (the HTTP listener on loopback, $XDG_RUNTIME_DIR/klbr/control.sock and
# $XDG_RUNTIME_DIR/klbr/ingress.sock), keeps its data in
# ~/.local/state/klbr, and places its workers in transient scopes under the
# user manager's klbr.slice (through the manager's own socket,
# $XDG_RUNTIME_DIR/systemd/private). klbr-discord, when enabled, is a user
# service of its own. `settings` is the NixOS module's type (nix/settings.nix).
{
  config,
  lib,
  pkgs,
  ...
}:

let
  inherit (lib)
    mkDefault
    mkEnableOption
    mkIf
    mkMerge
    mkOption
    mkPackageOption
    types
    ;

  cfg = config.services.klbr;
  settingsLib = import ./settings.nix { inherit lib pkgs; };
  configFile = settingsLib.format.generate "klbr.toml" cfg.settings;

  # What klbr-core's workers and a child's `git worktree add` find; NixOS
  # gives a system service the same tools besides git.
  servicePath = lib.makeBinPath [
    pkgs.git
    pkgs.coreutils
    pkgs.findutils
    pkgs.gnugrep
    pkgs.gnused
  ];

  # The sandboxing a user manager applies without privileges (seccomp and
  # no_new_privs): the namespace-based settings of the system units
  # (ProtectSystem=, PrivateTmp=, …) need unprivileged user namespaces,
  # which a machine one does not administer may not allow, and a user
  # service runs with the user's rights anyway.
  sandbox = {
    NoNewPrivileges = true;
    RestrictAddressFamilies = "AF_UNIX AF_INET AF_INET6";
    RestrictNamespaces = true;
    RestrictRealtime = true;
    RestrictSUIDSGID = true;
    LockPersonality = true;
    SystemCallArchitectures = "native";
    SystemCallErrorNumber = "EPERM";
    UMask = "0077";
  };

  # With services.klbr.sandbox.namespaces: the system units' mount and
  # kernel protections, which a user manager sets up in a user namespace of
  # the service's own. Home stays readable: secret files may live there.
  namespaceSandbox = lib.optionalAttrs cfg.sandbox.namespaces {
    ProtectSystem = "strict";
    ProtectHome = "read-only";
    PrivateTmp = true;
    PrivateDevices = true;
    ProtectKernelTunables = true;
    ProtectKernelModules = true;
    ProtectKernelLogs = true;
    ProtectControlGroups = true;
    ProtectClock = true;
    ProtectHostname = true;
  };
in
{
  options.services.klbr = {
    enable = mkEnableOption "klbr, the persistent personal agent, as systemd user services (klbr-core, started by its sockets)";

    package = mkPackageOption pkgs "klbr" {
      extraDescription = ''
        The flake's `homeManagerModules.default` sets this to the flake's
        own package.
      '';
    };

    # The NixOS module's type. A secret is named by its path (a file only
    # this user reads, outside the Nix store: the assertion checks).
    settings = settingsLib.mkOption { credentialDir = "/home/alice/.config/klbr/secrets"; };

    httpAddress = mkOption {
      type = types.strMatching "(127[.][0-9.]+|[[]::1[]]):[0-9]+";
      default = "127.0.0.1:8765";
      example = "127.0.0.1:8766";
      description = ''
        The loopback address of klbr-core's HTTP listener (browser, /healthz,
        /metrics): klbr-core.socket's ListenStream=. Change it where another
        klbr (a system one, another user's) holds 8765.
      '';
    };

    sandbox.namespaces = mkOption {
      type = types.bool;
      default = false;
      description = ''
        Whether the user services also get the system units' mount and
        kernel protections (ProtectSystem=strict, ProtectHome=read-only,
        PrivateTmp=, PrivateDevices=, ProtectKernel*=, …). A user manager
        sets these up in a user namespace, so they need unprivileged user
        namespaces (`sysctl kernel.unprivileged_userns_clone` or
        `user.max_user_namespaces` above 0); where the kernel refuses them
        the services do not start. Without them the services keep the
        seccomp and no_new_privs sandboxing every user manager can apply.
      '';
    };

    discord = {
      enable = mkEnableOption "klbr-discord, the Discord transport, as a user service";

      tokenFile = mkOption {
        type = types.nullOr types.externalPath;
        default = null;
        example = "/home/alice/.config/klbr/secrets/discord-token";
        description = ''
          A file holding the Discord bot token, outside the Nix store and
          readable only by you; it becomes klbr.toml's `discord.token_file`.
        '';
      };
    };
  };

  config = mkIf cfg.enable (mkMerge [
    {
      assertions = [
        {
          assertion = cfg.discord.enable -> cfg.discord.tokenFile != null;
          message = "services.klbr.discord.tokenFile must be set when services.klbr.discord.enable is true: klbr-discord reads the bot token from that file.";
        }
        {
          assertion = cfg.discord.enable -> (cfg.package.hasDiscord or true);
          message = "services.klbr.discord.enable is true, but services.klbr.package has no klbr-discord.";
        }
        (settingsLib.storeAssertion {
          prefix = "services.klbr";
          inherit (cfg) settings;
          files."services.klbr.discord.tokenFile" = cfg.discord.tokenFile;
        })
      ];

      services.klbr.settings.discord = mkIf cfg.discord.enable {
        enabled = mkDefault true;
        token_file = mkIf (cfg.discord.tokenFile != null) (mkDefault cfg.discord.tokenFile);
      };

      home.packages = [ cfg.package ];
      # The CLI (klbr-core status, send, tail) finds the daemon through this.
      home.sessionVariables.KLBR_CONTROL_SOCKET = "\${XDG_RUNTIME_DIR}/klbr/control.sock";

      systemd.user.sockets = {
        klbr-core = {
          Unit = {
            Description = "klbr-core HTTP listener (loopback)";
            Wants = [
              "klbr-core-control.socket"
              "klbr-core-ingress.socket"
            ];
          };
          Socket = {
            ListenStream = cfg.httpAddress;
            FileDescriptorName = "http";
            Service = "klbr-core.service";
          };
          Install.WantedBy = [ "sockets.target" ];
        };
        klbr-core-control = {
          Unit.Description = "klbr-core operator socket";
          Socket = {
            ListenStream = "%t/klbr/control.sock";
            FileDescriptorName = "control";
            SocketMode = "0600";
            DirectoryMode = "0700";
            RemoveOnStop = true;
            Service = "klbr-core.service";
          };
          Install.WantedBy = [ "sockets.target" ];
        };
        # Mode 0600: klbr-discord runs as this user too.
        klbr-core-ingress = {
          Unit.Description = "klbr-core ingress socket";
          Socket = {
            ListenStream = "%t/klbr/ingress.sock";
            FileDescriptorName = "ingress";
            SocketMode = "0600";
            DirectoryMode = "0700";
            RemoveOnStop = true;
            Service = "klbr-core.service";
          };
          Install.WantedBy = [ "sockets.target" ];
        };
      };

      # klbr-core's workers: one transient scope each, with [limits] from
      # settings, under this slice of the user manager.
      systemd.user.slices.klbr = {
        Unit.Description = "klbr workers: workbenches, hook runners and tracked commands";
        Slice = {
          MemoryAccounting = true;
          TasksAccounting = true;
          CPUAccounting = true;
        };
      };

      # No Install: the first connection to one of its sockets starts it.
      systemd.user.services.klbr-core = {
        Unit = {
          Description = "klbr-core: klbr's state, sessions and operator API";
          Requires = [
            "klbr-core.socket"
            "klbr-core-control.socket"
            "klbr-core-ingress.socket"
          ];
          After = [
            "klbr-core.socket"
            "klbr-core-control.socket"
            "klbr-core-ingress.socket"
          ];
          # Home Manager restarts the service when klbr.toml changes.
          X-Restart-Triggers = [ "${configFile}" ];
        };
        Service = sandbox // namespaceSandbox // {
          Type = "notify";
          NotifyAccess = "main";
          Environment = [
            "KLBR_CONFIG=${configFile}"
            "KLBR_DATA_DIR=%S/klbr"
            "KLBR_WORKSPACE=%S/klbr/workspace"
            "KLBR_CONTROL_SOCKET=%t/klbr/control.sock"
            "KLBR_INGRESS_SOCKET=%t/klbr/ingress.sock"
            # The user manager, not the system's: scopes of this user's own.
            "KLBR_SYSTEMD_BUS=unix:path=%t/systemd/private"
            "PATH=${servicePath}"
          ];
          StateDirectory = "klbr klbr/workspace";
          StateDirectoryMode = "0700";
          ExecStartPre = "${cfg.package}/bin/klbr-core init";
          ExecStart = "${cfg.package}/bin/klbr-core serve";
          ExecReload = "${cfg.package}/bin/klbr-core reload";
          KillMode = "mixed";
          TimeoutStopSec = "30s";
          WatchdogSec = "30s";
          Restart = "on-failure";
          RestartSec = "1s";
          SystemCallFilter = [
            "@system-service"
            # klbr-kernel hides the data directory from workers with Landlock.
            "landlock_create_ruleset landlock_add_rule landlock_restrict_self"
          ];
        };
      };
    }

    (mkIf cfg.discord.enable {
      systemd.user.services.klbr-discord = {
        Unit = {
          Description = "klbr-discord: klbr's Discord transport";
          Requires = [ "klbr-core-ingress.socket" ];
          After = [ "klbr-core-ingress.socket" ];
          X-Restart-Triggers = [ "${configFile}" ];
        };
        Service = sandbox // namespaceSandbox // {
          Type = "simple";
          Environment = [
            "KLBR_CONFIG=${configFile}"
            "KLBR_DATA_DIR=%S/klbr"
            "KLBR_INGRESS_SOCKET=%t/klbr/ingress.sock"
          ];
          ExecStart = "${cfg.package}/bin/klbr-discord";
          # systemctl --user reload klbr-discord: SIGHUP rereads the
          # channel filter (channels, ingest, include_bots) from klbr.toml.
          ExecReload = "${pkgs.coreutils}/bin/kill -HUP $MAINPID";
          Restart = "on-failure";
          RestartSec = "5s";
          MemoryDenyWriteExecute = true;
          SystemCallFilter = [
            "@system-service"
            "~@privileged @resources"
          ];
        };
        Install.WantedBy = [ "default.target" ];
      };
    })
  ]);
}
