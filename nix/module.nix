# The NixOS module services.klbr.
#
# The unit files are the package's (nix/systemd, installed into
# lib/systemd/system): this module enables them with systemd.packages and
# adds only what a NixOS host decides, as drop-ins — the user, the groups,
# the configuration file, credentials, and which units start at boot. This is
# the pattern of nixpkgs' tailscale module: one source of truth for the
# units, shared with non-Nix installs and with the systemd test harness.
{
  config,
  lib,
  pkgs,
  ...
}:

let
  inherit (lib)
    literalExpression
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

  # Where klbr-core-control.socket puts the operator socket (%t/klbr/control.sock).
  controlSocket = "/run/klbr/control.sock";

  credentialName = name: builtins.match "[A-Za-z0-9_.-]+" name != null;
in
{
  options.services.klbr = {
    enable = mkEnableOption "klbr, the persistent personal agent (klbr-core, started by its socket)";

    package = mkPackageOption pkgs "klbr" {
      extraDescription = ''
        The flake's `nixosModules.default` sets this to the flake's own
        package, built with the nixpkgs its flake.lock pins.
      '';
    };

    user = mkOption {
      type = types.str;
      default = "klbr";
      description = ''
        The user klbr-core runs as. The default user is created as a system
        user; any other must exist. Its workers run as this user too, in
        transient scopes it may create through the polkit rule this module
        installs (only units named `klbr-*.scope`).
      '';
    };

    group = mkOption {
      type = types.str;
      default = "klbr";
      description = "The primary group of the klbr-core service.";
    };

    ingressGroup = mkOption {
      type = types.str;
      default = "klbr-ingress";
      description = ''
        The group of klbr-core's ingress socket, /run/klbr/ingress.sock.
        klbr-discord runs in it, so it can admit inputs; so can any other
        transport you put in it. Ingress peers have source authority only:
        the operator socket, /run/klbr/control.sock, admits the service user
        and root.
      '';
    };

    # The settings type nix/home.nix has too.
    settings = settingsLib.mkOption { credentialDir = "/run/credentials/klbr-core.service"; };

    credentials = mkOption {
      type = types.attrsOf types.externalPath;
      default = { };
      example = {
        openai-key = "/run/secrets/openai-key";
      };
      description = ''
        Files handed to klbr-core as systemd credentials (LoadCredential=):
        name = path. Each is readable by the service as
        `/run/credentials/klbr-core.service/<name>`, for example as a route's
        `api_key_file`. The files stay where they are, outside the Nix store.
      '';
    };

    discord = {
      enable = mkEnableOption "klbr-discord, the Discord transport (klbr-discord.service)";

      tokenFile = mkOption {
        type = types.nullOr types.externalPath;
        default = null;
        example = "/run/secrets/klbr-discord-token";
        description = ''
          A file holding the Discord bot token, outside the Nix store. It
          reaches klbr-discord as the credential `discord-token`
          (LoadCredential=); the service never sees its path.
        '';
      };
    };

    grafana = {
      enable = mkOption {
        type = types.bool;
        default = config.services.grafana.enable or false;
        defaultText = literalExpression "config.services.grafana.enable";
        description = ''
          Whether to provision the klbr dashboard in this host's Grafana,
          through `services.grafana.provision.dashboards.settings.providers`;
          on by default where Grafana is enabled. The dashboard asks for a
          Prometheus data source that scrapes klbr-core's /metrics (see
          `services.klbr.prometheus.enable`).
        '';
      };
    };

    backup = {
      enable = mkEnableOption ''
        a timer that runs `klbr-core backup` as the service user into a new
        dated directory under `services.klbr.backup.directory`, keeping the
        newest `keep`
      '';
      directory = mkOption {
        type = types.str;
        default = "/var/backup/klbr";
        description = "Where the backups go, one directory per run (klbr-YYYYmmdd-HHMMSS).";
      };
      startAt = mkOption {
        type = types.str;
        default = "daily";
        description = "When the backup runs (a systemd calendar expression).";
      };
      keep = mkOption {
        type = types.ints.positive;
        default = 7;
        description = "How many backups to keep; older ones are removed after a backup succeeds.";
      };
      includeSecrets = mkOption {
        type = types.bool;
        default = false;
        description = "Whether the backups hold the operator token (`klbr-core backup --include-secrets`).";
      };
    };

    prometheus = {
      enable = mkOption {
        type = types.bool;
        default = config.services.prometheus.enable or false;
        defaultText = literalExpression "config.services.prometheus.enable";
        description = ''
          Whether to add a scrape job for klbr-core's /metrics to this host's
          Prometheus (`services.prometheus.scrapeConfigs`) and klbr's alert
          rules (`services.prometheus.ruleFiles`: klbr-core down, backlog
          age, a directed item unanswered, held reviews rising, unknown
          effects, storage paused, a session blocked, the WAL too large); on
          by default where Prometheus is enabled.
        '';
      };
      target = mkOption {
        type = types.str;
        default = "127.0.0.1:8765";
        description = "Where klbr-core's HTTP listener is (klbr-core.socket's ListenStream; loopback only).";
      };
    };
  };

  config = mkIf cfg.enable (mkMerge [
    {
      assertions = [
        {
          assertion = cfg.discord.enable -> cfg.discord.tokenFile != null;
          message = "services.klbr.discord.tokenFile must be set when services.klbr.discord.enable is true: klbr-discord reads the bot token from that file, as the credential discord-token.";
        }
        {
          assertion = cfg.discord.enable -> (cfg.package.hasDiscord or true);
          message = "services.klbr.discord.enable is true, but services.klbr.package has no klbr-discord.";
        }
        {
          assertion = lib.all credentialName (lib.attrNames cfg.credentials);
          message = "services.klbr.credentials: names may hold only letters, digits, '_', '.' and '-'.";
        }
        (settingsLib.storeAssertion {
          prefix = "services.klbr";
          inherit (cfg) settings;
          files = {
            "services.klbr.discord.tokenFile" = cfg.discord.tokenFile;
          }
          // lib.mapAttrs' (
            name: path: lib.nameValuePair "services.klbr.credentials.${name}" path
          ) cfg.credentials;
        })
        {
          assertion = !(cfg.credentials ? discord-token);
          message = "services.klbr.credentials: discord-token is klbr-discord's; set services.klbr.discord.tokenFile instead.";
        }
      ];

      services.klbr.settings.discord = mkIf cfg.discord.enable { enabled = mkDefault true; };

      # The dashboard and the alert rules, where the host runs Grafana and
      # Prometheus (the conditions sit on the leaves, so that the options'
      # defaults may read the host's services.grafana/prometheus.enable).
      services.grafana.provision = mkIf cfg.grafana.enable {
        enable = mkDefault true;
        dashboards.settings.providers = [
          {
            name = "klbr";
            type = "file";
            folder = "klbr";
            options.path = "${cfg.package}/share/klbr/grafana";
          }
        ];
      };
      services.prometheus.ruleFiles = mkIf cfg.prometheus.enable [
        "${cfg.package}/share/klbr/prometheus/klbr-rules.yml"
      ];
      services.prometheus.scrapeConfigs = mkIf cfg.prometheus.enable [
        {
          job_name = "klbr";
          static_configs = [ { targets = [ cfg.prometheus.target ]; } ];
        }
      ];

      environment.systemPackages = [ cfg.package ];
      # The CLI (`klbr-core status`, `send`, `tail`, `drain`) finds the daemon
      # through this; the socket admits the service user and root.
      environment.variables.KLBR_CONTROL_SOCKET = controlSocket;

      systemd.packages = [ cfg.package ];

      # The three listeners (HTTP, operator, ingress) start at boot; NixOS
      # does not read the units' [Install] sections, so wantedBy says it.
      systemd.sockets.klbr-core.wantedBy = [ "sockets.target" ];
      systemd.sockets.klbr-core-control = {
        wantedBy = [ "sockets.target" ];
        # The service user and root only.
        socketConfig = {
          SocketMode = "0600";
          SocketUser = cfg.user;
          SocketGroup = cfg.group;
        };
      };
      systemd.sockets.klbr-core-ingress = {
        wantedBy = [ "sockets.target" ];
        # klbr-discord reaches it through the group.
        socketConfig = {
          SocketMode = "0660";
          SocketUser = cfg.user;
          SocketGroup = cfg.ingressGroup;
        };
      };

      # No wantedBy: the first connection to one of its sockets starts it.
      systemd.services.klbr-core = {
        environment.KLBR_CONFIG = "${configFile}";
        # A child agent's workspace="worktree" runs git (worktree add); cells'
        # own git commands find it too.
        path = [ pkgs.git ];
        restartTriggers = [ configFile ];
        # A changed unit is restarted in one step while the socket keeps
        # its listeners, so connections made meanwhile wait, not fail.
        stopIfChanged = false;
        serviceConfig = {
          User = cfg.user;
          Group = cfg.group;
          # systemctl reload klbr-core rereads KLBR_CONFIG (klbr-core reload);
          # a changed `settings` is a new store file, so a switch restarts.
          ExecReload = [ "" "${cfg.package}/bin/klbr-core reload" ];
          LoadCredential = mkIf (cfg.credentials != { }) (
            lib.mapAttrsToList (name: path: "${name}:${path}") cfg.credentials
          );
        };
      };

      users.users = mkIf (cfg.user == "klbr") {
        klbr = {
          isSystemUser = true;
          group = cfg.group;
          home = "/var/lib/klbr";
          description = "klbr agent";
        };
      };
      users.groups = mkMerge [
        (mkIf (cfg.group == "klbr") { klbr = { }; })
        { ${cfg.ingressGroup} = { }; }
      ];

      # Worker placement: klbr-core creates klbr-<role>-<session>-<gen>.scope
      # units under klbr.slice over the system bus. This lets the service
      # user manage those units and nothing else.
      security.polkit.enable = true;
      security.polkit.extraConfig = ''
        // services.klbr: klbr-core may manage its own worker scopes only.
        polkit.addRule(function (action, subject) {
          if (action.id == "org.freedesktop.systemd1.manage-units" &&
              subject.user == ${builtins.toJSON cfg.user}) {
            var unit = action.lookup("unit");
            if (typeof unit == "string" && /^klbr-[^\/]+\.scope$/.test(unit)) {
              return polkit.Result.YES;
            }
          }
        });
      '';
    }

    (mkIf cfg.discord.enable {
      systemd.services.klbr-discord = {
        wantedBy = [ "multi-user.target" ];
        environment.KLBR_CONFIG = "${configFile}";
        restartTriggers = [ configFile ];
        serviceConfig = {
          DynamicUser = true;
          SupplementaryGroups = [ cfg.ingressGroup ];
          # systemctl reload klbr-discord: SIGHUP rereads the channel
          # filter; NixOS has no /bin/kill, the shipped unit's.
          ExecReload = [
            ""
            "${pkgs.coreutils}/bin/kill -HUP $MAINPID"
          ];
          # Replace the shipped /etc/klbr/discord-token with the option's file.
          LoadCredential = [
            ""
          ]
          ++ lib.optional (cfg.discord.tokenFile != null) "discord-token:${cfg.discord.tokenFile}";
        };
      };
    })

    (mkIf cfg.backup.enable {
      systemd.tmpfiles.rules = [ "d ${cfg.backup.directory} 0700 ${cfg.user} ${cfg.group} -" ];
      systemd.services.klbr-backup = {
        description = "klbr backup (klbr-core backup)";
        startAt = cfg.backup.startAt;
        environment.KLBR_CONFIG = "${configFile}";
        environment.KLBR_DATA_DIR = "/var/lib/klbr";
        path = [ cfg.package ];
        # klbr-core serves meanwhile: the backup reads one consistent
        # snapshot and never blocks its writer.
        script = ''
          set -eu
          dest=${lib.escapeShellArg cfg.backup.directory}/klbr-$(date -u +%Y%m%d-%H%M%S)
          klbr-core backup ${lib.optionalString cfg.backup.includeSecrets "--include-secrets "}"$dest"
          klbr-core check >/dev/null || echo "klbr-core check reports findings: run it by hand" >&2
          ls -1d ${lib.escapeShellArg cfg.backup.directory}/klbr-* | sort | head -n -${toString cfg.backup.keep} | xargs -r rm -rf --
        '';
        serviceConfig = {
          Type = "oneshot";
          User = cfg.user;
          Group = cfg.group;
          UMask = "0077";
        };
      };
    })

  ]);
}
