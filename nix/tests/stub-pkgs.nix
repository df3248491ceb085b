# The little of nixpkgs' package set that nix/module.nix and nix/home.nix
# use, stubbed for evaluation with nixpkgs' lib alone: formats.toml (its
# type, and a store path for the file it would write), the tools on
# klbr-core's PATH, and pkgs.klbr as the package option's default.
{ lib }:

let
  tomlValue =
    with lib.types;
    nullOr (oneOf [
      bool
      int
      float
      str
      path
      (attrsOf tomlValue)
      (listOf tomlValue)
    ])
    // {
      description = "TOML value";
    };
  tool = n: name: {
    type = "derivation";
    inherit name;
    outPath = "/nix/store/${lib.fixedWidthString 32 n ""}-${name}";
  };
in
{
  formats.toml =
    { }:
    {
      type = tomlValue;
      generate = name: value: "/nix/store/00000000000000000000000000000000-${name}";
    };
  git = tool "2" "git";
  coreutils = tool "3" "coreutils";
  findutils = tool "4" "findutils";
  gnugrep = tool "5" "gnugrep";
  gnused = tool "6" "gnused";
  klbr = tool "1" "klbr" // {
    hasDiscord = true;
  };
}
