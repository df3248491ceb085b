# klbr.toml as a module option: the one settings type services.klbr has in
# the NixOS module (nix/module.nix) and in the Home Manager module
# (nix/home.nix), and the check both make that no secret in it lies in the
# Nix store.
#
#   settingsLib = import ./settings.nix { inherit lib pkgs; };
#   settings = settingsLib.mkOption { credentialDir = "/run/credentials/klbr-core.service"; };
{ lib, pkgs }:

let
  inherit (lib) mkOption types literalExpression;

  format = pkgs.formats.toml { };

  # The keys of klbr.toml that name a file holding a secret: a route's API
  # key, the Discord bot token, a worker host's SSH private key.
  secretKeys = [
    "api_key_file"
    "token_file"
    "identity_file"
  ];

  # A Nix path literal (./key) is copied into the store when klbr.toml is
  # written; a string under the store directory is there already.
  inStore =
    value:
    builtins.isPath value
    || (builtins.isString value && lib.hasPrefix "${builtins.storeDir}/" value);

  # The dotted names (under prefix) of the secret keys in settings whose
  # value lies in the Nix store, where every local user can read it.
  secretsInStore =
    prefix: settings:
    let
      walk =
        path: value:
        if lib.isDerivation value then
          [ ]
        else if builtins.isAttrs value then
          lib.concatLists (
            lib.mapAttrsToList (
              name: v:
              if builtins.elem name secretKeys && inStore v then
                [ "${path}.${name}" ]
              else
                walk "${path}.${name}" v
            ) value
          )
        else if builtins.isList value then
          lib.concatLists (lib.imap0 (i: walk "${path}.${toString i}") value)
        else
          [ ];
    in
    walk prefix settings;
in
{
  inherit
    format
    secretKeys
    inStore
    secretsInStore
    ;

  # The settings option. credentialDir is where the service finds its
  # credentials (LoadCredential=), for the example.
  mkOption =
    { credentialDir }:
    mkOption {
      description = ''
        klbr.toml (model routes, Discord, worker limits), written to the Nix
        store and named by `KLBR_CONFIG`; see docs/operating.md. klbr-core
        refuses keys it does not know. Secrets never go here, and no secret
        file may lie in the Nix store (an assertion refuses
        ${lib.concatStringsSep ", " secretKeys} there): name an environment
        variable (`api_key_env`) or a file (`api_key_file`, e.g. a credential
        from `services.klbr.credentials`).
      '';
      default = { };
      example = literalExpression ''
        {
          agent.route = "main";
          routes.main = {
            url = "http://localhost:8001/v1";
            model = "local";
            api_key_file = "${credentialDir}/openai-key";
          };
          limits = { memory_max = "4G"; tasks_max = 512; cpu_quota = "200%"; };
          # Traces of every attempt to Grafana Tempo's OTLP/HTTP port
          # (docs/operating.md, "Traces"); left out, nothing is traced.
          telemetry.otlp_endpoint = "http://127.0.0.1:4318";
        }
      '';
      type = types.submodule {
        freeformType = format.type;
        options.limits = {
          memory_max = mkOption {
            type = types.strMatching "[0-9]+[KMGT]?";
            default = "2G";
            description = "MemoryMax= of each worker scope (base 1024 suffixes K, M, G, T).";
          };
          tasks_max = mkOption {
            type = types.ints.between 1 100000;
            default = 256;
            description = "TasksMax= of each worker scope.";
          };
          cpu_quota = mkOption {
            type = types.strMatching "[0-9]+%";
            default = "200%";
            description = "CPUQuota= of each worker scope (100% is one CPU).";
          };
        };
      };
    };

  # The assertion both modules make: no secret file in the Nix store,
  # neither in settings nor in the modules' own path options (files: their
  # option names = values; null where unset).
  storeAssertion =
    {
      prefix,
      settings,
      files,
    }:
    let
      fromFiles = lib.attrNames (lib.filterAttrs (_: v: v != null && inStore v) files);
      bad = fromFiles ++ secretsInStore "${prefix}.settings" settings;
    in
    {
      assertion = bad == [ ];
      message = "${lib.concatStringsSep ", " bad}: a secret file in the Nix store (${builtins.storeDir}), where every local user can read it. Keep it outside the store (e.g. /run/secrets, sops-nix or agenix) and name that path as a string, not a Nix path (./file is copied into the store).";
    };
}
