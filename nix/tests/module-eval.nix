# Evaluates nix/module.nix with nixpkgs' lib alone — no NixOS, no package
# set, no builder — and returns what a test can check: the options the module
# declares, its failed assertions, the rendered settings, and the NixOS
# configuration it produces (drop-ins, users, polkit, Grafana, Prometheus).
#
# The NixOS options the module sets are stubbed here as free-form values, so
# this checks the module's own options, types, defaults and assertions, not
# that NixOS accepts every value: the VM test (nix/test.nix) does that.
#
#   nix-instantiate --eval --strict --json -E '
#     import ./nix/tests/module-eval.nix {
#       lib = import /path/to/nixpkgs/lib;
#       config = { services.klbr.enable = true; };
#     }'
#
# nix/module_test.go runs it when KLBR_NIXPKGS_LIB names a nixpkgs lib.
{
  lib,
  config ? { },
}:

let
  # What the module uses of pkgs: formats.toml, git, and pkgs.klbr as the
  # package option's default.
  stubPkgs = import ./stub-pkgs.nix { inherit lib; };

  freeform = lib.mkOption {
    type = lib.types.anything;
    default = { };
  };

  nixosStubs = {
    options = {
      assertions = lib.mkOption {
        type = lib.types.listOf lib.types.unspecified;
        default = [ ];
      };
      warnings = lib.mkOption {
        type = lib.types.listOf lib.types.str;
        default = [ ];
      };
      environment = freeform;
      systemd = freeform;
      users = freeform;
      security = freeform;
      # enable is an option of its own, as in NixOS: the module's grafana
      # and prometheus defaults read it.
      services.grafana = {
        enable = lib.mkOption {
          type = lib.types.bool;
          default = false;
        };
        provision = freeform;
      };
      services.prometheus = {
        enable = lib.mkOption {
          type = lib.types.bool;
          default = false;
        };
        ruleFiles = lib.mkOption {
          type = lib.types.listOf lib.types.str;
          default = [ ];
        };
        scrapeConfigs = lib.mkOption {
          type = lib.types.listOf lib.types.anything;
          default = [ ];
        };
      };
    };
  };

  eval = lib.evalModules {
    modules = [
      nixosStubs
      ../module.nix
      { _module.args.pkgs = stubPkgs; }
      config
    ];
  };

  # The dotted names of the options under services.klbr.
  optionNames =
    prefix: opts:
    lib.concatLists (
      lib.mapAttrsToList (
        name: value:
        if lib.isOption value then
          [ (prefix + name) ]
        else if lib.isAttrs value then
          optionNames (prefix + name + ".") value
        else
          [ ]
      ) opts
    );

  c = eval.config;
in
{
  options = optionNames "services.klbr." eval.options.services.klbr;
  failedAssertions = map (a: a.message) (lib.filter (a: !a.assertion) c.assertions);
  inherit (c) warnings;
  settings = c.services.klbr.settings;
  inherit (c)
    environment
    systemd
    users
    security
    ;
  grafana = c.services.grafana;
  prometheus = c.services.prometheus;
}
