# Evaluates nix/worker.nix (services.klbr-worker) with nixpkgs' lib alone, as
# nix/tests/module-eval.nix does for nix/module.nix: the options it declares,
# its failed assertions, and the NixOS configuration it produces (users,
# security, systemd packages and user slices, sshd). The NixOS options it sets are stubbed as
# free-form values.
#
# nix/module_test.go runs it when KLBR_NIXPKGS_LIB names a nixpkgs lib.
{
  lib,
  config ? { },
}:

let
  stubPkgs.klbr = {
    type = "derivation";
    name = "klbr";
    outPath = "/nix/store/11111111111111111111111111111111-klbr";
  };

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
      environment = freeform;
      systemd = freeform;
      users = freeform;
      security = freeform;
      services.openssh = freeform;
    };
  };

  eval = lib.evalModules {
    modules = [
      nixosStubs
      ../worker.nix
      { _module.args.pkgs = stubPkgs; }
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
  options = optionNames "services.klbr-worker." eval.options.services.klbr-worker;
  failedAssertions = map (a: a.message) (lib.filter (a: !a.assertion) c.assertions);
  inherit (c)
    environment
    systemd
    users
    security
    ;
  openssh = c.services.openssh;
}
