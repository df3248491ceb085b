# Evaluates nix/home.nix (the Home Manager module services.klbr) with
# nixpkgs' lib alone, as nix/tests/module-eval.nix does for the NixOS module:
# the options it declares, its failed assertions, the rendered settings, and
# the Home Manager configuration it produces (packages, session variables,
# systemd user units).
#
# Home Manager itself is not here: the few of its options the module sets
# (assertions, home.packages, home.sessionVariables, systemd.user) are
# stubbed as free-form values. Home Manager turns systemd.user.<kind>.<name>
# into ~/.config/systemd/user/<name>.<kind> with each attribute set a
# section; nix/home_test.go renders them the same way and has systemd read
# them.
#
# nix/module_test.go's helpers run it when KLBR_NIXPKGS_LIB names a nixpkgs lib.
{
  lib,
  config ? { },
}:

let
  freeform = lib.mkOption {
    type = lib.types.anything;
    default = { };
  };

  homeManagerStubs = {
    options = {
      assertions = lib.mkOption {
        type = lib.types.listOf lib.types.unspecified;
        default = [ ];
      };
      home.packages = lib.mkOption {
        type = lib.types.listOf lib.types.package;
        default = [ ];
      };
      home.sessionVariables = lib.mkOption {
        type = lib.types.attrsOf lib.types.str;
        default = { };
      };
      systemd.user = freeform;
    };
  };

  eval = lib.evalModules {
    modules = [
      homeManagerStubs
      ../home.nix
      { _module.args.pkgs = import ./stub-pkgs.nix { inherit lib; }; }
      config
    ];
  };

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
  settings = c.services.klbr.settings;
  packages = c.home.packages;
  sessionVariables = c.home.sessionVariables;
  systemdUser = c.systemd.user;
}
